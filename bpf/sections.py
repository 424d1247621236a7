"""Program kinds by ELF section name, as libbpf names them (its section_defs table).

One table: for each section prefix, the program type and expected attach
type the kernel is told at load, the attach kind gfxbpf uses afterwards, and,
for BTF-typed kinds, which vmlinux BTF type names the attach target
(PROG_LOAD's attach_btf_id). Pure data and parsing, no syscalls.
"""

from __future__ import annotations

from dataclasses import dataclass

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.errors import InputError

KIND_FUNC = 12  # BTF kinds of attach targets
KIND_TYPEDEF = 8


class SectionError(ValueError, InputError):
    """A section name that is malformed for its kind."""


class SectionUnsupported(SectionError):
    """A section libbpf knows but gfxbpf does not load (says why)."""


@dataclass(frozen=True)
class SectionKind:
    prefix: str
    prog_type: int
    attach_type: int
    attach_kind: str
    target: str  # "required", "optional" or "none": what follows the "/"
    btf_prefix: str | None = None  # BTF-typed: vmlinux type "<btf_prefix><target>"
    btf_kind: int = KIND_FUNC


_T = C.ProgType
# libbpf's names. attach_kind is what attach.py / instance.py dispatch on.
SECTION_KINDS = (
    SectionKind("tracepoint", _T.TRACEPOINT, 0, "tracepoint", "required"),
    SectionKind("tp", _T.TRACEPOINT, 0, "tracepoint", "required"),
    SectionKind("raw_tracepoint", _T.RAW_TRACEPOINT, 0, "raw_tracepoint", "required"),
    SectionKind("raw_tp", _T.RAW_TRACEPOINT, 0, "raw_tracepoint", "required"),
    SectionKind("uprobe", _T.KPROBE, 0, "uprobe", "optional"),
    SectionKind("uretprobe", _T.KPROBE, 0, "uretprobe", "optional"),
    SectionKind("uprobe.multi", _T.KPROBE, C.BPF_TRACE_UPROBE_MULTI, "uprobe", "optional"),
    SectionKind("uretprobe.multi", _T.KPROBE, C.BPF_TRACE_UPROBE_MULTI, "uretprobe", "optional"),
    SectionKind("usdt", _T.KPROBE, 0, "usdt", "optional"),
    SectionKind("perf_event", _T.PERF_EVENT, 0, "perf_event", "none"),
    SectionKind("kprobe", _T.KPROBE, 0, "kprobe", "optional"),
    SectionKind("kretprobe", _T.KPROBE, 0, "kretprobe", "optional"),
    SectionKind("ksyscall", _T.KPROBE, 0, "ksyscall", "optional"),
    SectionKind("kretsyscall", _T.KPROBE, 0, "kretsyscall", "optional"),
    SectionKind("kprobe.multi", _T.KPROBE, C.BPF_TRACE_KPROBE_MULTI, "kprobe.multi", "optional"),
    SectionKind(
        "kretprobe.multi", _T.KPROBE, C.BPF_TRACE_KPROBE_MULTI, "kretprobe.multi", "optional"
    ),
    SectionKind(
        "tp_btf", _T.TRACING, C.BPF_TRACE_RAW_TP, "tp_btf", "required", "btf_trace_", KIND_TYPEDEF
    ),
    SectionKind("fentry", _T.TRACING, C.BPF_TRACE_FENTRY, "fentry", "required", ""),
    SectionKind("fexit", _T.TRACING, C.BPF_TRACE_FEXIT, "fexit", "required", ""),
    SectionKind("iter", _T.TRACING, C.BPF_TRACE_ITER, "iter", "required", "bpf_iter_"),
)
_BY_PREFIX = {k.prefix: k for k in SECTION_KINDS}

# Kinds libbpf loads that gfxbpf refuses, with why.
UNSUPPORTED_KINDS = {
    "fmod_ret": "fmod_ret changes kernel return values; gfxbpf loads observers only",
    "lsm": "LSM programs enforce policy; gfxbpf loads tracing programs only",
    "struct_ops": "struct_ops replaces kernel operations; gfxbpf loads tracing programs only",
    "freplace": "freplace (BPF_PROG_TYPE_EXT) is not supported",
    "syscall": "BPF_PROG_TYPE_SYSCALL programs are not supported",
}
# Networking and cgroup program types: they change what the kernel does with
# packets and sockets, not observe it; the loader does not load them.
NON_TRACING = (
    "socket sk_reuseport tc tcx netkit classifier action xdp cgroup_skb cgroup "
    "sockops sk_skb sk_msg lirc_mode2 flow_dissector sk_lookup lwt_in lwt_out lwt_xmit "
    "lwt_seg6local netfilter"
).split()


@dataclass(frozen=True)
class SectionProgram:
    prog_type: int
    attach_type: int
    attach_kind: str
    target: str | None
    btf_name: str | None  # vmlinux type naming the target (BTF-typed kinds)
    btf_kind: int


def _unsupported(section: str, base: str) -> SectionUnsupported:
    key = base.removesuffix(".s")
    if base.endswith(".s"):
        why = "sleepable programs are not supported"
    elif key in UNSUPPORTED_KINDS:
        why = UNSUPPORTED_KINDS[key]
    elif key in NON_TRACING or key.split("_", 1)[0] in ("cgroup", "sk", "xdp", "tc"):
        why = (
            f"{key} is a networking/cgroup program type, which gfxbpf does not load "
            "(it loads tracing programs only: socket, tc, xdp, cgroup and sk_* stay unsupported)"
        )
    else:
        why = "unknown program type; supported are " + ", ".join(
            sorted({k.prefix for k in SECTION_KINDS})
        )
    return SectionUnsupported(f"section {section!r}: {why}")


def parse_section(section: str) -> SectionProgram:
    """The program a section name declares (without a leading '?')."""
    base, slash, rest = section.partition("/")
    kind = _BY_PREFIX.get(base)
    if kind is None:
        raise _unsupported(section, base)
    if kind.target == "none" and slash:
        raise SectionError(f"section {section!r}: {base} takes no target")
    if kind.target == "required" and not rest:
        raise SectionError(f"section {section!r}: expected '{base}/<target>'")
    if kind.attach_kind == "tracepoint":
        cat, _, event = rest.partition("/")
        if not cat or not event or "/" in event:
            raise SectionError(
                f"section {section!r}: a tracepoint section must be 'tracepoint/<category>/<event>'"
            )
    btf_name = None
    if kind.btf_prefix is not None:
        btf_name = kind.btf_prefix + rest
    return SectionProgram(
        int(kind.prog_type),
        kind.attach_type,
        kind.attach_kind,
        rest or None,
        btf_name,
        kind.btf_kind,
    )
