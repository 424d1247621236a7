"""What a policy is made of: entries, limits, certificate mappings, and the
Decision it gives. gfxbpf.broker.policy.rules (which decides) and
gfxbpf.broker.policy.fileformat (which reads the TOML) both build on these."""

from __future__ import annotations

import dataclasses
import grp
import json
import pwd
from dataclasses import dataclass

from gfxbpf.bpf.consts import SELF, Scope
from gfxbpf.tomlcheck.checks import FileProblems

WILDCARD = "*"
# Highest sampling frequency anyone may ask for: the kernel's own default
# ceiling (kernel.perf_event_max_sample_rate); a policy entry may set less.
MAX_FREQUENCY = 100_000
# Longest minimum wait a policy may set for offcpu (10 s), in microseconds.
MAX_MIN_BLOCK_US = 10_000_000
MAX_PYTHON_FRAMES = 128  # gfx_python.h GFX_PY_MAX_FRAMES


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
    audit_lines_per_second: int = 20  # per uid, op, result, program (burst as many), then summaries
    # gRPC (issue #16): calls are refused over this many in flight per uid, streams included,
    # and a call whose request message does not follow its headers this soon is ended.
    grpc_calls_per_user: int = 32
    grpc_request_seconds: int = 10
    # gRPC connections (issue #26), on a unix: listener: refused at accept past these
    # (per SO_PEERCRED uid, and in all), closed when silent for grpc_connect_seconds
    # after connecting or without a call for grpc_idle_seconds (read at start only).
    grpc_connections_per_user: int = 16
    grpc_connections_total: int = 256
    grpc_connect_seconds: int = 10
    grpc_idle_seconds: int = 60
    # Kernel bytes of the maps the broker creates for a user (broker/access/budget.py),
    # broker-only ones included: those one user's maps hold at once, attached,
    # parked warm or kept alive through fds after detaching, and those created
    # per window (churn). 256 MiB: ten instances of any catalog program at once
    # with 256 possible CPUs (per-CPU maps grow with them; the largest,
    # memstacks, 22.2 MiB there), attachments_per_user of any on 16 CPUs.
    map_bytes_per_user: int = 256 * 1024 * 1024
    map_churn_bytes_per_user: int = 1024 * 1024 * 1024
    map_bytes_window_seconds: int = 600
    # The broker's CPU time loading programs for one user per window (the
    # verifier's work, failed loads included: broker/access/loadcpu.py).
    load_cpu_seconds_per_user: int = 20
    load_cpu_window_seconds: int = 60


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))


@dataclass(frozen=True)
class ProgramEntry:
    """One [[program]] table, validated."""

    index: int  # 1-based position among the [[program]] tables
    name: str
    sha256: str  # lower-case hex
    users: tuple[str | int, ...] = ()
    groups: tuple[str | int, ...] = ()
    scopes: tuple[Scope, ...] = (SELF,)
    libraries: tuple[str, ...] = ()
    functions: tuple[str, ...] = (WILDCARD,)
    description: str = ""
    source: str = "<policy>"  # the file it came from
    max_frequency: int | None = None  # perf_event sampling cap in Hz (None: no cap)
    # Load even if the kernel refuses the object's BTF (maps lose their types,
    # subprograms their names); without it such a load fails with the BTF log.
    allow_no_btf: bool = False
    # Stack copies (stackcopy, ustackcopy, memstacks, offcpu, cudakernels): user
    # stack bytes per record, at most catalog/stack_copies.py's (None: 8 KiB)
    max_stack_bytes: int | None = None
    # offcpu: the shortest wait (microseconds) a client may have recorded
    # (None: broker/request/params.py's MIN_BLOCK_FLOOR_US)
    min_block_us: int | None = None
    # Python frame walkers (stackcopy, ustackcopy): frames per stack (None: 64)
    max_python_frames: int | None = None

    @property
    def label(self) -> str:
        return f"[[program]] #{self.index} {json.dumps(self.name)}"

    @property
    def where(self) -> str:
        return f"{self.source} {self.label}"


def labels(entries: list[ProgramEntry]) -> str:
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
    scope: Scope | None = None  # the scope granted (resolves an unspecified scope)
    reason: str = ""  # for the caller: what they lack
    ref: str = ""  # for the caller: which rule, e.g. '[[program]] #2 "syscount"'
    refusal: str = ""  # a Refusal kind, when refused


class PolicyError(FileProblems):
    """The policy file is unreadable or invalid. .problems lists every problem found."""

    @property
    def path(self) -> str:
        return self.source


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
