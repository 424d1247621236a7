"""Paths and the policy's `libraries` globs, compared component by component.

A glob's "*" never crosses a "/", and a glob's leading directories without
glob characters are resolved like the path they are compared with, so a
pattern written through a symlinked directory (/lib -> /usr/lib) still
matches the real path of the file the broker opened. Policy.library_allowed
and Policy.library_named are built on these.
"""

from __future__ import annotations

import fnmatch
import os
import re

_GLOB_CHARS = re.compile(r"[*?\[]")


def split_path(path: str) -> list[str]:
    return [c for c in path.split("/") if c]


def resolve_pattern(pattern: str) -> str:
    """Resolve the glob-free leading directories of pattern (e.g. /lib -> /usr/lib).

    Targets are compared by their real path, so a pattern written through a
    symlinked directory (or naming a symlink itself) must be resolved too.
    """
    parts = split_path(pattern)
    fixed = 0
    while fixed < len(parts) and not _GLOB_CHARS.search(parts[fixed]):
        fixed += 1
    if fixed == 0:
        return pattern
    head = os.path.realpath("/" + "/".join(parts[:fixed]))
    rest = parts[fixed:]
    return head.rstrip("/") + ("/" + "/".join(rest) if rest else "") or "/"


def is_plain_path(path: str) -> bool:
    """Absolute, no NUL, no "." or ".." component: its text names one place."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        return False
    return not any(c in (".", "..") for c in split_path(path))


def path_matches(pattern: str, path: str) -> bool:
    # Component by component, so "*" never crosses a "/".
    pat, got = split_path(pattern), split_path(path)
    return len(pat) == len(got) and all(
        fnmatch.fnmatchcase(g, p) for p, g in zip(pat, got, strict=True)
    )
