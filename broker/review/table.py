"""What a catalog object may use, beyond helpers: one table for the audit.

Program kinds (program type and attach kind), map types, kfuncs and kernel
symbols (__ksym): each row allowed or refused with its reason. broker/review/checks.py
applies it; anything not listed is refused, so a new kind is denied until
someone reviews it here. The loader (gfxbpf.bpf.sections) knows more kinds
than this table allows: loading is not approving.
"""

from __future__ import annotations

from typing import Final

from gfxbpf.bpf import consts as C

_T = C.ProgType

# (program type, attach kind) -> None if allowed, else why not. Only observers:
# each reads kernel or user data at an event and writes the program's own maps.
PROGRAM_KINDS: Final[dict[tuple[int, str], str | None]] = {
    (_T.TRACEPOINT, "tracepoint"): None,
    (_T.RAW_TRACEPOINT, "raw_tracepoint"): None,
    (_T.PERF_EVENT, "perf_event"): None,
    (_T.KPROBE, "uprobe"): None,
    (_T.KPROBE, "uretprobe"): None,
    (_T.KPROBE, "usdt"): None,
    # Kernel functions: the same reads as a raw tracepoint's arguments.
    (_T.KPROBE, "kprobe"): None,
    (_T.KPROBE, "kretprobe"): None,
    (_T.KPROBE, "ksyscall"): None,
    (_T.KPROBE, "kretsyscall"): None,
    (_T.TRACING, "tp_btf"): None,  # a raw tracepoint whose arguments the verifier types
    (_T.TRACING, "fentry"): None,
    (_T.TRACING, "fexit"): None,
    (_T.KPROBE, "kprobe.multi"): "multi-kprobe links attach to many functions by pattern",
    (_T.KPROBE, "kretprobe.multi"): "multi-kprobe links attach to many functions by pattern",
    (_T.TRACING, "iter"): "iterators dump kernel objects (every task, map, ...) to a reader",
}

# Map types the loader supports that catalog objects may not use, with why.
REFUSED_MAP_TYPES: Final[dict[int, str]] = {
    C.MapType.PROG_ARRAY: "program arrays serve tail calls, which the audit refuses",
    C.MapType.ARRAY_OF_MAPS: (
        "map-in-map: the broker budgets and hands out the maps it creates, not inner maps"
    ),
    C.MapType.HASH_OF_MAPS: (
        "map-in-map: the broker budgets and hands out the maps it creates, not inner maps"
    ),
}


def map_type_problem(map_type: int) -> str | None:
    """None if a catalog object may use the map type, else why not."""
    if map_type not in C.SUPPORTED_MAP_TYPES:
        return "not allowed"
    return REFUSED_MAP_TYPES.get(map_type)


# kfuncs (kernel functions a program calls through BTF) -> None if allowed, else why not.
KFUNCS: Final[dict[str, str | None]] = {
    "bpf_rcu_read_lock": None,  # a read-side critical section: no data, no side effect
    "bpf_rcu_read_unlock": None,
    "bpf_task_acquire": "takes references on kernel objects (task_struct)",
    "bpf_task_from_pid": "takes references on kernel objects (task_struct)",
    "bpf_cgroup_acquire": "takes references on kernel objects (cgroup)",
    "bpf_obj_new_impl": "allocates kernel memory",
    "bpf_send_signal_task": "sends signals",
    "bpf_probe_read_kernel_dynptr": "not reviewed",
}

# __ksym variables -> None if allowed, else why not. A ksym's value is a kernel
# address (a typeless one is the bare address, a typed one a pointer the
# program may store), which a map would hand to clients: none are allowed.
KSYMS: Final[dict[str, str | None]] = {}

KERNEL_ADDRESS = (
    "a typeless __ksym is a kernel address inside the program, which it could "
    "copy into a map that clients read"
)
NOT_REVIEWED_KSYM = "a kernel variable's address; no __ksym is on the broker's allowlist"
NOT_REVIEWED_KFUNC = "not on the broker's kfunc allowlist (broker/review/table.py)"


def program_kind_problem(prog_type: int, attach_kind: str) -> str | None:
    """None if the kind is allowed, else why it is not."""
    key = (prog_type, attach_kind)
    if key not in PROGRAM_KINDS:
        allowed = sorted({k for (_, k), why in PROGRAM_KINDS.items() if why is None})
        return "not an allowed program kind (allowed: " + ", ".join(allowed) + ")"
    return PROGRAM_KINDS[key]


def extern_problem(kind: str, name: str, typed: bool) -> str | None:
    """None if a kconfig, ksym or kfunc extern is allowed, else why not."""
    if kind == "kconfig":
        return None  # read-only build configuration values, the same on every call
    if kind == "kfunc":
        return KFUNCS.get(name, NOT_REVIEWED_KFUNC)
    if not typed:
        return KERNEL_ADDRESS
    return KSYMS.get(name, NOT_REVIEWED_KSYM)
