"""Attach parameters checked against the program and the policy: pid ownership
(by pidfd), the uprobe library (never a file the caller could not open) and
function names."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from dataclasses import dataclass

from gfxbpf.bpf import symbols
from gfxbpf.bpf.consts import JOB, SELF
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.policy.model import MAX_FREQUENCY
from gfxbpf.broker.policy.pathglob import is_plain_path
from gfxbpf.broker.policy.rules import Policy, ProgramEntry
from gfxbpf.broker.request import libraries
from gfxbpf.broker.request.pidcheck import NoSuchProcess, PidError, PidHandle, verify_owner
from gfxbpf.broker.request.pyfiles import check_python
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.broker.request.slurmjob import JobCgroup, check_job
from gfxbpf.catalog import entries, function_tables
from gfxbpf.catalog.instance import DEFAULT_FREQUENCY
from gfxbpf.catalog.pymaps import PythonFile
from gfxbpf.catalog.stack_copies import DEFAULT_STACK_BYTES, most_stack_bytes
from gfxbpf.proto import gfxbpf_pb2 as pb

MAX_FUNCTIONS = 64  # ucalls keys its maps by function index (bpf cookie)
# offcpu: the shortest wait recorded when the request names none (1 ms: a
# few scheduler ticks' worth of waits on a busy host, and lock hand-offs
# below it are noise in a flame graph), and the least any request may ask
# where the policy sets no min_block_us (each kept wait is a ring record).
DEFAULT_MIN_BLOCK_US = 1000
MIN_BLOCK_FLOOR_US = 100
MAX_SYMBOL_LEN = 512
_UPROBE_KINDS = ("uprobe", "uretprobe")


@dataclass
class Target:
    """Checked attach parameters; close() releases the fds it holds."""

    pid: int | None = None
    library: str | None = None  # real path
    library_fd: int = -1  # open fd on it, for a race-free uprobe path
    functions: tuple[str, ...] = ()
    pid_handle: PidHandle | None = None
    cookies: tuple[int, ...] = ()  # function-table programs: one bpf cookie per function
    skipped: tuple[str, ...] = ()  # function-table programs: "name: why" not probed
    symbols: str = ""  # function-table programs: "cached" or "parsed" (the audit log says)
    frequency: int | None = None  # perf_event sampling, Hz (None: the program's default)
    children: bool = False  # the pid's descendants too (gfx_tree.h)
    stack_bytes: int | None = None  # stack copy size (None: the object's default, 8 KiB)
    min_block_us: int | None = None  # offcpu: shortest wait kept (None: no such knob)
    sample_bytes: int | None = None  # memstacks: bytes per recorded allocation (None: all)
    python_files: tuple[PythonFile, ...] = ()  # interpreters whose frames to walk
    python_frames: int | None = None  # Python frames a stack (None: the object's 64)
    job: JobCgroup | None = None  # scope job: the Slurm job's cgroup on this node

    @property
    def library_path(self) -> str | None:
        """The path the kernel attaches uprobes by: the fd the policy check looked at."""
        return f"/proc/self/fd/{self.library_fd}" if self.library_fd >= 0 else None

    def close(self) -> None:
        if self.library_fd >= 0:
            os.close(self.library_fd)
            self.library_fd = -1
        if self.pid_handle is not None:
            self.pid_handle.close()
            self.pid_handle = None


def check_params(
    policy: Policy,
    caller: Caller,
    res: Resolved,
    params: pb.AttachParams,
    fds: Sequence[int] = (),
) -> Target:
    """The checked Target (the caller closes it), or BrokerError."""
    t = Target()
    try:
        t.pid, t.pid_handle = _check_pid(caller, res, params.pid)
        if res.entry.function_table:
            _refuse_client_functions(res, params)
            t.library_fd, t.library = _open_library(policy, caller, res.policy_entry, params, fds)
            t.functions, t.cookies, t.skipped, t.symbols = _table_functions(policy, res, t)
        elif any(a.kind in _UPROBE_KINDS for a in res.entry.attach):
            t.functions = _check_functions(res, params)
            t.library_fd, t.library = _open_library(policy, caller, res.policy_entry, params, fds)
            _check_functions_allowed(policy, res.policy_entry, t.functions)
        elif any(a.kind == "usdt" for a in res.entry.attach):
            _check_usdt_request(res, params)
            t.library_fd, t.library = _open_library(policy, caller, res.policy_entry, params, fds)
        elif params.library or params.HasField("library_fd_index") or params.functions:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {res.entry.name!r} attaches no uprobes: it takes no library or functions",
            )
        t.frequency = _check_frequency(res, params.frequency)
        t.children = _check_children(res, params, t.pid)
        t.stack_bytes = _check_stack_bytes(res, params.stack_bytes)
        t.min_block_us = _check_min_block(res, params.min_block_us)
        t.sample_bytes = _check_sample_bytes(res, params.sample_bytes)
        t.python_files, t.python_frames = check_python(res, params)
        t.job = _check_job(caller, res, params.job)
        return t
    except BaseException:
        t.close()
        raise


def _check_stack_bytes(res: Resolved, asked: int) -> int | None:
    """The stack copy size: the caller's, else the policy's max_stack_bytes
    (the policy decides how deep a copy its users get by default), else the
    object's 8 KiB (None: the object's default stands)."""
    entry, pe = res.entry, res.policy_entry
    if not entry.stack_bytes_knob:
        if asked:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r} copies no stack: it takes no stack_bytes",
            )
        return None
    most = most_stack_bytes(entry.name)
    if asked > most:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"stack_bytes {asked} is above the {most} bytes {entry.name!r} can copy",
        )
    cap = pe.max_stack_bytes
    if asked > DEFAULT_STACK_BYTES and cap is None:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"copying {asked} bytes of stack is above the {DEFAULT_STACK_BYTES}-byte default "
            f"for {entry.name!r}, and the policy sets no max_stack_bytes that allows more: "
            f"ask the administrator, or for --stack-bytes {DEFAULT_STACK_BYTES} or less",
            rule=f"{pe.label}: max_stack_bytes",
            audit_rule=f"{pe.where}: max_stack_bytes unset (default {DEFAULT_STACK_BYTES})",
        )
    if cap is not None and asked > cap:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"copying {asked} bytes of stack is above the {cap} the policy allows you for "
            f"{entry.name!r}: ask for --stack-bytes {cap} or less",
            rule=f"{pe.label}: max_stack_bytes",
            audit_rule=f"{pe.where}: max_stack_bytes = {cap}",
        )
    return asked or cap


def _check_pid(caller: Caller, res: Resolved, pid: int) -> tuple[int | None, PidHandle | None]:
    entry = res.entry
    if pid < 0:
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"pid {pid} is invalid")
    if not pid:
        if any(p.name == "pid" and p.required for p in entry.parameters):
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT, f"program {entry.name!r} needs a pid (params.pid)"
            )
        return None, None
    if not entry.pid_knob and not any(a.kind in _UPROBE_KINDS for a in entry.attach):
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"program {entry.name!r} takes no pid")
    if res.scope not in (SELF, JOB):
        return pid, None
    try:
        return pid, verify_owner(pid, caller.uid)
    except NoSuchProcess as e:
        raise BrokerError(pb.ERROR_NOT_FOUND, str(e)) from None
    except PidError as e:
        raise BrokerError(pb.ERROR_PERMISSION_DENIED, str(e)) from None


def _check_job(caller: Caller, res: Resolved, job: str) -> JobCgroup | None:
    """Scope job's job, checked with Slurm and this node's cgroups (never the client)."""
    if res.scope != JOB:
        if job:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT, f"params.job is for scope job, not {res.scope}"
            )
        return None
    if not job:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, "scope job needs the Slurm job id (params.job)"
        )
    return check_job(caller, job)


def _check_children(res: Resolved, params: pb.AttachParams, pid: int | None) -> bool:
    if not params.children:
        return False
    if not res.entry.children_knob:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} does not follow child processes (params.children)",
        )
    if pid is None:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            "params.children follows the descendants of params.pid: give a pid",
        )
    return True


# memstacks' sampling interval: its random draw is modulo 2 * interval in 32 bits.
MAX_SAMPLE_BYTES = 1 << 30


def _check_sample_bytes(res: Resolved, asked: int) -> int | None:
    """memstacks' sampling interval in bytes (None: every allocation, the object's default)."""
    if not asked:
        return None
    if not res.entry.sample_bytes_knob:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} samples no allocations: it takes no sample_bytes",
        )
    if asked > MAX_SAMPLE_BYTES:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, f"sample_bytes {asked} is above {MAX_SAMPLE_BYTES}"
        )
    return asked


def _check_min_block(res: Resolved, asked: int) -> int | None:
    """offcpu's shortest recorded wait: the request's (default 1 ms), never below
    the policy entry's min_block_us (or the broker's own floor)."""
    if not res.entry.min_block_knob:
        if asked:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {res.entry.name!r} records no waits: it takes no min_block_us",
            )
        return None
    floor = res.policy_entry.min_block_us or MIN_BLOCK_FLOOR_US
    value = asked or max(DEFAULT_MIN_BLOCK_US, floor)
    if value < floor:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"recording waits from {value} us is below the {floor} us the policy allows you "
            f"for program {res.entry.name!r}",
        )
    return value


def _check_frequency(res: Resolved, frequency: int) -> int | None:
    """The sampling frequency of a perf_event program, within the policy's cap."""
    entry, pe = res.entry, res.policy_entry
    if not any(a.kind == "perf_event" for a in entry.attach):
        if frequency:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r} does not sample: it takes no frequency",
            )
        return None
    freq = frequency or DEFAULT_FREQUENCY
    cap = pe.max_frequency
    if cap is not None and freq > cap:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"sampling at {freq} Hz is above the {cap} Hz the policy allows you for "
            f"{entry.name!r}: ask for --frequency {cap} or less",
            rule=f"{pe.label}: max_frequency",
            audit_rule=f"{pe.where}: max_frequency = {cap}",
        )
    if freq > MAX_FREQUENCY:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"sampling at {freq} Hz: at most {MAX_FREQUENCY} Hz (the kernel's ceiling)",
        )
    return freq


def _check_functions(res: Resolved, params: pb.AttachParams) -> tuple[str, ...]:
    """The function names of a uprobe program's request, checked for form."""
    funcs = tuple(params.functions)
    wants_library = bool(params.library) or params.HasField("library_fd_index")
    if not wants_library or not funcs:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} needs params.library and params.functions",
        )
    if len(funcs) > MAX_FUNCTIONS:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, f"{len(funcs)} functions; at most {MAX_FUNCTIONS}"
        )
    for fn in funcs:
        if not fn or len(fn) > MAX_SYMBOL_LEN or "\0" in fn:
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"bad function name {fn!r}")
    return funcs


def _check_usdt_request(res: Resolved, params: pb.AttachParams) -> None:
    """A USDT program's probes are the catalog's: the request names the library only."""
    if params.functions:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} attaches to the catalog's USDT probes: "
            "send params.library only, no functions",
        )
    if not (params.library or params.HasField("library_fd_index")):
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, f"program {res.entry.name!r} needs params.library"
        )


def _refuse_client_functions(res: Resolved, params: pb.AttachParams) -> None:
    if params.functions:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} probes a fixed table of functions "
            f"({res.entry.function_table!r}): send params.library only, no functions",
        )
    if not (params.library or params.HasField("library_fd_index")):
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, f"program {res.entry.name!r} needs params.library"
        )


def _table_functions(
    policy: Policy, res: Resolved, t: Target
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...], str]:
    """(functions, cookies, skipped, "cached" or "parsed") of a function-table
    program in t's library.

    Functions the library does not define, and those the policy's `functions`
    globs leave out, are skipped and reported, not an error; none at all is.
    The symbol index is cached per file (bpf/symbols.py), so the attach that
    follows resolves from memory.
    """
    assert res.entry.function_table and t.library_path
    machine = os.uname().machine
    if machine not in function_tables.MACHINES:
        raise BrokerError(
            pb.ERROR_UNAVAILABLE,
            f"program {res.entry.name!r} reads function arguments from "
            f"{'/'.join(function_tables.MACHINES)} registers; this host is {machine}",
        )
    try:
        index, hit = symbols.cached_index(t.library_path)
    except symbols.SymbolError as e:
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"library {t.library}: {e}") from None
    names: list[str] = []
    cookies: list[int] = []
    skipped: list[str] = []
    for i, fn in enumerate(entries.function_table(res.entry.function_table)):
        if not index.has(fn.name):
            skipped.append(f"{fn.name}: not in {os.path.basename(t.library or '')}")
        elif not policy.function_allowed(res.policy_entry, fn.name):
            skipped.append(f"{fn.name}: not allowed by the policy's functions")
        else:
            names.append(fn.name)
            cookies.append(function_tables.cookie(i, fn))
    if not names:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"program {res.entry.name!r} has nothing to probe in {t.library} (is it the "
            f"right library?): {'; '.join(skipped[:4])}" + ("; …" if len(skipped) > 4 else ""),
        )
    return tuple(names), tuple(cookies), tuple(skipped), "cached" if hit else "parsed"


def _check_functions_allowed(policy: Policy, pe: ProgramEntry, funcs: tuple[str, ...]) -> None:
    for fn in funcs:
        if not policy.function_allowed(pe, fn):
            raise BrokerError(
                pb.ERROR_PERMISSION_DENIED,
                f"function {fn!r} is not allowed for you in this library",
                rule=f"{pe.label}: functions",
                audit_rule=f"{pe.where}: functions = {list(pe.functions)}",
            )


def _library_refused(entry: ProgramEntry, shown: str) -> BrokerError:
    """The one answer for a library the policy does not allow (before or after opening)."""
    return BrokerError(
        pb.ERROR_PERMISSION_DENIED,
        f"library {shown} is not allowed for you (`gfxclient info {entry.name}` lists "
        "the libraries you may trace)",
        rule=f"{entry.label}: libraries",
        audit_rule=f"{entry.where}: libraries = {list(entry.libraries)}",
    )


def _open_library(
    policy: Policy,
    caller: Caller,
    entry: ProgramEntry,
    params: pb.AttachParams,
    fds: Sequence[int],
) -> tuple[int, str]:
    """The uprobe target as (fd the broker owns, real path), judged by the policy.

    Never a file the caller could not open themselves (broker/request/libraries.py):
    over the Unix socket the client passes the fd; over gRPC the path is
    checked against the policy's globs before the broker touches the file
    system, then opened only if the caller could have opened it.
    """
    if caller.transport == "unix":
        fd = _passed_library(params, fds)
    else:
        fd = _library_as_caller(policy, caller, entry, params)
    try:
        try:
            real = libraries.from_fd(fd)
        except libraries.LibraryError as e:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"library {params.library or '(passed fd)'}: {e}",
            ) from None
        if not policy.library_allowed(entry, real):
            named = params.library
            raise _library_refused(entry, f"{named} ({real})" if named and named != real else real)
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def _passed_library(params: pb.AttachParams, fds: Sequence[int]) -> int:
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
    policy: Policy, caller: Caller, entry: ProgramEntry, params: pb.AttachParams
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
    if not policy.library_named(entry, lib):
        raise _library_refused(entry, lib)
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
