"""Run a catalog program: fill its knobs, load it, attach it. No policy here.

The broker decides who may run what with which scope; this module only does
what a catalog entry says: pick the variant whose tracepoints exist, write
tracepoint field offsets from the live `format` files and the scope knobs
into `.rodata`, load, and attach every program of that variant.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gfxbpf.bpf.consts import BPF_TRACE_UPROBE_MULTI
from gfxbpf.bpf.errors import GfxBpfError, HostError, InputError
from gfxbpf.bpf.externs import kconfig
from gfxbpf.bpf.kernel import vmlinux as kernel_btf
from gfxbpf.bpf.link import attach as bpfattach
from gfxbpf.bpf.link import perf, tracefs, tracing, usdt
from gfxbpf.bpf.loader import LoadedObject, load
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog import pymaps
from gfxbpf.catalog.entries import FIELD_ABSENT, Attach, Program

# What a user must do to make a tracepoint system appear (for error messages).
_SYSTEM_HINTS = {
    "i915": "the i915 driver must be loaded (an Intel GPU, modprobe i915)",
    "xe": "the xe driver must be loaded (an Intel GPU, modprobe xe)",
    "amdgpu": "the amdgpu driver must be loaded (an AMD GPU)",
    "gpu_scheduler": "a driver that uses the DRM GPU scheduler must be loaded (amdgpu, xe, ...)",
    "drm": "a DRM driver must be loaded",
    "nvidia": "the NVIDIA kernel driver must be loaded (an NVIDIA GPU, modprobe nvidia)",
}


class Unavailable(HostError):
    """The program cannot run on this host; the message says why and what to do."""


class FieldMissing(Unavailable):
    """A tracepoint on this kernel lacks a field the program reads."""


class ParameterError(ValueError, InputError):
    """Attach-time parameters do not fit the program."""


class CatalogMismatch(ValueError, InputError):
    """The object lacks, or sizes differently, a knob or program its catalog entry names."""


@contextmanager
def _must_match_catalog() -> Iterator[None]:
    """ObjectSpec answers a variable or program it lacks (or cannot take the value
    for) with a plain KeyError, TypeError or ValueError; here that means the object
    does not match its catalog entry. The message stays the original's."""
    try:
        yield
    except GfxBpfError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogMismatch(str(e)) from e


def _set_knob(spec: ObjectSpec, name: str, value: int) -> None:
    with _must_match_catalog():
        spec.set_variable(name, value)


@dataclass(frozen=True)
class Params:
    """Attach-time settings. uid/pid go into the entry's uid_knob/pid_knob."""

    uid: int | None = None
    pid: int | None = None
    library: str | None = None
    functions: tuple[str, ...] = ()
    cookies: tuple[int, ...] = ()  # one per function; default: the function's index
    frequency: int | None = None  # perf_event sampling, Hz (None: DEFAULT_FREQUENCY)
    children: bool = False  # also the pid's descendants (the entry's children_knob)
    stack_bytes: int | None = None  # stack copy size (None: the object's default)
    min_block_us: int | None = None  # offcpu: shortest wait kept (None: the object's 1 ms)
    sample_bytes: int | None = None  # memstacks: bytes per recorded allocation (None: all)
    # Programs that walk Python frames: the interpreter files, and frames per stack.
    python_files: tuple[pymaps.PythonFile, ...] = ()
    python_frames: int | None = None
    cgroup: int | None = None  # scope job: the cgroup id (the entry's cgroup_knob)


# A pid knob's value that makes the tree map hold the targets (gfx_tree.h
# GFX_TREE_ONLY): one loaded instance then serves target after target.
TREE_ONLY = 0xFFFFFFFE

# Sampling frequency of perf_event programs when the request names none.
DEFAULT_FREQUENCY = 99


def missing_tracepoint_message(target: str) -> str:
    system, _, event = target.partition("/")
    hint = _SYSTEM_HINTS.get(system, "the subsystem that provides it is not built or loaded")
    return f"tracepoint {system}:{event} does not exist on this kernel: {hint}"


def choose_variant(
    entry: Program,
    exists: Callable[[str, str], bool] = tracefs.event_exists,
    btf_exists: Callable[[str], bool] | None = None,
) -> str | None:
    """The variant to attach (None: the entry has none). Raises Unavailable.

    A tracepoint target exists when tracefs has the event; a tp_btf target
    when the kernel's BTF has its btf_trace_ type (no tracefs needed).
    btf_exists defaults to kernel_btf.tp_btf_target_exists, looked up per call."""
    has_btf = btf_exists or kernel_btf.tp_btf_target_exists

    def gone(a: Attach) -> bool:
        if a.kind == "tracepoint" and a.target:
            return not exists(*a.tracepoint)
        return a.kind == "tp_btf" and bool(a.target) and not has_btf(a.target or "")

    def missing(attaches: tuple[Attach, ...] | list[Attach]) -> list[Attach]:
        return [a for a in attaches if a.target and gone(a)]

    base = missing([a for a in entry.attach if a.variant is None])
    if base:
        raise Unavailable(_missing_message(base[0]))
    if not entry.variants:
        return None
    tried = []
    for v in entry.variants:
        lack = missing([a for a in entry.attach if a.variant == v])
        if not lack:
            return v
        tried.append(f"{v} (needs {_need(lack[0])})")
    # Lead with a tracefs event if a variant has one: that is what most hosts lack.
    variant_attaches = [a for a in entry.attach if a.variant and a.target]
    first = next((a for a in variant_attaches if a.kind == "tracepoint"), variant_attaches[0])
    raise Unavailable(_missing_message(first) + "; tried variants " + ", ".join(tried))


def _need(a: Attach) -> str:
    if a.kind == "tp_btf":
        return f"kernel BTF with {kernel_btf.BTF_TRACE_PREFIX}{a.target}"
    return a.target or ""


def _missing_message(a: Attach) -> str:
    if a.kind == "tp_btf":
        return (
            f"tp_btf {a.target}: the kernel has no BTF for this tracepoint "
            f"(/sys/kernel/btf/vmlinux is missing or lacks {kernel_btf.BTF_TRACE_PREFIX}{a.target})"
        )
    return missing_tracepoint_message(a.target or "")


def availability(
    entry: Program,
    exists: Callable[[str, str], bool] = tracefs.event_exists,
    read_format: Callable[[str, str], tracefs.EventFormat] | None = None,
) -> str | None:
    """None when the program can run here, else the reason it cannot, led by
    what the program needs ("needs the xe driver: tracepoint ... does not exist").

    With read_format, the fields the program reads are checked as well, so a
    kernel whose events lack a field is reported before anyone attaches."""
    try:
        variant = choose_variant(entry, exists)
        if read_format is not None:
            field_knobs(entry, variant, read_format)
    except (HostError, tracefs.FormatError) as e:  # Unavailable, tracefs, a bad format
        return f"needs {entry.requires}: {e}" if entry.requires else str(e)
    try:  # what this kernel and its settings offer any program of the kind
        require_uprobe_multi(entry)
        require_perf_events(entry, variant)
    except Unavailable as e:
        return str(e)
    return None


def field_knobs(
    entry: Program,
    variant: str | None,
    read_format: Callable[[str, str], tracefs.EventFormat],
) -> dict[str, int]:
    """knob -> value for each field of variant, from the format files: the
    field's offset (and size, for a size knob). An optional field the event
    lacks gives FIELD_ABSENT (size 0); any other missing field raises
    FieldMissing, naming it."""
    formats: dict[str, tracefs.EventFormat] = {}
    values: dict[str, int] = {}
    for f in entry.fields_for(variant):
        if f.tracepoint not in formats:
            formats[f.tracepoint] = read_format(*f.tracepoint.split("/", 1))
        fmt = formats[f.tracepoint]
        fld = fmt.fields.get(f.field)
        if fld is None and not f.optional:
            system, _, event = f.tracepoint.partition("/")
            have = ", ".join(n for n, x in fmt.fields.items() if not x.is_common)
            raise FieldMissing(
                f"this kernel's {system}:{event} has no field {f.field!r} "
                f"(it has: {have}); program {entry.name!r} cannot run here"
            )
        values[f.knob] = fld.offset if fld is not None else FIELD_ABSENT
        if f.size_knob:
            values[f.size_knob] = fld.size if fld is not None else 0
    return values


def fill_field_knobs(
    spec: ObjectSpec,
    entry: Program,
    variant: str | None,
    read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
) -> dict[str, int]:
    """Write each declared field's offset (and size) from the live format file."""
    values = field_knobs(entry, variant, read_format)
    for knob, value in values.items():
        _set_knob(spec, knob, value)
    return values


def prepare(
    entry: Program,
    data: bytes,
    params: Params,
    *,
    exists: Callable[[str, str], bool] = tracefs.event_exists,
    read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
) -> tuple[ObjectSpec, str | None]:
    """Parse the object bytes and set every knob; nothing touches bpf(2) yet."""
    spec = ObjectSpec.parse(data, entry.object.split(".", 1)[0])
    try:
        variant = choose_variant(entry, exists)
        fill_field_knobs(spec, entry, variant, read_format)
    except Unavailable as e:
        if not entry.requires:
            raise
        raise type(e)(f"needs {entry.requires}: {e}") from None
    _scalar_knobs(spec, entry, params)
    _python_knobs(spec, entry, params)
    require_uprobe_multi(entry)
    require_perf_events(entry, variant)
    use_uprobe_multi(spec, entry)
    return spec, variant


def _scalar_knobs(spec: ObjectSpec, entry: Program, params: Params) -> None:
    """The request's settings into their knobs; a setting the program has no knob for is refused."""
    if params.children and params.pid is None:
        raise ParameterError(f"program {entry.name!r} follows no children here (needs a pid)")
    settings = [  # (value, the entry's knob, what a program without that knob lacks)
        (params.uid, entry.uid_knob, "has no uid filter"),
        (params.pid, entry.pid_knob, "takes no pid"),
        (1 if params.children else None, entry.children_knob, "follows no children here"),
        (params.cgroup, entry.cgroup_knob, "has no cgroup filter (scope job)"),
        (params.stack_bytes, entry.stack_bytes_knob, "takes no stack copies"),
        (params.min_block_us, entry.min_block_knob, "takes no minimum wait"),
        (params.sample_bytes, entry.sample_bytes_knob, "samples no allocations"),
    ]
    for value, knob, lacks in settings:
        if value is None:
            continue
        if not knob:
            raise ParameterError(f"program {entry.name!r} {lacks}")
        _set_knob(spec, knob, value)


def _python_knobs(spec: ObjectSpec, entry: Program, params: Params) -> None:
    if not entry.python_frames_knob:
        if params.python_files or params.python_frames is not None:
            raise ParameterError(f"program {entry.name!r} walks no Python frames")
        return
    pymaps.check(params.python_files)
    if params.python_frames is not None:
        if not 0 < params.python_frames <= pymaps.MAX_FRAMES:
            raise ParameterError(f"python_frames must be 1 to {pymaps.MAX_FRAMES}")
        _set_knob(spec, entry.python_frames_knob, params.python_frames)


# uprobe_multi links came with Linux 6.6; before it a uprobe needs the perf PMU.
UPROBE_MULTI_SINCE = "6.6"
_UPROBE_KINDS = ("uprobe", "uretprobe", "usdt")


def require_uprobe_multi(entry: Program, release: str | None = None) -> None:
    """Refuse, before any load, a uprobe or USDT program on a kernel without
    uprobe_multi links: the attach would fail with a bare EINVAL."""
    if not any(a.kind in _UPROBE_KINDS for a in entry.attach):
        return
    release = release or platform.release()
    try:
        old = kconfig.kernel_version(release) < kconfig.kernel_version(UPROBE_MULTI_SINCE)
    except kconfig.KconfigError:
        return  # an unparsable release: let the kernel answer
    if old:
        raise Unavailable(
            f"program {entry.name!r} attaches with uprobe_multi links, which Linux "
            f"{UPROBE_MULTI_SINCE} added, and this kernel is {release}: boot Linux "
            f"{UPROBE_MULTI_SINCE} or later (Debian 12 packages 6.12: linux-image-6.12-amd64)"
        )


_PERF_KINDS = ("perf_event", "tracepoint")  # attached through perf_event_open


def attaches_through_perf(entry: Program, variant: str | None) -> bool:
    return any(a.kind in _PERF_KINDS for a in entry.attach_for(variant))


def perf_event_programs(programs: Iterable[Program]) -> list[str]:
    """The programs every variant of which attaches through perf_event_open."""
    return [
        p.name
        for p in programs
        if all(attaches_through_perf(p, v) for v in (p.variants or (None,)))
    ]


def require_perf_events(entry: Program, variant: str | None) -> None:
    """Refuse, before any load, a program that attaches through a perf event
    where the kernel opens none to this process (Debian's perf_event_paranoid
    3 asks for CAP_SYS_ADMIN): the attach would fail with a bare EACCES."""
    if not attaches_through_perf(entry, variant):
        return
    reason = perf.perf_events_refused()
    if reason:
        raise Unavailable(f"program {entry.name!r} attaches through perf events, and {reason}")


def use_uprobe_multi(spec: ObjectSpec, entry: Program) -> None:
    """Uprobe programs attach through uprobe_multi links, which need the attach type
    at load time (the uprobe perf PMU would need CAP_SYS_ADMIN)."""
    for a in entry.attach:
        if a.kind in _UPROBE_KINDS:
            with _must_match_catalog():
                prog = spec.programs[a.program]
            prog.expected_attach_type = BPF_TRACE_UPROBE_MULTI


@dataclass
class Opened:
    """A parsed object with its knobs set, not yet in the kernel (a skeleton's
    "open" state): change spec before load() if need be."""

    entry: Program
    variant: str | None
    spec: ObjectSpec
    params: Params

    def load(self, read_only: Collection[str] = (), *, allow_no_btf: bool = False) -> Instance:
        """Load the variant's programs; read_only names maps to freeze, allow_no_btf
        lets it load if the kernel refuses its BTF (loader.load)."""
        wanted = list(dict.fromkeys(a.program for a in self.entry.attach_for(self.variant)))
        obj = load(self.spec, programs=wanted, read_only=read_only, allow_no_btf=allow_no_btf)
        return Instance(self.entry, self.variant, obj, self.params.functions, self.params)


# Turns one attach point's failure into the error to raise (the broker's codes).
ErrorMap = Callable[[Attach, Exception], Exception]


@dataclass
class Instance:
    """A loaded and attached catalog program; close() detaches and unloads."""

    entry: Program
    variant: str | None
    obj: LoadedObject
    functions: tuple[str, ...] = ()  # uprobe functions, by cookie (index)
    params: Params = field(default_factory=Params)
    attachments: list[bpfattach.Attachment] = field(default_factory=list)

    def attach(self, library_path: str | None = None, errors: ErrorMap | None = None) -> None:
        """Attach every program of the variant. On failure close() undoes what
        was attached; errors, if given, chooses the exception to raise instead.
        A program that walks Python frames gets its layouts and files first."""
        if self.entry.python_frames_knob:
            pymaps.fill(self.obj, self.params.python_files)
        for a in self.entry.attach_for(self.variant):
            try:
                attach_entry(self, a, self.params, library_path)
            except Exception as e:
                mapped = e if errors is None else errors(a, e)
                if mapped is e:
                    raise
                raise mapped from None
        if self.entry.since_map:  # bpf_ktime_get_ns() is CLOCK_MONOTONIC
            since = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            self.obj.map(self.entry.since_map).update(0, since.to_bytes(8, "little"))

    def track(self, tgids: Collection[int]) -> int:
        """Add processes to the entry's tree map (gfx_tree.h: descendants of the
        pid followed with params.children); how many were new."""
        if not self.entry.tree_map:
            raise ParameterError(f"program {self.entry.name!r} has no process tree")
        tree = self.obj.map(self.entry.tree_map)
        new = 0
        for tgid in tgids:
            if tree.lookup(tgid) is None:
                tree.update(tgid, b"\x01")
                new += 1
        return new

    def close(self) -> None:
        for a in self.attachments:
            a.close()
        self.attachments.clear()
        self.obj.close()

    def __enter__(self) -> Instance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach_entry(
    inst: Instance, a: Attach, params: Params, library_path: str | None = None
) -> None:
    """Attach one catalog attach entry of a loaded instance.

    library_path overrides params.library for the kernel (e.g. /proc/self/fd/N
    of a file the caller already checked, so the path cannot change under us).
    """
    prog = inst.obj.programs[a.program]
    if a.kind == "tracepoint":
        system, event = a.tracepoint
        inst.attachments.append(bpfattach.attach_tracepoint(prog.fd, system, event))
    elif a.kind == "raw_tracepoint":
        assert a.target
        inst.attachments.append(bpfattach.attach_raw_tracepoint(prog.fd, a.target))
    elif a.kind == "tp_btf":  # the target was named by BTF id at load
        inst.attachments.append(tracing.attach_btf_traced(prog.fd, f"tp_btf {a.target}"))
    elif a.kind in ("uprobe", "uretprobe"):
        if not params.library or not params.functions:
            raise ParameterError(f"program {inst.entry.name!r} needs a library and functions")
        # Following children, every process that maps the library is probed and
        # the program keeps the tree's (gfx_tree.h): a child's pid is not known yet.
        pid = params.pid if params.pid is not None and not params.children else -1
        # One link for all functions; each function's cookie is its index.
        inst.attachments.append(
            bpfattach.attach_uprobe_multi(
                prog.fd,
                library_path or params.library,
                params.functions,
                pid=pid,
                retprobe=a.kind == "uretprobe",
                cookies=params.cookies or None,
            )
        )
    elif a.kind == "usdt":
        att = _attach_usdt(inst, prog.fd, a, params, library_path)
        if att is not None:
            inst.attachments.append(att)
    elif a.kind == "perf_event":
        freq = params.frequency or DEFAULT_FREQUENCY
        inst.attachments.append(bpfattach.attach_perf_event(prog.fd, freq))
    else:  # catalog validation keeps this unreachable
        raise ParameterError(f"unknown attach kind {a.kind!r}")


def _attach_usdt(
    inst: Instance, prog_fd: int, a: Attach, params: Params, library_path: str | None
) -> bpfattach.Attachment | None:
    """A catalog USDT probe ("provider:name") in the request's library: every
    site, one uprobe_multi link, each site's semaphore raised while attached in
    each process probed (following children: every process that maps it).
    None: an optional probe this build of the library lacks."""
    if not params.library:
        raise ParameterError(f"program {inst.entry.name!r} needs a library")
    assert a.target  # the catalog checks usdt targets
    provider, name = a.target.split(":", 1)
    path = library_path or params.library
    if a.optional and not usdt.has_probe(path, provider, name):
        return None
    pid = params.pid if params.pid is not None and not params.children else -1
    with _must_match_catalog():
        specs = inst.obj.map(usdt.SPECS_MAP)
    return usdt.attach_usdt(prog_fd, specs, path, provider, name, pid=pid, multi=True)


def open_program(
    entry: Program,
    data: bytes,
    params: Params = Params(),
    *,
    exists: Callable[[str, str], bool] = tracefs.event_exists,
    read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
) -> Opened:
    """The first step of the pipeline: parse, choose the variant, set the knobs."""
    spec, variant = prepare(entry, data, params, exists=exists, read_format=read_format)
    return Opened(entry, variant, spec, params)


def start(
    entry: Program,
    data: bytes,
    params: Params = Params(),
    *,
    attach: bool = True,
    read_only: Collection[str] = (),
) -> Instance:
    """open_program → load → attach. All or nothing: a failure leaves nothing behind.

    The broker runs the same steps one by one (it charges its map budget
    between open and load, and maps each step's errors to its own codes).
    """
    inst = open_program(entry, data, params).load(read_only)
    try:
        if attach:
            inst.attach()
    except BaseException:
        inst.close()
        raise
    return inst
