"""Constants: the BPF ABI numbers (include/uapi/linux/bpf.h, x86-64) and the scope names.

Only the values gfxbpf uses; docs/BPF-ABI.md says where each comes from.
Names and numbers only, no syscalls: bpf/, the broker and the client all import it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final, Literal

# The scopes a program runs in: catalog, policy, broker and client all use
# these names (gfxbpf.proto.scopes maps them to the wire's enum). self before
# system: a request that names no scope gets the narrowest its entry grants;
# job last, as it needs a job id that such a request does not carry.
Scope = Literal["self", "system", "job"]
SELF: Final = "self"  # only the caller's own events (uid/pid knobs in .rodata)
SYSTEM: Final = "system"  # every process's events
JOB: Final = "job"  # the caller's events in one Slurm job's cgroup (uid and cgroup knobs)
SCOPES: Final[tuple[Scope, ...]] = (SELF, SYSTEM, JOB)


class ProgType(IntEnum):
    KPROBE = 2  # also uprobes
    TRACEPOINT = 5
    PERF_EVENT = 7
    RAW_TRACEPOINT = 17
    TRACING = 26


class MapType(IntEnum):
    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERF_EVENT_ARRAY = 4
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    STACK_TRACE = 7
    CGROUP_ARRAY = 8
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    HASH_OF_MAPS = 13
    QUEUE = 22
    STACK = 23
    RINGBUF = 27


# Map types an object may use (docs/ARCHITECTURE.md, "Adding a program").
SUPPORTED_MAP_TYPES = frozenset(
    {
        MapType.HASH,
        MapType.ARRAY,
        MapType.PERCPU_HASH,
        MapType.PERCPU_ARRAY,
        MapType.LRU_HASH,
        MapType.RINGBUF,
        MapType.STACK_TRACE,
        MapType.PERF_EVENT_ARRAY,
        # bcc-style cgroup filters: the program only tests membership
        # (bpf_current_task_under_cgroup); user space fills it with cgroup fds.
        MapType.CGROUP_ARRAY,
        # Initial values from `.values = {...}` (bpf/object.py, loader.py).
        MapType.ARRAY_OF_MAPS,
        MapType.HASH_OF_MAPS,
        MapType.PROG_ARRAY,
    }
)

MAP_IN_MAP_TYPES = frozenset({MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS})

PERCPU_MAP_TYPES = frozenset({MapType.PERCPU_HASH, MapType.PERCPU_ARRAY, MapType.LRU_PERCPU_HASH})

# libbpf creates these map types without BTF key/value ids.
MAP_TYPES_WITHOUT_BTF = frozenset(
    {
        MapType.PERF_EVENT_ARRAY,
        MapType.CGROUP_ARRAY,
        MapType.STACK_TRACE,
        MapType.ARRAY_OF_MAPS,
        MapType.HASH_OF_MAPS,
        MapType.QUEUE,
        MapType.STACK,
    }
)

# Map flags.
BPF_F_NO_PREALLOC = 1 << 0
BPF_F_RDONLY = 1 << 3
BPF_F_WRONLY = 1 << 4
BPF_F_RDONLY_PROG = 1 << 7
BPF_F_WRONLY_PROG = 1 << 8
BPF_F_MMAPABLE = 1 << 10

# ld_imm64 src_reg values.
BPF_PSEUDO_MAP_FD = 1
BPF_PSEUDO_MAP_VALUE = 2
BPF_PSEUDO_BTF_ID = 3
BPF_PSEUDO_FUNC = 4
BPF_PSEUDO_MAP_IDX = 5
BPF_PSEUDO_MAP_IDX_VALUE = 6
# call src_reg values.
BPF_PSEUDO_CALL = 1
BPF_PSEUDO_KFUNC_CALL = 2

# ELF relocation types for BPF (llvm_reloc.rst).
R_BPF_NONE = 0
R_BPF_64_64 = 1
R_BPF_64_ABS64 = 2
R_BPF_64_ABS32 = 3
R_BPF_64_NODYLD32 = 4
R_BPF_64_32 = 10

# bpf(2) commands (enum bpf_cmd).
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_BTF_GET_FD_BY_ID = 19
BPF_BTF_GET_NEXT_ID = 23
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_BTF_LOAD = 18
BPF_MAP_FREEZE = 22
BPF_MAP_LOOKUP_BATCH = 24
BPF_LINK_CREATE = 28
BPF_ITER_CREATE = 33
BPF_PROG_BIND_MAP = 35
BPF_ENABLE_STATS = 32

# Element update flags.
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

# BPF_ENABLE_STATS types.
BPF_STATS_RUN_TIME = 0

# Attach types (enum bpf_attach_type).
BPF_TRACE_RAW_TP = 23
BPF_TRACE_FENTRY = 24
BPF_TRACE_FEXIT = 25
BPF_TRACE_ITER = 28
BPF_PERF_EVENT = 41
BPF_TRACE_KPROBE_MULTI = 42
BPF_TRACE_UPROBE_MULTI = 48

# uprobe_multi link flags.
BPF_F_UPROBE_MULTI_RETURN = 1

BPF_OBJ_NAME_LEN = 16
INSN_SIZE = 8
