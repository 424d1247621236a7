"""Reading and validating the policy file (e.g. /etc/gfxbpf/policy.toml).

    [[program]]
    name = "syscount"                 # catalog name
    sha256 = "..."                    # the reviewed object (64 hex digits)
    users = ["alice", 1001]           # names or uids; "*" = everyone
    groups = ["video", "render"]      # names or gids; "*" = everyone
    scope = "self"                    # "self", "system", "job", or a list (default "self")
    libraries = ["/usr/lib/x86_64-linux-gnu/libvulkan.so.1*"]  # uprobe targets (globs)
    functions = ["vk*"]               # uprobe symbols (globs; default: any)
    max_frequency = 999               # perf_event sampling cap in Hz (default: none)
    allow_no_btf = false              # load even if the kernel refuses the object's BTF
    max_stack_bytes = 4096            # stack copies: user stack bytes a sample, unless the
                                      # client asks for less (unset: 8192; up to 24576)
    min_block_us = 1000               # offcpu: the shortest wait a client may ask for (default 100)
    max_python_frames = 32            # Python frames a stack (default 64, at most 128)
    description = "..."               # free text, shown by ListPrograms

    [limits]                          # per-user limits; every key optional
    sessions_per_user = 8
    attachments_per_user = 16

    [[tls_client]]                    # gRPC mTLS: client certificate -> user
    subject_cn = "ci-runner"          # and/or cert_sha256 = "<64 hex>"
    user = "alice"                    # name or uid

Validation (gfxbpf.tomlcheck.checks) collects every problem before it
refuses the file, each naming the file, the entry and the field. The result
is gfxbpf.broker.policy.rules's data classes; Policy.load/parse/from_dict
are the entry points and call in here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from gfxbpf.bpf.consts import SCOPES, SELF, Scope
from gfxbpf.broker.policy.model import (
    LIMIT_KEYS,
    MAX_FREQUENCY,
    MAX_MIN_BLOCK_US,
    MAX_PYTHON_FRAMES,
    WILDCARD,
    Limits,
    PolicyError,
    ProgramEntry,
    TlsClient,
)
from gfxbpf.catalog.stack_copies import most_stack_bytes
from gfxbpf.tomlcheck import checks
from gfxbpf.tomlcheck.checks import Entry, Problems, is_integer, show, shown, toml_type

_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_PROGRAM_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# POSIX-ish account names (Debian's adduser is laxer; this covers real use).
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel, never a real id

_PROGRAM_KEYS = (
    "name",
    "sha256",
    "users",
    "groups",
    "scope",
    "libraries",
    "functions",
    "description",
    "max_frequency",
    "allow_no_btf",
    "max_stack_bytes",
    "min_block_us",
    "max_python_frames",
)
_TLS_KEYS = ("subject_cn", "cert_sha256", "user")
_TOP_KEYS = ("program", "limits", "tls_client")


class PolicyTables(NamedTuple):
    """A validated policy file's content, in file order."""

    programs: list[ProgramEntry]
    limits: Limits
    tls_clients: list[TlsClient]


def read_text(path: str | os.PathLike[str]) -> str:
    """The file's text; PolicyError if it cannot be read or is not UTF-8."""
    return checks.read_text(path, PolicyError, "policy")


def parse_toml(text: str, path: str) -> dict[str, Any]:
    return checks.parse_toml(text, path, PolicyError)


def parse_tables(data: Mapping[str, Any], path: str) -> PolicyTables:
    """Validate decoded TOML; PolicyError lists every problem found."""
    problems = Problems(path)
    top = problems.entry("top level")
    for key in data:
        if key not in _TOP_KEYS:
            hint = " (did you mean [[program]]?)" if key == "programs" else ""
            top.add(key, f"unknown key{hint} (known: {', '.join(_TOP_KEYS)})")
    table = dict(data)
    programs = [
        entry
        for i, t in top.tables(table, "program", "program")
        if (entry := _parse_program(i, t, path, problems)) is not None
    ]
    limits = _parse_limits(top.table(table, "limits"), problems)
    tls = [
        client
        for i, t in top.tables(table, "tls_client", "tls_client")
        if (client := _parse_tls_client(i, t, problems)) is not None
    ]
    problems.raise_if_any(PolicyError)
    return PolicyTables(programs, limits, tls)


def _check_accounts(value: Any, kind: str, fld: str, at: Entry) -> tuple[str | int, ...]:
    id_word = "uid" if kind == "user" else "gid"
    if not isinstance(value, list):
        at.add(
            fld,
            f"expected an array of {kind} names or {id_word}s (e.g. {fld} = "
            f'["alice", 1001]), got {shown(value)}',
        )
        return ()
    out: list[str | int] = []
    for item in value:
        problem = _account_problem(item, kind, id_word)
        if problem:
            at.add(fld, problem)
        else:
            out.append(item)
    return tuple(out)


def _account_problem(item: Any, kind: str, id_word: str) -> str | None:
    """What is wrong with one item of users/groups, or None."""
    if is_integer(item):
        return None if 0 <= item <= _MAX_ID else f"{id_word} {item} is out of range 0..{_MAX_ID}"
    if not isinstance(item, str):
        return f"each item must be a {kind} name (string) or {id_word} (integer), got {shown(item)}"
    if item == WILDCARD:
        return None
    if item.isdigit():
        return f"write {id_word}s as integers: {item} rather than {show(item)}"
    if len(item) <= 256 and _ACCOUNT_RE.match(item):
        return None
    return f"{show(item)} is not a valid {kind} name"


def _parse_program(
    index: int, table: dict[str, Any], path: str, problems: Problems
) -> ProgramEntry | None:
    name = table.get("name")
    where = f"[[program]] #{index}"
    if isinstance(name, str) and name:
        where += f" {json.dumps(name)}"
    at = problems.entry(where)
    # The checks run in field order so that the problems read in that order.
    at.unknown_keys(table, _PROGRAM_KEYS)
    _check_name_and_sha(table, at)
    users = _check_accounts(table.get("users", []), "user", "users", at)
    groups = _check_accounts(table.get("groups", []), "group", "groups", at)
    scopes = _parse_scope(table, at)
    libraries = _parse_libraries(table, at)
    functions: tuple[str, ...] | None = (WILDCARD,)
    if "functions" in table:
        functions = at.strings(table, "functions")
    max_frequency = at.integer(table, "max_frequency", 1, MAX_FREQUENCY, "samples per second")
    allow_no_btf = at.boolean(table, "allow_no_btf", False)
    most = most_stack_bytes(name if isinstance(name, str) else "")
    max_stack_bytes = at.integer(
        table, "max_stack_bytes", 0, most, "bytes of user stack per stack copy"
    )
    max_python_frames = at.integer(
        table, "max_python_frames", 1, MAX_PYTHON_FRAMES, "Python frames per stack"
    )
    min_block_us = at.integer(
        table, "min_block_us", 1, MAX_MIN_BLOCK_US, "the shortest wait recorded in microseconds"
    )
    description = table.get("description", "")
    if not isinstance(description, str):
        at.add("description", f"expected a string, got {toml_type(description)}")
    if not at.ok:
        return None
    sha = table["sha256"]
    assert isinstance(name, str) and isinstance(sha, str)  # checked above
    return ProgramEntry(
        index=index,
        name=name,
        sha256=sha.lower(),
        users=users,
        groups=groups,
        scopes=scopes,
        libraries=libraries,
        functions=functions or (),
        description=description,
        source=path,
        max_frequency=max_frequency,
        allow_no_btf=bool(allow_no_btf),
        max_stack_bytes=max_stack_bytes,
        min_block_us=min_block_us,
        max_python_frames=max_python_frames,
    )


def _check_name_and_sha(table: dict[str, Any], at: Entry) -> None:
    at.present(table, "name", True, "the catalog program's name")
    at.matching(table, "name", _PROGRAM_NAME_RE, "a program name (letters, digits, _ . -)")
    at.present(table, "sha256", True, "`gfxbpf-admin approve NAME` prints the entry with its hash")
    at.matching(table, "sha256", _SHA256_RE, "64 hex digits")


def _parse_scope(table: dict[str, Any], at: Entry) -> tuple[Scope, ...]:
    if "scope" not in table:
        return (SELF,)
    raw = table["scope"]
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(s, str) for s in items):
        at.add("scope", f'expected "self", "system", "job" or an array of them, got {shown(raw)}')
        return (SELF,)
    bad = [s for s in items if s not in SCOPES]
    if bad:
        at.add("scope", f'unknown scope {show(bad[0])} (expected "self", "system" or "job")')
        return (SELF,)
    return tuple(dict.fromkeys(items))  # each one of SCOPES (checked above)


def _parse_libraries(table: dict[str, Any], at: Entry) -> tuple[str, ...]:
    libs = at.strings(table, "libraries") or ()
    for lib in libs:
        if not lib.startswith("/"):
            at.add("libraries", f"{show(lib)} is not an absolute path")
        elif ".." in lib.split("/"):
            at.add("libraries", f"{show(lib)} contains a '..' component")
    return libs


def _parse_limits(table: dict[str, Any] | None, problems: Problems) -> Limits:
    if table is None:
        return Limits()
    at = problems.entry("[limits]")
    at.unknown_keys(table, LIMIT_KEYS)
    values: dict[str, int] = {}
    for key, value in table.items():
        if key not in LIMIT_KEYS:
            continue
        if not is_integer(value) or value <= 0:
            at.add(key, f"expected a positive integer, got {shown(value)}")
        elif value > 2**31 - 1:
            at.add(key, f"{value} is too large (at most {2**31 - 1})")
        else:
            values[key] = value
    return Limits(**values)


def _parse_tls_client(index: int, table: dict[str, Any], problems: Problems) -> TlsClient | None:
    at = problems.entry(f"[[tls_client]] #{index}")
    at.unknown_keys(table, _TLS_KEYS)
    cn = table.get("subject_cn")
    if cn is not None and (not isinstance(cn, str) or not cn):
        at.add("subject_cn", f"expected a non-empty string, got {toml_type(cn)}")
    fp = table.get("cert_sha256")
    if fp is not None and (not isinstance(fp, str) or not _SHA256_RE.match(fp.replace(":", ""))):
        at.add("cert_sha256", f"expected 64 hex digits, got {show(fp)}")
    if cn is None and fp is None:
        at.add(None, "needs subject_cn or cert_sha256 to identify the certificate")
    user = _tls_user(table, at)
    if not at.ok or user is None:
        return None
    return TlsClient(
        index=index,
        user=user,
        subject_cn=cn,
        cert_sha256=fp.replace(":", "").lower() if isinstance(fp, str) else None,
    )


def _tls_user(table: dict[str, Any], at: Entry) -> str | int | None:
    if not at.present(table, "user", True, "the user name or uid the certificate acts as"):
        return None
    got = _check_accounts([table["user"]], "user", "user", at)
    if got and got[0] == WILDCARD:
        at.add("user", '"*" is not a user; name one user or uid')
        return None
    return got[0] if got else None
