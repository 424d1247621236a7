"""The broker's operations, independent of the transport.

The Unix-socket server (unix_server.py) and the gRPC server (grpc_server.py)
are thin adapters: they identify the caller, hold an Owner per session (or
per gRPC token), and call these methods. Every operation writes one audit
line (uid, pid, op, program, sha256, scope, result). Errors are BrokerError
carrying a protocol ErrorCode and, for policy refusals, the rule.

Attach, in order: find the object (catalog name or uploaded bytes, hashed
once), ask the policy (hash, user, scope), parse those same bytes, run the
static audit, check parameters (pid ownership by pidfd, library and
function globs), then join a live identical instance or load a new one:
.rodata knobs (scope uid/pid, tracepoint field offsets), charge the
client-visible maps to the caller's map budget (broker/budget.py), load with
every client-visible map but ring buffers frozen, attach.

fds returned by attach() are the broker's own (the instance's map fds):
send them with SCM_RIGHTS and do NOT close them; they stay valid while the
attachment lives (the session handles one request at a time).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gfxbpf.bpf import consts as C
from gfxbpf.bpf import instance as bpfinstance
from gfxbpf.bpf import sys as bpfsys
from gfxbpf.bpf import tracefs
from gfxbpf.bpf.btf import KIND_STRUCT
from gfxbpf.bpf.catalog import Catalog, MapEntry, Program
from gfxbpf.bpf.loader import LoadedObject, LoadError, load
from gfxbpf.bpf.maps import CursorError, Map
from gfxbpf.bpf.object import MAX_OBJECT_SIZE, MapSpec, ObjectError, ObjectSpec
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.broker import audit as staticaudit
from gfxbpf.broker import budget, libraries
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.pidcheck import NoSuchProcess, PidError, PidHandle, verify_owner
from gfxbpf.broker.policy import Decision, Policy, ProgramEntry, is_plain_path
from gfxbpf.broker.registry import InstanceKey, Registry
from gfxbpf.proto import gfxbpf_pb2 as pb

PROTOCOL_VERSION = 1
MAX_FUNCTIONS = 64  # ucalls keys its maps by function index (bpf cookie)
MAX_SYMBOL_LEN = 512
# A ReadMap page stays well inside one control-socket datagram (1 MiB).
READ_MAP_MAX_BYTES = 768 * 1024
# StreamEvents: one batch holds at most this many records / bytes.
EVENT_BATCH_RECORDS = 512
EVENT_BATCH_BYTES = 512 * 1024
EVENT_POLL_SECONDS = 0.2
_UPROBE_KINDS = ("uprobe", "uretprobe")
_SCOPE_NAMES = {pb.SCOPE_SELF: "self", pb.SCOPE_SYSTEM: "system"}
_SCOPE_ENUMS = {"self": pb.SCOPE_SELF, "system": pb.SCOPE_SYSTEM}


def _broker_version() -> str:
    try:
        from importlib.metadata import version

        return version("gfxbpf")
    except Exception:
        return "0.1.0"


BROKER_VERSION = _broker_version()


@dataclass(frozen=True)
class Caller:
    """Who is asking: from SO_PEERCRED (Unix) or a token / certificate (gRPC)."""

    uid: int
    gid: int
    gids: tuple[int, ...]  # primary and supplementary groups
    pid: int  # 0 over gRPC
    transport: str  # "unix" | "grpc"


class BrokerError(Exception):
    """An operation failed; code is a pb.ErrorCode.

    message and rule go to the caller: rule is a reference to the policy
    rule that decided, to quote to the administrator (no policy path, no
    other principal). audit_rule, the whole rule, goes to the audit log only.
    """

    def __init__(self, code: int, message: str, rule: str = "", *, audit_rule: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule
        self.audit_rule = audit_rule or rule

    def to_pb(self) -> pb.Error:
        return pb.Error(code=self.code, message=self.message, rule=self.rule)

    @property
    def result(self) -> str:
        """The audit-log result word for this error."""
        denied = (
            pb.ERROR_PERMISSION_DENIED,
            pb.ERROR_HASH_MISMATCH,
            pb.ERROR_AUDIT_FAILED,
            pb.ERROR_RESOURCE_EXHAUSTED,
            pb.ERROR_UNAUTHENTICATED,
        )
        return "denied" if self.code in denied else "error"


class TokenIssuer(Protocol):
    """What issue_token needs from the gRPC side (grpc_server's token store).

    issue() returns (token, expires_unix); it raises BrokerError (e.g.
    RESOURCE_EXHAUSTED for tokens_per_user) when it refuses.
    """

    def issue(self, caller: Caller, ttl_seconds: int) -> tuple[str, int]: ...


@dataclass
class SharedInstance:
    """One loaded and attached object, possibly shared by several attachments."""

    key: InstanceKey
    entry: Program
    spec: ObjectSpec
    inst: bpfinstance.Instance
    visible: dict[str, Map]  # client-visible maps by catalog name
    map_bytes: int = 0  # charged to its creator's map budget

    @property
    def obj(self) -> LoadedObject:
        return self.inst.obj

    def close(self) -> None:
        self.inst.close()


@dataclass
class Attachment:
    id: int
    owner: Owner
    uid: int
    program: str
    sha256: str
    scope: str
    key: InstanceKey
    shared: SharedInstance
    closed: bool = False
    streaming: bool = False


class Owner:
    """Holds attachments: a Unix session, or a gRPC token's lease holder.

    close() detaches everything it holds (idempotent). Create with
    Service.open_owner(caller).
    """

    def __init__(self, service: Service, caller: Caller, owner_id: int, counted: bool) -> None:
        self.service = service
        self.caller = caller
        self.id = owner_id
        self.counted = counted  # counts against sessions_per_user
        self.closed = False
        self.lock = threading.Lock()
        self.attachments: dict[int, Attachment] = {}

    def attachment_ids(self) -> list[int]:
        with self.lock:
            return list(self.attachments)

    def close(self) -> None:
        self.service.close_owner(self)


@dataclass
class _Resolved:
    """An attach request resolved to bytes, metadata and a policy decision."""

    data: bytes
    sha256: str
    entry: Program
    policy_entry: ProgramEntry
    scope: str
    rule: str  # the whole rule, for the audit log
    via: str  # "name" or "bytes"


@dataclass
class _Target:
    """Checked attach parameters."""

    pid: int | None = None
    library: str | None = None  # real path
    library_fd: int = -1  # open fd on it, for a race-free uprobe path
    functions: tuple[str, ...] = ()
    pid_handle: PidHandle | None = None

    def close(self) -> None:
        if self.library_fd >= 0:
            os.close(self.library_fd)
            self.library_fd = -1
        if self.pid_handle is not None:
            self.pid_handle.close()
            self.pid_handle = None


@dataclass
class _Counts:
    sessions: dict[int, int] = field(default_factory=dict)
    attachments: dict[int, int] = field(default_factory=dict)


def _kernel_at_least(release: str, major: int, minor: int) -> bool:
    parts = release.split(".")
    try:
        got = (int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0))
    except (IndexError, ValueError):
        return False
    return got >= (major, minor)


def _catalog_map_description(m: MapEntry) -> pb.MapDescription:
    """What the catalog says of a visible map; Attach adds the kernel map's side."""
    return pb.MapDescription(
        name=m.name,
        show=m.show or "",
        unit=m.unit or "",
        key_label=m.key_label or "",
        description=m.description,
        event_type=m.event_type or "",
        fd_index=-1,
    )


def _read_sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class Service:
    """The operations. The gRPC server sets `service.tokens` to its token store;
    without one (no --grpc), IssueToken answers UNAVAILABLE."""

    def __init__(
        self,
        policy: Policy,
        catalog: Catalog,
        audit: AuditLog,
        *,
        clock: Callable[[], float] = time.monotonic,
        event_exists: Callable[[str, str], bool] = tracefs.event_exists,
        read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
    ) -> None:
        self.policy = policy
        self.catalog = catalog
        self.audit = audit
        self.clock = clock
        self.tokens: TokenIssuer | None = None
        self._event_exists = event_exists
        self._read_format = read_format
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._owners: dict[int, Owner] = {}
        self._owner_ids = itertools.count(1)
        self._attachment_ids = itertools.count(1)
        self._unique = itertools.count(1)
        self._registry: Registry[SharedInstance] = Registry()
        self._objects: dict[str, bytes] = {}  # catalog name -> bytes, read once
        self._audits: dict[str, staticaudit.AuditReport] = {}  # sha256 -> verdict
        self._map_budget = budget.MapBudget(clock)

    # ------------------------------------------------------------ helpers

    def _log(self, op: str, caller: Caller, result: str, **fields: object) -> None:
        self.audit.record(
            op=op,
            result=result,
            uid=caller.uid,
            pid=caller.pid,
            transport=caller.transport,
            **fields,
        )

    def _fail(self, op: str, caller: Caller, err: BrokerError, **fields: object) -> BrokerError:
        fields.setdefault("detail", err.message)
        if err.audit_rule:
            fields.setdefault("rule", err.audit_rule)
        self._log(op, caller, err.result, code=pb.ErrorCode.Name(err.code), **fields)
        return err

    def _limit_rule(self, key: str, limit: int) -> dict[str, str]:
        """rule and audit_rule of a [limits] refusal (the caller's own limit)."""
        rule = f"[limits] {key} = {limit}"
        return {"rule": rule, "audit_rule": f"{self.policy.path} {rule}"}

    def _check_owner(self, caller: Caller, owner: Owner) -> None:
        if owner.closed:
            raise BrokerError(pb.ERROR_NOT_FOUND, "this session is closed")
        if owner.caller.uid != caller.uid:
            raise BrokerError(pb.ERROR_PERMISSION_DENIED, "the session belongs to another user")

    def _attachment(self, owner: Owner, attachment_id: int) -> Attachment:
        with owner.lock:
            att = owner.attachments.get(attachment_id)
        if att is None or att.closed:
            raise BrokerError(
                pb.ERROR_NOT_FOUND,
                f"no attachment {attachment_id} in this session (attachments: "
                f"{', '.join(map(str, owner.attachment_ids())) or 'none'})",
            )
        return att

    @property
    def open_owners(self) -> int:
        with self._lock:
            return len(self._owners)

    @property
    def live_instances(self) -> int:
        return len(self._registry)

    # ------------------------------------------------------------ owners

    def open_owner(self, caller: Caller) -> Owner:
        """A new holder of attachments. Unix sessions count against sessions_per_user."""
        counted = caller.transport == "unix"
        limit = self.policy.limits.sessions_per_user
        with self._lock:
            have = self._counts.sessions.get(caller.uid, 0)
            if counted and have >= limit:
                err = BrokerError(
                    pb.ERROR_RESOURCE_EXHAUSTED,
                    f"uid {caller.uid} already has {have} open sessions, the policy's "
                    f"limit (close one, or ask the administrator to raise it)",
                    **self._limit_rule("sessions_per_user", limit),
                )
            else:
                err = None
                if counted:
                    self._counts.sessions[caller.uid] = have + 1
                owner = Owner(self, caller, next(self._owner_ids), counted)
                self._owners[owner.id] = owner
        if err is not None:
            raise self._fail("open_session", caller, err)
        return owner

    def close_owner(self, owner: Owner) -> None:
        """Detach everything the owner holds; idempotent."""
        with owner.lock:
            if owner.closed:
                return
            owner.closed = True
            atts = list(owner.attachments.values())
            owner.attachments.clear()
        unloaded = 0
        for att in atts:
            try:
                if self._release(att):
                    unloaded += 1
            except Exception as e:  # keep releasing the rest
                self._log(
                    "detach",
                    owner.caller,
                    "error",
                    program=att.program,
                    sha256=att.sha256,
                    scope=att.scope,
                    attachment_id=att.id,
                    detail=f"release failed: {e}",
                )
        with self._lock:
            self._owners.pop(owner.id, None)
            if owner.counted:
                n = self._counts.sessions.get(owner.caller.uid, 0) - 1
                if n > 0:
                    self._counts.sessions[owner.caller.uid] = n
                else:
                    self._counts.sessions.pop(owner.caller.uid, None)
        self._log(
            "close_session",
            owner.caller,
            "ok",
            detail=f"detached {len(atts)} attachments, unloaded {unloaded} instances",
        )

    def close_all(self) -> None:
        """Close every owner (shutdown)."""
        with self._lock:
            owners = list(self._owners.values())
        for o in owners:
            self.close_owner(o)

    def _release(self, att: Attachment) -> bool:
        att.closed = True
        try:
            return self._registry.release(att.key, att.shared)
        finally:
            with self._lock:
                n = self._counts.attachments.get(att.uid, 0) - 1
                if n > 0:
                    self._counts.attachments[att.uid] = n
                else:
                    self._counts.attachments.pop(att.uid, None)

    # ------------------------------------------------------------ Hello

    def hello(self, caller: Caller, req: pb.HelloRequest) -> pb.HelloReply:
        release = os.uname().release
        stats = _read_sysctl("/proc/sys/kernel/bpf_stats_enabled") == "1"
        reply = pb.HelloReply(
            protocol=PROTOCOL_VERSION,
            broker_version=BROKER_VERSION,
            kernel_release=release,
            features=pb.Features(
                direct_map_reads=_kernel_at_least(release, 5, 19), bpf_stats=stats
            ),
            uid=caller.uid,
            gid=caller.gid,
            pid=caller.pid,
            possible_cpus=bpfsys.possible_cpus(),
        )
        self._log("hello", caller, "ok", detail=req.client_version or None)
        return reply

    # ------------------------------------------------------------ ListPrograms

    def list_programs(self, caller: Caller, req: pb.ListProgramsRequest) -> pb.ListProgramsReply:
        entries = self.policy.programs_for(caller.uid, caller.gids)
        by_name: dict[str, list[ProgramEntry]] = {}
        for e in entries:
            by_name.setdefault(e.name, []).append(e)
        reply = pb.ListProgramsReply()
        for name, group in by_name.items():
            reply.programs.append(self._listing(name, group))
        self._log("list_programs", caller, "ok", detail=f"{len(reply.programs)} programs")
        return reply

    def _listing(self, name: str, group: list[ProgramEntry]) -> pb.ProgramListing:
        cat = self.catalog.programs
        entry = next((p for p in cat if p.name == name), None)
        scopes = list(dict.fromkeys(s for e in group for s in e.scopes))
        libraries = list(dict.fromkeys(lib for e in group for lib in e.libraries))
        listing = pb.ProgramListing(
            name=name,
            description=next((e.description for e in group if e.description), ""),
            sha256=group[0].sha256,
            libraries=libraries,
        )
        if entry is None:
            listing.scopes.extend(_SCOPE_ENUMS[s] for s in scopes)
            listing.available = False
            listing.unavailable_reason = (
                f"program {name!r} is not in the broker's catalog; only an uploaded object "
                "with the approved sha256 and a catalog program's layout can run"
            )
            return listing
        listing.description = listing.description or entry.description
        listing.scopes.extend(_SCOPE_ENUMS[s] for s in scopes if s in entry.scopes)
        listing.attach_points.extend(
            f"{a.kind}/{a.target}" if a.target else a.kind for a in entry.attach
        )
        for p in entry.parameters:
            listing.parameters.append(
                pb.ParameterDescription(
                    name=p.name, type=p.type, required=p.required, description=p.description
                )
            )
        listing.maps.extend(_catalog_map_description(m) for m in entry.visible_maps)
        reason = bpfinstance.availability(entry, self._event_exists)
        if reason is None and not any(e.sha256 == entry.sha256 for e in group):
            reason = (
                f"the policy approves sha256 {group[0].sha256}, but the catalog's "
                f"{entry.object} is {entry.sha256}: attach by uploading the approved object, "
                f"or re-approve (gfxbpf-admin approve {name})"
            )
        listing.available = reason is None
        listing.unavailable_reason = reason or ""
        return listing

    # ------------------------------------------------------------ Attach

    def _catalog_bytes(self, entry: Program) -> bytes:
        with self._lock:
            data = self._objects.get(entry.name)
        if data is not None:
            return data
        path = entry.directory / entry.object
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_OBJECT_SIZE + 1)
        except OSError as e:
            raise BrokerError(
                pb.ERROR_UNAVAILABLE,
                f"program {entry.name!r}: cannot read {path}: {e.strerror or e}",
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256:
            raise BrokerError(
                pb.ERROR_HASH_MISMATCH,
                f"program {entry.name!r}: {path} has sha256 {digest}, but the catalog says "
                f"{entry.sha256}; the object changed since it was reviewed (rebuild and "
                "re-approve it)",
            )
        with self._lock:
            self._objects.setdefault(entry.name, data)
        return data

    def _decide(
        self, caller: Caller, name: str | None, sha: str, scope: str | None
    ) -> tuple[ProgramEntry, str, Decision]:
        """(allowing entry, granted scope, decision), or BrokerError.

        The caller is told what they lack and a reference to the rule; the
        whole rule (other principals, the policy's path) is for the audit log.
        """
        d = self.policy.decide(caller.uid, caller.gids, name, sha, scope)
        if d.allowed:
            assert d.entry is not None and d.scope is not None
            return d.entry, d.scope, d
        if name is None:
            code = pb.ERROR_HASH_MISMATCH
            msg = f"uploaded object (sha256 {sha}) is not approved for you"
        else:
            named = [e for e in self.policy.programs if e.name == name]
            if named and not any(e.sha256 == sha for e in named):
                code = pb.ERROR_HASH_MISMATCH
                msg = f"program {name!r} (sha256 {sha}) is not the reviewed object"
            else:
                code = pb.ERROR_PERMISSION_DENIED
                msg = f"you may not run program {name!r}" + (
                    f" with scope {scope}" if scope else ""
                )
        raise BrokerError(code, f"{msg}: {d.reason}", rule=d.ref, audit_rule=d.rule)

    def _resolve(
        self, caller: Caller, req: pb.AttachRequest, fields: dict[str, object]
    ) -> _Resolved:
        """Find the object and ask the policy; fields (for the audit line) fill in as
        they become known, so a refusal is logged with what was asked."""
        which = req.WhichOneof("program")
        if req.scope not in (pb.SCOPE_UNSPECIFIED, pb.SCOPE_SELF, pb.SCOPE_SYSTEM):
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"unknown scope value {req.scope}")
        scope = _SCOPE_NAMES.get(req.scope)
        fields["scope"] = scope
        if which == "name":
            name = req.name
            entry = next((p for p in self.catalog.programs if p.name == name), None)
            if entry is None:
                # Policy first: a name nobody approved is a plain refusal.
                if not any(e.name == name for e in self.policy.programs):
                    self._decide(caller, name, "0" * 64, scope)
                raise BrokerError(
                    pb.ERROR_NOT_FOUND,
                    f"no program {name!r} in the broker's catalog (known: "
                    f"{', '.join(self.catalog.names())}); send the approved object's bytes",
                )
            fields["sha256"] = entry.sha256
            data = self._catalog_bytes(entry)
            sha = entry.sha256
            pentry, granted, d = self._decide(caller, name, sha, scope)
            return _Resolved(data, sha, entry, pentry, granted, d.rule, "name")
        if which == "object":
            data = bytes(req.object)
            limit = self.policy.limits.max_object_bytes
            if len(data) > limit:
                raise BrokerError(
                    pb.ERROR_RESOURCE_EXHAUSTED,
                    f"uploaded object is {len(data)} bytes, over the policy's limit of {limit}",
                    **self._limit_rule("max_object_bytes", limit),
                )
            sha = hashlib.sha256(data).hexdigest()
            fields["sha256"] = sha
            pentry, granted, d = self._decide(caller, None, sha, scope)
            fields["program"] = pentry.name
            # The audit runs before anything else touches these bytes' meaning.
            self._audit(data, sha, pentry.name)
            entry = next((p for p in self.catalog.programs if p.sha256 == sha), None)
            if entry is None:
                entry = next((p for p in self.catalog.programs if p.name == pentry.name), None)
            if entry is None:
                raise BrokerError(
                    pb.ERROR_NOT_FOUND,
                    f"uploaded object (sha256 {sha}) is approved by {pentry.label}, but no "
                    f"catalog program is named {pentry.name!r} or has that hash: the broker "
                    "needs a catalog entry (attach points, knobs, visible maps) to run it",
                    rule=d.ref,
                    audit_rule=d.rule,
                )
            return _Resolved(data, sha, entry, pentry, granted, d.rule, "bytes")
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, "AttachRequest names no program: set name or object"
        )

    def _audit(self, data: bytes, sha: str, name: str) -> staticaudit.AuditReport:
        with self._lock:
            report = self._audits.get(sha)
        if report is None:
            try:
                spec = ObjectSpec.parse(data, name)
            except ObjectError as e:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT, f"object (sha256 {sha}) cannot be used: {e}"
                ) from None
            report = staticaudit.audit_spec(spec, ncpus=bpfsys.possible_cpus())
            with self._lock:
                self._audits[sha] = report
        if not report.ok:
            raise BrokerError(
                pb.ERROR_AUDIT_FAILED,
                f"the broker's static audit refused object {name!r} (sha256 {sha}): "
                + "; ".join(report.problems),
            )
        return report

    def _check_params(
        self, caller: Caller, res: _Resolved, params: pb.AttachParams, fds: Sequence[int] = ()
    ) -> _Target:
        entry = res.entry
        uprobe = any(a.kind in _UPROBE_KINDS for a in entry.attach)
        required = {p.name for p in entry.parameters if p.required}
        t = _Target()
        try:
            if params.pid < 0:
                raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"pid {params.pid} is invalid")
            if params.pid:
                if not entry.pid_knob and not uprobe:
                    raise BrokerError(
                        pb.ERROR_INVALID_ARGUMENT, f"program {entry.name!r} takes no pid"
                    )
                if res.scope == "self":
                    try:
                        t.pid_handle = verify_owner(params.pid, caller.uid)
                    except NoSuchProcess as e:
                        raise BrokerError(pb.ERROR_NOT_FOUND, str(e)) from None
                    except PidError as e:
                        raise BrokerError(pb.ERROR_PERMISSION_DENIED, str(e)) from None
                t.pid = params.pid
            elif "pid" in required:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT, f"program {entry.name!r} needs a pid (params.pid)"
                )
            funcs = tuple(params.functions)
            wants_library = bool(params.library) or params.HasField("library_fd_index")
            if not uprobe:
                if wants_library or funcs:
                    raise BrokerError(
                        pb.ERROR_INVALID_ARGUMENT,
                        f"program {entry.name!r} attaches no uprobes: it takes no library "
                        "or functions",
                    )
                return t
            if not wants_library or not funcs:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"program {entry.name!r} needs params.library and params.functions",
                )
            if len(funcs) > MAX_FUNCTIONS:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"{len(funcs)} functions; at most {MAX_FUNCTIONS}",
                )
            for fn in funcs:
                if not fn or len(fn) > MAX_SYMBOL_LEN or "\0" in fn:
                    raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"bad function name {fn!r}")
            t.library_fd, t.library = self._open_library(caller, res.policy_entry, params, fds)
            for fn in funcs:
                if not self.policy.function_allowed(res.policy_entry, fn):
                    pe = res.policy_entry
                    raise BrokerError(
                        pb.ERROR_PERMISSION_DENIED,
                        f"function {fn!r} is not allowed for you in this library",
                        rule=f"{pe.label}: functions",
                        audit_rule=f"{pe.where}: functions = {list(pe.functions)}",
                    )
            t.functions = funcs
            return t
        except BaseException:
            t.close()
            raise

    def _library_refused(self, entry: ProgramEntry, shown: str) -> BrokerError:
        """The one answer for a library the policy does not allow (before or after opening)."""
        return BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"library {shown} is not allowed for you (`gfxclient info {entry.name}` lists "
            "the libraries you may trace)",
            rule=f"{entry.label}: libraries",
            audit_rule=f"{entry.where}: libraries = {list(entry.libraries)}",
        )

    def _open_library(
        self, caller: Caller, entry: ProgramEntry, params: pb.AttachParams, fds: Sequence[int]
    ) -> tuple[int, str]:
        """The uprobe target as (fd the broker owns, real path), judged by the policy.

        Never a file the caller could not open themselves (broker/libraries.py):
        over the Unix socket the client passes the fd; over gRPC the path is
        checked against the policy's globs before the broker touches the file
        system, then opened only if the caller could have opened it.
        """
        if caller.transport == "unix":
            fd = self._passed_library(params, fds)
        else:
            fd = self._library_as_caller(caller, entry, params)
        try:
            try:
                real = libraries.from_fd(fd)
            except libraries.LibraryError as e:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"library {params.library or '(passed fd)'}: {e}",
                ) from None
            if not self.policy.library_allowed(entry, real):
                named = params.library
                raise self._library_refused(
                    entry, f"{named} ({real})" if named and named != real else real
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def _passed_library(self, params: pb.AttachParams, fds: Sequence[int]) -> int:
        """A duplicate of the library fd that came with a Unix-socket request."""
        if not params.HasField("library_fd_index"):
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                "over the Unix socket, open the library yourself and send its fd with the "
                "request (AttachParams.library_fd_index, SCM_RIGHTS); gfxbpf.client and "
                "gfxclient do this",
            )
        i = params.library_fd_index
        if not 0 <= i < len(fds):
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"library_fd_index {i}, but the request carried {len(fds)} fds",
            )
        return fcntl.fcntl(fds[i], fcntl.F_DUPFD_CLOEXEC, 0)

    def _library_as_caller(
        self, caller: Caller, entry: ProgramEntry, params: pb.AttachParams
    ) -> int:
        """Open params.library for a gRPC caller, revealing nothing they could not see."""
        if params.HasField("library_fd_index"):
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                "gRPC passes no fds: send the library's path (params.library) only",
            )
        lib = params.library
        if not is_plain_path(lib):
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"library must be an absolute path without . or .. components, got {lib!r}",
            )
        # Lexically first: a path no glob can match is refused without a lookup.
        if not self.policy.library_named(entry, lib):
            raise self._library_refused(entry, lib)
        try:
            fd, _ = libraries.open_as(lib, caller.uid, caller.gids)
        except libraries.Unreachable:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"cannot open library {lib} as uid {caller.uid}: it does not exist or you "
                "may not read it (the broker opens only what you could open yourself)",
            ) from None
        except libraries.LibraryError as e:
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"library {lib}: {e}") from None
        return fd

    def _reserve_attachment(self, caller: Caller) -> None:
        limit = self.policy.limits.attachments_per_user
        with self._lock:
            have = self._counts.attachments.get(caller.uid, 0)
            if have >= limit:
                raise BrokerError(
                    pb.ERROR_RESOURCE_EXHAUSTED,
                    f"uid {caller.uid} already has {have} attachments, the policy's limit "
                    "(detach one, or ask the administrator to raise it)",
                    **self._limit_rule("attachments_per_user", limit),
                )
            self._counts.attachments[caller.uid] = have + 1

    def _unreserve_attachment(self, uid: int) -> None:
        with self._lock:
            n = self._counts.attachments.get(uid, 0) - 1
            if n > 0:
                self._counts.attachments[uid] = n
            else:
                self._counts.attachments.pop(uid, None)

    def _create(
        self, caller: Caller, res: _Resolved, target: _Target, key: InstanceKey
    ) -> SharedInstance:
        entry = res.entry
        params = bpfinstance.Params(
            uid=caller.uid if res.scope == "self" and entry.uid_knob else None,
            pid=target.pid if entry.pid_knob else None,
            library=target.library,
            functions=target.functions,
        )
        try:
            spec, variant = bpfinstance.prepare(
                entry,
                res.data,
                params,
                exists=self._event_exists,
                read_format=self._read_format,
            )
        except ObjectError as e:
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"object cannot be used: {e}") from None
        except bpfinstance.Unavailable as e:
            raise BrokerError(pb.ERROR_UNAVAILABLE, str(e)) from None
        except tracefs.TracefsError as e:
            raise BrokerError(pb.ERROR_UNAVAILABLE, str(e)) from None
        except (KeyError, ValueError, TypeError) as e:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r}: the object does not match its catalog entry: {e}",
            ) from None
        visible_specs = []
        for m in entry.visible_maps:
            ms = spec.maps.get(m.name)
            if ms is None:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"program {entry.name!r}: catalog map {m.name!r} is not in the object",
                )
            visible_specs.append(ms)
        # Frozen: no fd of a map a client may hold can write it, not even one
        # reopened from a bpffs pin (the program still writes). A ring buffer
        # cannot be frozen; each attachment gets its own (InstanceKey.unique).
        read_only = [ms.real_name for ms in visible_specs if ms.map_type != C.MapType.RINGBUF]
        charge = self._charge_maps(caller, entry, visible_specs)
        try:
            inst = self._load_and_attach(entry, variant, spec, read_only, target, params)
        except BaseException:
            self._map_budget.refund(charge)  # its maps are gone with the failed load
            raise
        visible = {m.name: inst.obj.maps[m.name] for m in entry.visible_maps}
        return SharedInstance(key, entry, spec, inst, visible, charge.nbytes)

    def _load_and_attach(
        self,
        entry: Program,
        variant: str | None,
        spec: ObjectSpec,
        read_only: list[str],
        target: _Target,
        params: bpfinstance.Params,
    ) -> bpfinstance.Instance:
        wanted = list(dict.fromkeys(a.program for a in entry.attach_for(variant)))
        try:
            obj = load(spec, programs=wanted, read_only=read_only)
        except LoadError as e:
            raise BrokerError(pb.ERROR_KERNEL, str(e)) from None
        inst = bpfinstance.Instance(entry, variant, obj, functions=target.functions)
        try:
            self._attach_all(inst, entry, variant, target, params)
            if target.pid_handle is not None and not target.pid_handle.alive():
                raise BrokerError(
                    pb.ERROR_NOT_FOUND, f"process {target.pid} exited while attaching"
                )
        except BaseException:
            inst.close()
            raise
        return inst

    def _charge_maps(self, caller: Caller, entry: Program, specs: list[MapSpec]) -> budget.Charge:
        """Charge a new instance's client-visible maps to the caller's map budget:
        a client may keep them alive (fd, bpffs pin) long after detaching."""
        ncpus = bpfsys.possible_cpus()
        need = sum(
            budget.map_bytes(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, ncpus)
            for m in specs
        )
        limit = self.policy.limits.map_bytes_per_user
        window = self.policy.limits.map_bytes_window_seconds
        try:
            return self._map_budget.charge(caller.uid, need, limit, window)
        except budget.OverBudget as e:
            if e.retry_after is None:
                msg = (
                    f"program {entry.name!r} needs {budget.human(need)} of BPF maps, more than "
                    f"the policy lets one user create in {window} s ({budget.human(limit)}): "
                    "ask the administrator to raise map_bytes_per_user"
                )
            else:
                msg = (
                    f"uid {caller.uid} had the broker create {budget.human(e.used)} of BPF maps "
                    f"in the last {window} s; program {entry.name!r} needs "
                    f"{budget.human(need)} more, over the policy's limit of "
                    f"{budget.human(limit)} per {window} s (a client can keep a map alive after "
                    f"detaching). Retry in {max(1, round(e.retry_after))} s, or ask the "
                    "administrator to raise map_bytes_per_user"
                )
            raise BrokerError(
                pb.ERROR_RESOURCE_EXHAUSTED, msg, **self._limit_rule("map_bytes_per_user", limit)
            ) from None

    def _attach_all(
        self,
        inst: bpfinstance.Instance,
        entry: Program,
        variant: str | None,
        target: _Target,
        params: bpfinstance.Params,
    ) -> None:
        # Uprobes go through the fd the policy check looked at: no path race.
        library_path = f"/proc/self/fd/{target.library_fd}" if target.library_fd >= 0 else None
        for a in entry.attach_for(variant):
            try:
                bpfinstance.attach_entry(inst, a, params, library_path)
            except tracefs.TracefsError as e:
                raise BrokerError(pb.ERROR_UNAVAILABLE, str(e)) from None
            except (LookupError, ValueError) as e:  # symbol not found and friends
                raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"cannot attach: {e}") from None
            except OSError as e:
                raise BrokerError(pb.ERROR_KERNEL, f"attaching {a.program!r} failed: {e}") from None

    def attach(
        self, caller: Caller, owner: Owner, req: pb.AttachRequest, fds: Sequence[int] = ()
    ) -> tuple[pb.AttachReply, list[int]]:
        """Attach; fds are those that came with a Unix-socket request (the caller
        keeps and closes them; the broker duplicates what it needs)."""
        started = time.perf_counter()  # the audit record says how long attaching took
        name = req.name if req.WhichOneof("program") == "name" else None
        fields: dict[str, object] = {"program": name}
        try:
            self._check_owner(caller, owner)
            res = self._resolve(caller, req, fields)
            fields.update(program=res.entry.name, sha256=res.sha256, scope=res.scope)
            self._audit(res.data, res.sha256, res.entry.name)
            target = self._check_params(caller, res, req.params, fds)
            try:
                events = any(m.show == "events" for m in res.entry.visible_maps)
                key = InstanceKey(
                    sha256=res.sha256,
                    scope=res.scope,
                    uid=caller.uid if res.scope == "self" else None,
                    pid=target.pid,
                    library=target.library,
                    functions=target.functions,
                    unique=next(self._unique) if events else None,
                )
                self._reserve_attachment(caller)
                try:
                    shared, joined = self._registry.acquire(
                        key, lambda: self._create(caller, res, target, key)
                    )
                except BaseException:
                    self._unreserve_attachment(caller.uid)
                    raise
            finally:
                target.close()
            att = Attachment(
                id=next(self._attachment_ids),
                owner=owner,
                uid=caller.uid,
                program=res.entry.name,
                sha256=res.sha256,
                scope=res.scope,
                key=key,
                shared=shared,
            )
            with owner.lock:
                if not owner.closed:
                    owner.attachments[att.id] = att
                    added = True
                else:
                    added = False
            if not added:  # the session closed while we loaded
                self._release(att)
                raise BrokerError(pb.ERROR_NOT_FOUND, "the session closed during attach")
            reply, fds = self._describe(caller, att, joined)
        except BrokerError as e:
            raise self._fail("attach", caller, e, **fields) from None
        except Exception as e:  # a broker bug: report it, keep serving
            err = BrokerError(pb.ERROR_INTERNAL, f"internal error: {type(e).__name__}: {e}")
            raise self._fail("attach", caller, err, **fields) from e
        self._log(
            "attach",
            caller,
            "ok",
            attachment_id=att.id,
            shared=joined,
            map_bytes=0 if joined else shared.map_bytes,  # charged to the map budget
            rule=res.rule,
            via=res.via,
            prog_ids=[p.prog_id for p in reply.programs],
            elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
            **fields,
        )
        return reply, fds

    def _describe(
        self, caller: Caller, att: Attachment, joined: bool
    ) -> tuple[pb.AttachReply, list[int]]:
        shared = att.shared
        entry = shared.entry
        spec = shared.spec
        pass_fds = caller.transport == "unix"
        fds: list[int] = []
        reply = pb.AttachReply(
            attachment_id=att.id,
            program=entry.name,
            sha256=att.sha256,
            scope=_SCOPE_ENUMS[att.scope],
            shared=joined,
            btf=spec.btf_bytes,
            possible_cpus=bpfsys.possible_cpus(),
        )
        for m in entry.visible_maps:
            kmap = shared.visible[m.name]
            d = _catalog_map_description(m)
            d.map_type = kmap.map_type
            d.key_size = kmap.key_size
            d.value_size = kmap.value_size
            d.max_entries = kmap.max_entries
            d.per_cpu = kmap.percpu
            d.btf_key_type_id = kmap.key_type_id
            d.btf_value_type_id = kmap.value_type_id
            if m.event_type and spec.btf is not None:
                d.btf_event_type_id = spec.btf.find(m.event_type, KIND_STRUCT) or 0
            if pass_fds:
                d.fd_index = len(fds)
                fds.append(kmap.fileno())
            reply.maps.append(d)
        for pname, prog in shared.obj.programs.items():
            reply.programs.append(
                pb.ProgramDescription(
                    name=pname,
                    section=prog.spec.section,
                    prog_type=prog.spec.prog_type,
                    prog_id=prog.id,
                    fd_index=-1,  # a program fd would let its holder attach it elsewhere
                )
            )
        return reply, fds

    # ------------------------------------------------------------ Detach

    def detach(self, caller: Caller, owner: Owner, req: pb.DetachRequest) -> pb.DetachReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id}
        try:
            self._check_owner(caller, owner)
            with owner.lock:
                att = owner.attachments.pop(req.attachment_id, None)
            if att is None:
                raise BrokerError(
                    pb.ERROR_NOT_FOUND, f"no attachment {req.attachment_id} in this session"
                )
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            unloaded = self._release(att)
        except BrokerError as e:
            raise self._fail("detach", caller, e, **fields) from None
        self._log("detach", caller, "ok", unloaded=unloaded, **fields)
        return pb.DetachReply(unloaded=unloaded)

    # ------------------------------------------------------------ ReadMap

    def _visible_map(self, att: Attachment, name: str) -> tuple[Map, str]:
        entry = att.shared.entry
        if not name:
            names = [m.name for m in entry.visible_maps if m.show != "events"]
            if len(names) != 1:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"name the map to read: {', '.join(names) or 'none is readable'}",
                )
            name = names[0]
        kmap = att.shared.visible.get(name)
        if kmap is None:
            raise BrokerError(
                pb.ERROR_NOT_FOUND,
                f"program {entry.name!r} has no client-visible map {name!r} (visible: "
                f"{', '.join(att.shared.visible) or 'none'})",
            )
        return kmap, name

    def read_map(self, caller: Caller, owner: Owner, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id, "map": req.map}
        try:
            self._check_owner(caller, owner)
            att = self._attachment(owner, req.attachment_id)
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            kmap, _ = self._visible_map(att, req.map)
            if kmap.map_type in (C.MapType.RINGBUF, C.MapType.PERF_EVENT_ARRAY):
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    f"map {req.map!r} is an event stream: use StreamEvents",
                )
            reply = self._read_page(kmap, req.max_entries, bytes(req.cursor))
        except BrokerError as e:
            raise self._fail("read_map", caller, e, **fields) from None
        self._log("read_map", caller, "ok", entries=len(reply.entries), **fields)
        return reply

    def _read_page(self, kmap: Map, max_entries: int, cursor: bytes) -> pb.ReadMapReply:
        limit = self.policy.limits.read_map_entries
        per_entry = kmap.key_size + kmap.buf_size + 16 + (8 * kmap.ncpus if kmap.percpu else 0)
        count = max(1, min(max_entries or limit, limit, READ_MAP_MAX_BYTES // per_entry))
        try:
            page = kmap.read_page(count, cursor)
        except CursorError:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT, "bad ReadMap cursor: pass next_cursor unchanged"
            ) from None
        except bpfsys.BpfError as e:
            raise BrokerError(pb.ERROR_KERNEL, f"reading map: {e}") from None
        reply = pb.ReadMapReply(next_cursor=page.cursor)
        for k, v in page.items:
            if isinstance(v, list):
                reply.entries.append(pb.MapEntry(key=k, per_cpu=v))
            else:
                reply.entries.append(pb.MapEntry(key=k, value=v))
        return reply

    # ------------------------------------------------------------ StreamEvents

    def stream_events(
        self,
        caller: Caller,
        owner: Owner,
        req: pb.StreamEventsRequest,
        cancelled: Callable[[], bool],
    ) -> Iterator[pb.EventBatch]:
        """The attachment's ring buffer, consumed by the broker (gRPC).

        Over the Unix socket the client holds the ring buffer's fd and is its
        only consumer, so this answers INVALID_ARGUMENT there. Requests are
        checked by this call (BrokerError raises here, not from next()); the
        iterator then yields batches until max_events, detach (a last batch
        with end = true) or cancelled() (no last batch).
        """
        fields: dict[str, object] = {"attachment_id": req.attachment_id, "map": req.map}
        try:
            self._check_owner(caller, owner)
            if caller.transport == "unix":
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    "over the Unix socket, read events from the ring-buffer fd that came "
                    "with AttachReply (MapDescription.fd_index); StreamEvents is for gRPC",
                )
            att = self._attachment(owner, req.attachment_id)
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            rings = [m.name for m in att.shared.entry.visible_maps if m.show == "events"]
            name = req.map or (rings[0] if len(rings) == 1 else "")
            if name not in rings:
                raise BrokerError(
                    pb.ERROR_NOT_FOUND,
                    f"program {att.program!r} has no event map {req.map!r} "
                    f"(event maps: {', '.join(rings) or 'none'})",
                )
            fields["map"] = name
            with owner.lock:
                if att.streaming:
                    raise BrokerError(
                        pb.ERROR_RESOURCE_EXHAUSTED,
                        f"attachment {att.id} is already streaming (one consumer per ring buffer)",
                    )
                att.streaming = True
        except BrokerError as e:
            raise self._fail("stream_events", caller, e, **fields) from None
        self._log("stream_events", caller, "ok", **fields)
        return self._events(att, att.shared.visible[name], req.max_events, cancelled)

    def _events(
        self, att: Attachment, kmap: Map, max_events: int, cancelled: Callable[[], bool]
    ) -> Iterator[pb.EventBatch]:
        try:
            ring = RingBuffer(kmap.fileno(), kmap.max_entries)
        except OSError as e:
            att.streaming = False
            raise BrokerError(pb.ERROR_KERNEL, f"cannot map the ring buffer: {e}") from None
        seq = 0
        try:
            while True:
                if cancelled() or att.closed:
                    if att.closed and not cancelled():
                        yield pb.EventBatch(end=True, lost=ring.discarded)
                    return
                records = ring.poll(EVENT_POLL_SECONDS)
                while records:
                    batch = pb.EventBatch()
                    size = 0
                    while records and len(batch.events) < EVENT_BATCH_RECORDS:
                        if size >= EVENT_BATCH_BYTES:
                            break
                        rec = records.pop(0)
                        seq += 1
                        size += len(rec)
                        batch.events.append(pb.Event(seq=seq, data=rec))
                        if max_events and seq >= max_events:
                            batch.end = True
                            break
                    batch.lost = ring.discarded
                    yield batch
                    if batch.end:
                        return
        finally:
            ring.close()
            att.streaming = False

    # ------------------------------------------------------------ Stats

    def stats(self, caller: Caller, owner: Owner, req: pb.StatsRequest) -> pb.StatsReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id}
        try:
            self._check_owner(caller, owner)
            if req.attachment_id:
                atts = [self._attachment(owner, req.attachment_id)]
            else:
                with owner.lock:
                    atts = [a for a in owner.attachments.values() if not a.closed]
            reply = pb.StatsReply(
                stats_enabled=_read_sysctl("/proc/sys/kernel/bpf_stats_enabled") == "1"
            )
            for att in atts:
                for pname, prog in att.shared.obj.programs.items():
                    try:
                        info = bpfsys.prog_info(prog.fd)
                    except (OSError, ValueError):
                        continue  # detached meanwhile
                    reply.programs.append(
                        pb.ProgramStats(
                            attachment_id=att.id,
                            program=att.program,
                            function=pname,
                            prog_id=info.id,
                            run_cnt=info.run_cnt,
                            run_time_ns=info.run_time_ns,
                            recursion_misses=info.recursion_misses,
                        )
                    )
        except BrokerError as e:
            raise self._fail("stats", caller, e, **fields) from None
        self._log("stats", caller, "ok", programs=len(reply.programs), **fields)
        return reply

    # ------------------------------------------------------------ IssueToken

    def issue_token(
        self, caller: Caller, owner: Owner, req: pb.IssueTokenRequest
    ) -> pb.IssueTokenReply:
        try:
            self._check_owner(caller, owner)
            if caller.transport != "unix":
                raise BrokerError(
                    pb.ERROR_PERMISSION_DENIED,
                    "tokens are issued over the Unix control socket only",
                )
            if self.tokens is None:
                raise BrokerError(
                    pb.ERROR_UNAVAILABLE,
                    "this broker serves no gRPC (start it with --grpc) so tokens are useless",
                )
            cap = self.policy.limits.token_ttl_seconds
            ttl = min(req.ttl_seconds or cap, cap)
            token, expires = self.tokens.issue(caller, ttl)
        except BrokerError as e:
            raise self._fail("issue_token", caller, e) from None
        self._log("issue_token", caller, "ok", ttl_seconds=ttl, expires_unix=expires)
        return pb.IssueTokenReply(token=token, expires_unix=expires)
