"""The broker's policy: which users may run which reviewed programs, how.

A TOML file (e.g. /etc/gfxbpf/policy.toml); anything it does not allow is
denied.

    [[program]]
    name = "syscount"                 # catalog name
    sha256 = "..."                    # the reviewed object (64 hex digits)
    users = ["alice", 1001]           # names or uids; "*" = everyone
    groups = ["video", "render"]      # names or gids; "*" = everyone
    scope = "self"                    # "self", "system", or a list of both (default "self")
    libraries = ["/usr/lib/x86_64-linux-gnu/libvulkan.so.1*"]  # uprobe targets (globs)
    functions = ["vk*"]               # uprobe symbols (globs; default: any)
    description = "..."               # free text, shown by ListPrograms

    [limits]                          # per-user limits; every key optional
    sessions_per_user = 8
    attachments_per_user = 16

    [[tls_client]]                    # gRPC mTLS: client certificate -> user
    subject_cn = "ci-runner"          # and/or cert_sha256 = "<64 hex>"
    user = "alice"                    # name or uid

Several entries may name the same program (different users, scopes or
hashes). User and group names are resolved when a decision is made, so a
policy may name accounts created later; `check_warnings()` lists names that
do not resolve now.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fnmatch
import grp
import json
import os
import pwd
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SCOPES = ("self", "system")
WILDCARD = "*"

_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_PROGRAM_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# POSIX-ish account names (Debian's adduser is laxer; this covers real use).
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel, never a real id
_GLOB_CHARS = re.compile(r"[*?\[]")

_PROGRAM_KEYS = (
    "name",
    "sha256",
    "users",
    "groups",
    "scope",
    "libraries",
    "functions",
    "description",
)
_TLS_KEYS = ("subject_cn", "cert_sha256", "user")
_TOP_KEYS = ("program", "limits", "tls_client")


@dataclass(frozen=True)
class Limits:
    """Per-user limits; the defaults apply to keys the policy leaves out."""

    sessions_per_user: int = 8  # concurrent Unix-socket sessions
    attachments_per_user: int = 16  # live attachments over all sessions and gRPC
    tokens_per_user: int = 4  # unexpired gRPC tokens
    token_ttl_seconds: int = 3600  # the longest a token lives
    lease_seconds: int = 300  # gRPC attachment lease when the client names none
    max_object_bytes: int = 512 * 1024  # uploaded object size
    read_map_entries: int = 4096  # entries per ReadMap page
    # Flood bounds (issue #16): a Unix connection over sessions_per_user is
    # refused at accept, before it costs a thread.
    hello_timeout_seconds: int = 10  # a session's first request must come this soon
    sessions_total: int = 256  # concurrent Unix sessions of all users (one thread each)
    audit_lines_per_second: int = 20  # audit lines per uid (burst as many), then summaries
    # gRPC (issue #16): calls are refused over this many in flight per uid, streams included,
    # and a call whose request message does not follow its headers this soon is ended.
    grpc_calls_per_user: int = 32
    grpc_request_seconds: int = 10
    # Kernel bytes of client-visible maps the broker creates for one user per
    # window: a client can keep a map alive past its attachment (broker/budget.py).
    map_bytes_per_user: int = 64 * 1024 * 1024
    map_bytes_window_seconds: int = 600


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))


@dataclass(frozen=True)
class ProgramEntry:
    """One [[program]] table, validated."""

    index: int  # 1-based position among the [[program]] tables
    name: str
    sha256: str  # lower-case hex
    users: tuple[str | int, ...] = ()
    groups: tuple[str | int, ...] = ()
    scopes: tuple[str, ...] = ("self",)
    libraries: tuple[str, ...] = ()
    functions: tuple[str, ...] = (WILDCARD,)
    description: str = ""
    source: str = "<policy>"  # the file it came from

    @property
    def label(self) -> str:
        return f"[[program]] #{self.index} {json.dumps(self.name)}"

    @property
    def where(self) -> str:
        return f"{self.source} {self.label}"


def _labels(entries: list[ProgramEntry]) -> str:
    """'[[program]] #1, #3 "name"': a reference to entries that tells nothing else."""
    which = ", ".join(f"#{e.index}" for e in entries)
    return f"[[program]] {which} {json.dumps(entries[0].name)}"


@dataclass(frozen=True)
class TlsClient:
    """One [[tls_client]] table: a client certificate mapped to a user."""

    index: int
    user: str | int
    subject_cn: str | None = None
    cert_sha256: str | None = None


class Refusal:
    """Why a Decision refuses, as a kind the protocol maps to one error code
    (broker/errors.py DENIAL_CODES); the text for people is Decision.reason."""

    UNKNOWN_PROGRAM = "unknown_program"  # no entry names the program
    UNAPPROVED_HASH = "unapproved_hash"  # no entry approves the object's sha256
    NOT_LISTED = "not_listed"  # no entry for it names the caller or their groups
    SCOPE = "scope"  # the scope asked for is not granted
    BAD_SCOPE = "bad_scope"  # not a scope at all


@dataclass(frozen=True)
class Decision:
    """A policy decision, in two tellings.

    rule is the whole rule that decided (policy path, principals, hashes),
    for the audit log only. The caller is told reason (what they lack) and
    ref (a reference to quote to the administrator): neither names another
    principal, the policy's path or an entry's lists.
    """

    allowed: bool
    rule: str  # the whole rule, for the audit log
    entry: ProgramEntry | None = None  # the allowing entry (or the nearest miss)
    scope: str | None = None  # the scope granted (resolves an unspecified scope)
    reason: str = ""  # for the caller: what they lack
    ref: str = ""  # for the caller: which rule, e.g. '[[program]] #2 "syscount"'
    refusal: str = ""  # a Refusal kind, when refused


def _upload(program_name: str | None, d: Decision) -> Decision:
    """An upload is known only by its hash: whatever refuses it, that hash is
    what is not approved for this caller."""
    if program_name is None and not d.allowed:
        return dataclasses.replace(d, refusal=Refusal.UNAPPROVED_HASH)
    return d


class PolicyError(ValueError):
    """The policy file is unreadable or invalid. .problems lists every problem found."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class NameResolver:
    """Account lookups (pwd/grp); tests substitute their own."""

    def uid_of(self, name: str) -> int | None:
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None

    def gid_of(self, name: str) -> int | None:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None

    def user_name(self, uid: int) -> str | None:
        try:
            return pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            return None


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


def _show(value: Any) -> str:
    """A value as it would be written in TOML (near enough), for messages."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


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
            f'["alice", 1001]), got {_toml_type(value)} {_show(value)}',
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
                    where, fld, f"write {id_word}s as integers: {item} rather than {_show(item)}"
                )
            elif len(item) <= 256 and _ACCOUNT_RE.match(item):
                out.append(item)
            else:
                errs.add(where, fld, f"{_show(item)} is not a valid {kind} name")
        else:
            errs.add(
                where,
                fld,
                f"each item must be a {kind} name (string) or {id_word} (integer), "
                f"got {_toml_type(item)} {_show(item)}",
            )
    return tuple(out)


def _check_str_list(value: Any, where: str, fld: str, errs: _Collector) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        errs.add(
            where,
            fld,
            f"expected an array of non-empty strings, got {_toml_type(value)} {_show(value)}",
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

    for key in table:
        if key not in _PROGRAM_KEYS:
            errs.add(where, key, f"unknown key (known: {', '.join(_PROGRAM_KEYS)})")

    if "name" not in table:
        errs.add(where, "name", "missing (the catalog program's name)")
    elif not isinstance(name, str) or not _PROGRAM_NAME_RE.match(name):
        errs.add(
            where,
            "name",
            f"expected a program name (letters, digits, _ . -), got {_toml_type(name)} "
            f"{_show(name)}",
        )

    sha = table.get("sha256")
    if "sha256" not in table:
        errs.add(
            where, "sha256", "missing (`gfxbpf-admin approve NAME` prints the entry with its hash)"
        )
    elif not isinstance(sha, str) or not _SHA256_RE.match(sha):
        errs.add(where, "sha256", f"expected 64 hex digits, got {_toml_type(sha)} {_show(sha)}")

    users = _check_accounts(table.get("users", []), "user", where, "users", errs)
    groups = _check_accounts(table.get("groups", []), "group", where, "groups", errs)

    scopes: tuple[str, ...] = ("self",)
    if "scope" in table:
        raw = table["scope"]
        items = raw if isinstance(raw, list) else [raw]
        if not items or not all(isinstance(s, str) for s in items):
            errs.add(
                where,
                "scope",
                f'expected "self", "system" or an array of them, got {_toml_type(raw)} '
                f"{_show(raw)}",
            )
        else:
            bad = [s for s in items if s not in SCOPES]
            if bad:
                errs.add(
                    where,
                    "scope",
                    f'unknown scope {_show(bad[0])} (expected "self" or "system")',
                )
            else:
                scopes = tuple(dict.fromkeys(items))

    libraries: tuple[str, ...] = ()
    if "libraries" in table:
        libs = _check_str_list(table["libraries"], where, "libraries", errs)
        for lib in libs or ():
            if not lib.startswith("/"):
                errs.add(where, "libraries", f"{_show(lib)} is not an absolute path")
            elif ".." in lib.split("/"):
                errs.add(where, "libraries", f"{_show(lib)} contains a '..' component")
        libraries = libs or ()

    functions: tuple[str, ...] = (WILDCARD,)
    if "functions" in table:
        funcs = _check_str_list(table["functions"], where, "functions", errs)
        functions = funcs if funcs is not None else ()

    description = table.get("description", "")
    if not isinstance(description, str):
        errs.add(where, "description", f"expected a string, got {_toml_type(description)}")
        description = ""

    if len(errs.problems) > start:
        return None
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
    )


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
                where, key, f"expected a positive integer, got {_toml_type(value)} {_show(value)}"
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
        errs.add(where, "cert_sha256", f"expected 64 hex digits, got {_show(fp)}")
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


def _split_path(path: str) -> list[str]:
    return [c for c in path.split("/") if c]


def _resolve_pattern(pattern: str) -> str:
    """Resolve the glob-free leading directories of pattern (e.g. /lib -> /usr/lib).

    Targets are compared by their real path, so a pattern written through a
    symlinked directory (or naming a symlink itself) must be resolved too.
    """
    parts = _split_path(pattern)
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
    return not any(c in (".", "..") for c in _split_path(path))


def _path_matches(pattern: str, path: str) -> bool:
    # Component by component, so "*" never crosses a "/".
    pat, got = _split_path(pattern), _split_path(path)
    return len(pat) == len(got) and all(
        fnmatch.fnmatchcase(g, p) for p, g in zip(pat, got, strict=True)
    )


class Policy:
    """A validated policy. Build it with Policy.load(path) or Policy.parse(text)."""

    def __init__(
        self,
        programs: Iterable[ProgramEntry] = (),
        limits: Limits | None = None,
        tls_clients: Iterable[TlsClient] = (),
        *,
        path: str = "<policy>",
        resolver: NameResolver | None = None,
    ) -> None:
        self.path = path
        self.programs = tuple(programs)
        self.limits = limits or Limits()
        self.tls_clients = tuple(tls_clients)
        self.resolver = resolver or NameResolver()

    # ------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, resolver: NameResolver | None = None) -> Policy:
        p = os.fspath(path)
        try:
            with open(p, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise PolicyError(p, [f"{p}: cannot read the policy: {e.strerror or e}"]) from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PolicyError(p, [f"{p}: not UTF-8 text (byte {e.start})"]) from e
        return cls.parse(text, path=p, resolver=resolver)

    @classmethod
    def parse(
        cls, text: str, *, path: str = "<policy>", resolver: NameResolver | None = None
    ) -> Policy:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PolicyError(path, [f"{path}: TOML syntax error: {e}"]) from e
        return cls.from_dict(data, path=path, resolver=resolver)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        path: str = "<policy>",
        resolver: NameResolver | None = None,
    ) -> Policy:
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
        return cls(programs, limits, tls, path=path, resolver=resolver)

    # ------------------------------------------------------------ decisions

    def _who(self, entry: ProgramEntry, uid: int, gids: frozenset[int]) -> str | None:
        """The entry's field that admits the caller, as written; None if none does."""
        for u in entry.users:
            if u == WILDCARD or u == uid or (isinstance(u, str) and self.resolver.uid_of(u) == uid):
                return f"users = {_show(entry.users)}"
        for g in entry.groups:
            if (
                g == WILDCARD
                or g in gids
                or (isinstance(g, str) and self.resolver.gid_of(g) in gids)
            ):
                return f"groups = {_show(entry.groups)}"
        return None

    def _caller(self, uid: int) -> str:
        name = self.resolver.user_name(uid)
        return f"uid {uid} ({name})" if name else f"uid {uid}"

    def decide(
        self,
        uid: int,
        gids: Iterable[int],
        program_name: str | None,
        sha256: str,
        scope: str | None,
    ) -> Decision:
        """May uid (with groups gids) run this object in this scope?

        program_name None (uploaded bytes without a name) looks the object up
        by its hash alone. scope None picks the narrowest scope an allowing
        entry grants ("self" before "system"). gids should hold the caller's
        primary and supplementary groups (e.g. framing.peer_groups).
        """
        sha = sha256.lower()
        if scope is not None and scope not in SCOPES:
            why = f'invalid scope {_show(scope)} (expected "self" or "system")'
            return _upload(
                program_name, Decision(False, why, reason=why, refusal=Refusal.BAD_SCOPE)
            )
        candidates = self._candidates(program_name, sha)
        if isinstance(candidates, Decision):
            return candidates
        hashed = [e for e in candidates if e.sha256 == sha]
        if not hashed:
            return self._wrong_hash(candidates, program_name, sha)
        gid_set = frozenset(gids)
        admitted = [(e, why) for e in hashed if (why := self._who(e, uid, gid_set))]
        if not admitted:
            return _upload(program_name, self._not_listed(hashed, uid))
        return _upload(program_name, self._grant_scope(admitted, scope, uid))

    def _candidates(self, program_name: str | None, sha: str) -> list[ProgramEntry] | Decision:
        """The entries for the program (by name, else by hash), or default deny."""
        if program_name is not None:
            candidates = [e for e in self.programs if e.name == program_name]
            if not candidates:
                why = f"no [[program]] entry names {_show(program_name)}"
                return Decision(
                    False,
                    f"default deny: {why}",
                    reason=why,
                    ref="default deny",
                    refusal=Refusal.UNKNOWN_PROGRAM,
                )
            return candidates
        candidates = [e for e in self.programs if e.sha256 == sha]
        if not candidates:
            rule = f"default deny: no [[program]] entry approves sha256 {sha}"
            why = "no [[program]] entry approves that sha256"
            return Decision(
                False, rule, reason=why, ref="default deny", refusal=Refusal.UNAPPROVED_HASH
            )
        return candidates

    def _wrong_hash(
        self, candidates: list[ProgramEntry], program_name: str | None, sha: str
    ) -> Decision:
        e = candidates[0]
        if len(candidates) == 1:
            rule = f"{e.where}: sha256 = {_show(e.sha256)} does not match the object's {sha}"
        else:
            which = ", ".join(f"#{x.index}" for x in candidates)
            rule = (
                f"{self.path} [[program]] {which} {_show(program_name)}: no entry's sha256 "
                f"matches the object's {sha}"
            )
        return Decision(
            False,
            rule,
            e,
            reason="no entry for it approves that sha256",
            ref=f"{_labels(candidates)}: sha256",
            refusal=Refusal.UNAPPROVED_HASH,
        )

    def _not_listed(self, hashed: list[ProgramEntry], uid: int) -> Decision:
        e = hashed[0]
        fields = f"users = {_show(e.users)}, groups = {_show(e.groups)}"
        others = "".join(f", #{x.index}" for x in hashed[1:])
        return Decision(
            False,
            f"{e.where}{others}: {fields} do not include {self._caller(uid)} or any of its groups",
            e,
            reason=f"no entry for it names you or any of your groups (you are {self._caller(uid)})",
            ref=f"{_labels(hashed)}: users, groups",
            refusal=Refusal.NOT_LISTED,
        )

    def _grant_scope(
        self, admitted: list[tuple[ProgramEntry, str]], scope: str | None, uid: int
    ) -> Decision:
        """The narrowest scope asked for that an admitting entry grants."""
        wanted = (scope,) if scope is not None else SCOPES
        for want in wanted:
            for e, why in admitted:
                if want in e.scopes:
                    return Decision(True, f"{e.where}: {why}", e, want, ref=e.label)
        e = admitted[0][0]
        # Only the scopes of entries that admit this caller: theirs to know.
        granted = sorted({s for x, _ in admitted for s in x.scopes})
        return Decision(
            False,
            f"{e.where}: scope = {_show(list(e.scopes))} does not allow scope {_show(scope)} "
            f"for {self._caller(uid)} (allowed: {', '.join(granted)})",
            e,
            reason=f"scope {scope} is not granted to you (yours: {', '.join(granted)})",
            ref=f"{_labels([x for x, _ in admitted])}: scope",
            refusal=Refusal.SCOPE,
        )

    def programs_for(self, uid: int, gids: Iterable[int]) -> list[ProgramEntry]:
        """The entries that admit this caller (for ListPrograms), in file order."""
        gid_set = frozenset(gids)
        return [e for e in self.programs if self._who(e, uid, gid_set)]

    def library_allowed(self, entry: ProgramEntry, path: str) -> bool:
        """May entry's uprobes go into the library at path?

        The path is resolved (symlinks, ..) and matched component by
        component against the entry's `libraries` globs, whose glob-free
        leading directories are resolved too. Pass the path of the file the
        broker actually opens (e.g. readlink of /proc/self/fd/N) so the check
        and the use name the same file.
        """
        if not entry.libraries or not isinstance(path, str) or not path.startswith("/"):
            return False
        if "\x00" in path:
            return False
        real = os.path.realpath(path)
        return any(_path_matches(_resolve_pattern(p), real) for p in entry.libraries)

    def library_named(self, entry: ProgramEntry, path: str) -> bool:
        """May path, as written, name one of entry's libraries?

        A lexical check, made before the broker touches the file system, so
        a path no glob can match is refused alike whether or not it exists.
        path must be absolute and plain (no "." or ".." component); it may
        match a glob as written or with the glob's leading directories
        resolved. library_allowed() then checks the file actually opened.
        """
        if not entry.libraries or not is_plain_path(path):
            return False
        return any(
            _path_matches(p, path) or _path_matches(_resolve_pattern(p), path)
            for p in entry.libraries
        )

    def function_allowed(self, entry: ProgramEntry, function: str) -> bool:
        """May entry's uprobes attach to this symbol (the `functions` globs)?"""
        return any(fnmatch.fnmatchcase(function, g) for g in entry.functions)

    def tls_user(self, subject_cn: str | None = None, cert_sha256: str | None = None) -> int | None:
        """The uid a client certificate acts as, or None if no [[tls_client]] maps it.

        When an entry lists both subject_cn and cert_sha256, both must match.
        """
        fp = cert_sha256.replace(":", "").lower() if cert_sha256 else None
        for c in self.tls_clients:
            if c.subject_cn is not None and c.subject_cn != subject_cn:
                continue
            if c.cert_sha256 is not None and c.cert_sha256 != fp:
                continue
            if isinstance(c.user, int):
                return c.user
            return self.resolver.uid_of(c.user)
        return None

    # ------------------------------------------------------------ reporting

    def check_warnings(self) -> list[str]:
        """Things that are valid but probably wrong (for --check-policy)."""
        out: list[str] = []
        seen: dict[tuple[Any, ...], int] = {}
        for e in self.programs:
            for u in e.users:
                if isinstance(u, str) and u != WILDCARD and self.resolver.uid_of(u) is None:
                    out.append(f"{e.where}: field 'users': no user {_show(u)} on this host (yet)")
            for g in e.groups:
                if isinstance(g, str) and g != WILDCARD and self.resolver.gid_of(g) is None:
                    out.append(f"{e.where}: field 'groups': no group {_show(g)} on this host (yet)")
            if not e.users and not e.groups:
                out.append(f"{e.where}: neither users nor groups: the entry admits nobody")
            if not e.functions:
                out.append(f"{e.where}: field 'functions' is empty: no uprobe can attach")
            key = (e.name, e.sha256, e.users, e.groups, e.scopes, e.libraries, e.functions)
            if key in seen:
                out.append(f"{e.where}: same as [[program]] #{seen[key]}")
            else:
                seen[key] = e.index
        for c in self.tls_clients:
            if isinstance(c.user, str) and self.resolver.uid_of(c.user) is None:
                out.append(
                    f"{self.path} [[tls_client]] #{c.index}: field 'user': no user "
                    f"{_show(c.user)} on this host (yet)"
                )
        return out

    def catalog_warnings(self, catalog: Iterable[Any]) -> list[str]:
        """Entries that disagree with the catalog (for --check-policy).

        catalog: programs with .name, .sha256 and .scopes (gfxbpf.bpf.catalog).
        """
        programs = {p.name: p for p in catalog}
        out: list[str] = []
        for e in self.programs:
            prog = programs.get(e.name)
            if prog is None:
                out.append(
                    f"{e.where}: no program {_show(e.name)} in the catalog "
                    f"(known: {', '.join(sorted(programs)) or 'none'}); only uploaded "
                    "objects with this hash can match"
                )
                continue
            if prog.sha256.lower() != e.sha256:
                out.append(
                    f"{e.where}: field 'sha256': the catalog's object has sha256 "
                    f"{prog.sha256.lower()}; this entry approves another build, so the "
                    "catalog program is refused (re-approve it: gfxbpf-admin approve "
                    f"{e.name})"
                )
            unsupported = [sc for sc in e.scopes if sc not in tuple(prog.scopes)]
            if unsupported:
                out.append(
                    f"{e.where}: field 'scope': the catalog program supports only "
                    f"{', '.join(prog.scopes)}, not {', '.join(unsupported)}"
                )
        return out

    def summary(self) -> str:
        names = {e.name for e in self.programs}
        lines = [
            f"{self.path}: {len(self.programs)} [[program]] entries for {len(names)} programs, "
            f"{len(self.tls_clients)} [[tls_client]] entries"
        ]
        for e in self.programs:
            who = []
            if e.users:
                who.append(f"users {', '.join(str(u) for u in e.users)}")
            if e.groups:
                who.append(f"groups {', '.join(str(g) for g in e.groups)}")
            line = (
                f"  #{e.index} {e.name}  sha256 {e.sha256[:16]}...  scope {'/'.join(e.scopes)}  "
                + ("; ".join(who) or "nobody")
            )
            if e.libraries:
                line += f"  libraries {', '.join(e.libraries)}"
            lines.append(line)
        lim = ", ".join(f"{k}={getattr(self.limits, k)}" for k in LIMIT_KEYS)
        lines.append(f"  limits: {lim}")
        return "\n".join(lines)


__all__ = [
    "LIMIT_KEYS",
    "SCOPES",
    "Decision",
    "Limits",
    "NameResolver",
    "Policy",
    "PolicyError",
    "ProgramEntry",
    "TlsClient",
]
