"""Reading and validating the policy file (e.g. /etc/gfxbpf/policy.toml).

    [[program]]
    name = "syscount"                 # catalog name
    sha256 = "..."                    # the reviewed object (64 hex digits)
    users = ["alice", 1001]           # names or uids; "*" = everyone
    groups = ["video", "render"]      # names or gids; "*" = everyone
    scope = "self"                    # "self", "system", or a list of both (default "self")
    libraries = ["/usr/lib/x86_64-linux-gnu/libvulkan.so.1*"]  # uprobe targets (globs)
    functions = ["vk*"]               # uprobe symbols (globs; default: any)
    max_frequency = 999               # perf_event sampling cap in Hz (default: none)
    allow_no_btf = false              # load even if the kernel refuses the object's BTF
    max_stack_bytes = 4096            # stack copies: user stack bytes a sample (default 8192)
    min_block_us = 1000               # offcpu: the shortest wait a client may ask for (default 100)
    max_python_frames = 32            # Python frames a stack (default 64, at most 128)
    description = "..."               # free text, shown by ListPrograms

    [limits]                          # per-user limits; every key optional
    sessions_per_user = 8
    attachments_per_user = 16

    [[tls_client]]                    # gRPC mTLS: client certificate -> user
    subject_cn = "ci-runner"          # and/or cert_sha256 = "<64 hex>"
    user = "alice"                    # name or uid

Validation collects every problem before it refuses the file, each naming
the file, the entry and the field. The result is gfxbpf.broker.policy.rules's data
classes; Policy.load/parse/from_dict are the entry points and call in here.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any, NamedTuple

from gfxbpf.bpf.consts import SCOPES, SELF, Scope
from gfxbpf.broker.policy.model import (
    LIMIT_KEYS,
    MAX_FREQUENCY,
    MAX_MIN_BLOCK_US,
    MAX_PYTHON_FRAMES,
    MAX_STACK_BYTES,
    WILDCARD,
    Limits,
    PolicyError,
    ProgramEntry,
    TlsClient,
    show,
)

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
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PolicyError(p, [f"{p}: cannot read the policy: {e.strerror or e}"]) from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(p, [f"{p}: not UTF-8 text (byte {e.start})"]) from e


def parse_toml(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(path, [f"{path}: TOML syntax error: {e}"]) from e


def parse_tables(data: Mapping[str, Any], path: str) -> PolicyTables:
    """Validate decoded TOML; PolicyError lists every problem found."""
    errs = _Collector(path)
    for key in data:
        if key not in _TOP_KEYS:
            hint = " (did you mean [[program]]?)" if key == "programs" else ""
            errs.add("top level", key, f"unknown key{hint} (known: {', '.join(_TOP_KEYS)})")

    programs: list[ProgramEntry] = []
    raw_programs = data.get("program", [])
    if not isinstance(raw_programs, list):
        errs.add("top level", "program", "write programs as [[program]] tables")
        raw_programs = []
    for i, table in enumerate(raw_programs, start=1):
        entry = _parse_program(i, table, path, errs)
        if entry is not None:
            programs.append(entry)

    limits = _parse_limits(data["limits"], errs) if "limits" in data else Limits()

    tls: list[TlsClient] = []
    raw_tls = data.get("tls_client", [])
    if not isinstance(raw_tls, list):
        errs.add("top level", "tls_client", "write certificates as [[tls_client]] tables")
        raw_tls = []
    for i, table in enumerate(raw_tls, start=1):
        client = _parse_tls_client(i, table, errs)
        if client is not None:
            tls.append(client)

    if errs.problems:
        raise PolicyError(path, errs.problems)
    return PolicyTables(programs, limits, tls)


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return "date/time"
    return type(value).__name__


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Collector:
    """Collects validation problems, each naming file, entry and field."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[str] = []

    def add(self, where: str, fld: str | None, message: str) -> None:
        loc = f"{self.path}: {where}"
        if fld is not None:
            loc += f": field {fld!r}"
        self.problems.append(f"{loc}: {message}")


def _check_accounts(
    value: Any, kind: str, where: str, fld: str, errs: _Collector
) -> tuple[str | int, ...]:
    id_word = "uid" if kind == "user" else "gid"
    if not isinstance(value, list):
        errs.add(
            where,
            fld,
            f"expected an array of {kind} names or {id_word}s (e.g. {fld} = "
            f'["alice", 1001]), got {_toml_type(value)} {show(value)}',
        )
        return ()
    out: list[str | int] = []
    for item in value:
        if _is_id(item):
            if 0 <= item <= _MAX_ID:
                out.append(item)
            else:
                errs.add(where, fld, f"{id_word} {item} is out of range 0..{_MAX_ID}")
        elif isinstance(item, str):
            if item == WILDCARD:
                out.append(item)
            elif item.isdigit():
                errs.add(
                    where, fld, f"write {id_word}s as integers: {item} rather than {show(item)}"
                )
            elif len(item) <= 256 and _ACCOUNT_RE.match(item):
                out.append(item)
            else:
                errs.add(where, fld, f"{show(item)} is not a valid {kind} name")
        else:
            errs.add(
                where,
                fld,
                f"each item must be a {kind} name (string) or {id_word} (integer), "
                f"got {_toml_type(item)} {show(item)}",
            )
    return tuple(out)


def _check_str_list(value: Any, where: str, fld: str, errs: _Collector) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        errs.add(
            where,
            fld,
            f"expected an array of non-empty strings, got {_toml_type(value)} {show(value)}",
        )
        return None
    return tuple(value)


def _parse_program(index: int, table: Any, path: str, errs: _Collector) -> ProgramEntry | None:
    where = f"[[program]] #{index}"
    if not isinstance(table, dict):
        errs.add(where, None, f"expected a table, got {_toml_type(table)}")
        return None
    name = table.get("name")
    if isinstance(name, str) and name:
        where = f"[[program]] #{index} {json.dumps(name)}"
    start = len(errs.problems)

    # The checks run in field order so that the problems read in that order.
    for key in table:
        if key not in _PROGRAM_KEYS:
            errs.add(where, key, f"unknown key (known: {', '.join(_PROGRAM_KEYS)})")
    _check_name_and_sha(table, where, errs)
    users = _check_accounts(table.get("users", []), "user", where, "users", errs)
    groups = _check_accounts(table.get("groups", []), "group", where, "groups", errs)
    scopes = _parse_scope(table, where, errs)
    libraries = _parse_libraries(table, where, errs)
    functions: tuple[str, ...] = (WILDCARD,)
    if "functions" in table:
        funcs = _check_str_list(table["functions"], where, "functions", errs)
        functions = funcs if funcs is not None else ()
    max_frequency = _parse_max_frequency(table, where, errs)
    allow_no_btf = table.get("allow_no_btf", False)
    if not isinstance(allow_no_btf, bool):
        errs.add(where, "allow_no_btf", f"expected true or false, got {_toml_type(allow_no_btf)}")
        allow_no_btf = False
    max_stack_bytes = _parse_max_stack_bytes(table, where, errs)
    min_block_us = _parse_min_block_us(table, where, errs)
    max_python_frames = _parse_max_python_frames(table, where, errs)
    description = table.get("description", "")
    if not isinstance(description, str):
        errs.add(where, "description", f"expected a string, got {_toml_type(description)}")
        description = ""

    if len(errs.problems) > start:
        return None
    sha = table.get("sha256")
    assert isinstance(name, str) and isinstance(sha, str)
    return ProgramEntry(
        index=index,
        name=name,
        sha256=sha.lower(),
        users=users,
        groups=groups,
        scopes=scopes,
        libraries=libraries,
        functions=functions,
        description=description,
        source=path,
        max_frequency=max_frequency,
        allow_no_btf=allow_no_btf,
        max_stack_bytes=max_stack_bytes,
        min_block_us=min_block_us,
        max_python_frames=max_python_frames,
    )


def _check_name_and_sha(table: dict[str, Any], where: str, errs: _Collector) -> None:
    name = table.get("name")
    if "name" not in table:
        errs.add(where, "name", "missing (the catalog program's name)")
    elif not isinstance(name, str) or not _PROGRAM_NAME_RE.match(name):
        errs.add(
            where,
            "name",
            f"expected a program name (letters, digits, _ . -), got {_toml_type(name)} "
            f"{show(name)}",
        )

    sha = table.get("sha256")
    if "sha256" not in table:
        errs.add(
            where, "sha256", "missing (`gfxbpf-admin approve NAME` prints the entry with its hash)"
        )
    elif not isinstance(sha, str) or not _SHA256_RE.match(sha):
        errs.add(where, "sha256", f"expected 64 hex digits, got {_toml_type(sha)} {show(sha)}")


def _parse_scope(table: dict[str, Any], where: str, errs: _Collector) -> tuple[Scope, ...]:
    if "scope" not in table:
        return (SELF,)
    raw = table["scope"]
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(s, str) for s in items):
        errs.add(
            where,
            "scope",
            f'expected "self", "system" or an array of them, got {_toml_type(raw)} {show(raw)}',
        )
        return (SELF,)
    bad = [s for s in items if s not in SCOPES]
    if bad:
        errs.add(where, "scope", f'unknown scope {show(bad[0])} (expected "self" or "system")')
        return (SELF,)
    return tuple(dict.fromkeys(items))  # each one of SCOPES (checked above)


def _parse_max_frequency(table: dict[str, Any], where: str, errs: _Collector) -> int | None:
    if "max_frequency" not in table:
        return None
    value = table["max_frequency"]
    if not _is_id(value) or not 0 < value <= MAX_FREQUENCY:
        errs.add(
            where,
            "max_frequency",
            f"expected samples per second, 1 to {MAX_FREQUENCY}, got {_toml_type(value)} "
            f"{show(value)}",
        )
        return None
    return int(value)


def _parse_max_stack_bytes(table: dict[str, Any], where: str, errs: _Collector) -> int | None:
    if "max_stack_bytes" not in table:
        return None
    value = table["max_stack_bytes"]
    if not _is_id(value) or not 0 <= value <= MAX_STACK_BYTES:
        errs.add(
            where,
            "max_stack_bytes",
            f"expected bytes of user stack per stack copy, 0 to {MAX_STACK_BYTES}, got "
            f"{_toml_type(value)} {show(value)}",
        )
        return None
    return int(value)


def _parse_min_block_us(table: dict[str, Any], where: str, errs: _Collector) -> int | None:
    if "min_block_us" not in table:
        return None
    value = table["min_block_us"]
    if not _is_id(value) or not 1 <= value <= MAX_MIN_BLOCK_US:
        errs.add(
            where,
            "min_block_us",
            f"expected the shortest wait recorded in microseconds, 1 to {MAX_MIN_BLOCK_US}, "
            f"got {_toml_type(value)} {show(value)}",
        )
        return None
    return int(value)


def _parse_max_python_frames(table: dict[str, Any], where: str, errs: _Collector) -> int | None:
    if "max_python_frames" not in table:
        return None
    value = table["max_python_frames"]
    if not _is_id(value) or not 1 <= value <= MAX_PYTHON_FRAMES:
        errs.add(
            where,
            "max_python_frames",
            f"expected Python frames per stack, 1 to {MAX_PYTHON_FRAMES}, got "
            f"{_toml_type(value)} {show(value)}",
        )
        return None
    return int(value)


def _parse_libraries(table: dict[str, Any], where: str, errs: _Collector) -> tuple[str, ...]:
    if "libraries" not in table:
        return ()
    libs = _check_str_list(table["libraries"], where, "libraries", errs)
    for lib in libs or ():
        if not lib.startswith("/"):
            errs.add(where, "libraries", f"{show(lib)} is not an absolute path")
        elif ".." in lib.split("/"):
            errs.add(where, "libraries", f"{show(lib)} contains a '..' component")
    return libs or ()


def _parse_limits(table: Any, errs: _Collector) -> Limits:
    where = "[limits]"
    if not isinstance(table, dict):
        errs.add(where, None, f"expected a table, got {_toml_type(table)}")
        return Limits()
    values: dict[str, int] = {}
    for key, value in table.items():
        if key not in LIMIT_KEYS:
            errs.add(where, key, f"unknown key (known: {', '.join(LIMIT_KEYS)})")
        elif not _is_id(value) or value <= 0:
            errs.add(
                where, key, f"expected a positive integer, got {_toml_type(value)} {show(value)}"
            )
        elif value > 2**31 - 1:
            errs.add(where, key, f"{value} is too large (at most {2**31 - 1})")
        else:
            values[key] = value
    return Limits(**values)


def _parse_tls_client(index: int, table: Any, errs: _Collector) -> TlsClient | None:
    where = f"[[tls_client]] #{index}"
    if not isinstance(table, dict):
        errs.add(where, None, f"expected a table, got {_toml_type(table)}")
        return None
    start = len(errs.problems)
    for key in table:
        if key not in _TLS_KEYS:
            errs.add(where, key, f"unknown key (known: {', '.join(_TLS_KEYS)})")
    cn = table.get("subject_cn")
    if cn is not None and (not isinstance(cn, str) or not cn):
        errs.add(where, "subject_cn", f"expected a non-empty string, got {_toml_type(cn)}")
    fp = table.get("cert_sha256")
    if fp is not None and (not isinstance(fp, str) or not _SHA256_RE.match(fp.replace(":", ""))):
        errs.add(where, "cert_sha256", f"expected 64 hex digits, got {show(fp)}")
    if cn is None and fp is None:
        errs.add(where, None, "needs subject_cn or cert_sha256 to identify the certificate")
    user: str | int | None = None
    if "user" not in table:
        errs.add(where, "user", "missing (the user name or uid the certificate acts as)")
    else:
        got = _check_accounts([table["user"]], "user", where, "user", errs)
        if got and got[0] == WILDCARD:
            errs.add(where, "user", '"*" is not a user; name one user or uid')
        elif got:
            user = got[0]
    if len(errs.problems) > start or user is None:
        return None
    return TlsClient(
        index=index,
        user=user,
        subject_cn=cn,
        cert_sha256=fp.replace(":", "").lower() if isinstance(fp, str) else None,
    )
