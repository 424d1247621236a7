"""Compiled unwind tables on disk: ~/.cache/gfxbpf/unwind (or
$XDG_CACHE_HOME/gfxbpf/unwind), one flat binary file per table."""

from __future__ import annotations

import os

from gfxbpf.client.profile.unwind.table import FileTable

__all__ = ["cache_key", "default_cache_dir", "load", "store"]


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gfxbpf", "unwind")


def cache_key(build_id: str | None, identity: str) -> str:
    return f"{build_id or 'noid'}-{identity}"


def load(cache_dir: str, key: str) -> FileTable | None:
    return None  # the format lands with the parser


def store(cache_dir: str, key: str, table: FileTable) -> None:
    return None
