"""What a BPF object is made of, as bpf/object.py parses it: programs, maps
and their variables, symbols, the relocations of a program, a program once
linked, and the errors a malformed object raises. Plain data, and a BTF
map definition checked into a MapSpec."""

from __future__ import annotations

from dataclasses import dataclass, field

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.btf.mapdefs import BtfMapDef
from gfxbpf.bpf.errors import InputError


class ObjectError(ValueError, InputError):
    """The object is malformed: says what is wrong and where."""


class UnsupportedError(ObjectError):
    """The object is well formed but uses something gfxbpf does not support."""


@dataclass
class Symbol:
    index: int
    name: str
    value: int
    size: int
    type: int
    bind: int
    visibility: int
    shndx: int


@dataclass
class Relocation:
    """One relocation of a program, by instruction index within that program."""

    insn_index: int
    # "map" (ld_imm64 of a map), "data" (ld_imm64 into global data or .kconfig),
    # "call" (into .text), "ksym" (ld_imm64 of a __ksym), "kfunc" (call of a kfunc),
    # "func" (ld_imm64 of a .text function: a helper's callback, e.g. bpf_find_vma)
    kind: str
    symbol: str
    map_name: str | None = None  # for "map" and "data"
    # "data": symbol offset in the section; "call"/"func": the symbol's byte offset in .text
    offset: int = 0


@dataclass
class ProgramSpec:
    name: str
    section: str
    prog_type: int
    expected_attach_type: int
    attach_kind: str  # sections.py: tracepoint, tp_btf, kprobe, usdt, ... or subprog
    attach_target: str | None  # "sys/event", raw tracepoint name, "path:func", or None
    insns: bytes
    section_index: int
    insn_offset: int  # index of the first instruction within its section
    relocations: list[Relocation] = field(default_factory=list)
    autoload: bool = True
    btf_static: bool = False  # hidden global subprogram: its BTF FUNC is made static
    # BTF-typed kinds (tp_btf, fentry, iter...): the vmlinux type naming the
    # target, resolved to PROG_LOAD's attach_btf_id at load time.
    attach_btf_name: str | None = None
    attach_btf_kind: int = 0

    @property
    def is_subprog(self) -> bool:
        return self.attach_kind == "subprog"

    @property
    def insn_count(self) -> int:
        return len(self.insns) // C.INSN_SIZE


@dataclass
class Variable:
    name: str
    offset: int
    size: int
    type_id: int = 0


@dataclass
class MapSpec:
    name: str  # the name the kernel sees (libbpf's naming)
    real_name: str  # the C variable, or the ELF section for global data
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    key_type_id: int = 0
    value_type_id: int = 0
    numa_node: int = 0
    map_extra: int = 0
    section: str | None = None  # ELF section for global data maps
    offset: int = 0  # offset in .maps (BTF-defined maps)
    data: bytearray | None = None  # initial value for global data maps
    variables: dict[str, Variable] = field(default_factory=dict)
    # Map-in-map: the inner maps' definition (a template the kernel checks
    # values against); with values_kind "maps" or "progs", `init` gives the
    # initial value of each slot: a map's real name or a program's name.
    inner: MapSpec | None = None
    values_kind: str = ""
    values_offset: int = 0
    init: dict[int, str] = field(default_factory=dict)

    @property
    def is_data(self) -> bool:
        return self.section is not None

    @property
    def freeze(self) -> bool:
        # libbpf freezes .rodata and .kconfig maps after filling them.
        return self.section is not None and (is_rodata(self.section) or self.section == ".kconfig")


@dataclass
class LinkedProgram:
    """A program's final instructions, subprograms appended, ready for fds."""

    name: str
    insns: bytearray
    # (insn index, map name, kind "map" | "data", data offset); kinds "ksym" and
    # "kfunc" name an extern instead of a map
    map_refs: list[tuple[int, str, str, int]]
    func_info: list[tuple[int, int]]  # (insn index, btf type id)
    line_info: list[tuple[int, int, int, int]]  # (insn index, file off, line off, col)
    subprogs: list[str]


def is_rodata(name: str) -> bool:
    """A read-only data section: .rodata or .rodata.<suffix>."""
    return name == ".rodata" or name.startswith(".rodata.")


def map_spec(d: BtfMapDef, offset: int) -> MapSpec:
    """A BTF-defined map's spec (an inner map definition's too, at offset 0)."""
    _check_map_type(d.name, d.map_type)
    key_size, value_size, max_entries = d.key_size, d.value_size, d.max_entries
    if d.map_type in _FD_VALUE_MAP_TYPES:
        # Values are fds (programs, perf events, maps): 4 bytes; keys u32 indices.
        key_size = key_size or 4
        value_size = value_size or 4
    if d.map_type == C.MapType.RINGBUF and (
        max_entries <= 0 or max_entries & (max_entries - 1) or max_entries % 4096
    ):
        raise ObjectError(
            f"map {d.name!r}: ring buffer max_entries {max_entries} must be a "
            "power of two and a multiple of the page size"
        )
    if d.values_kind == "maps" and d.map_type not in C.MAP_IN_MAP_TYPES:
        raise ObjectError(f"map {d.name!r}: __array(values, struct ...) on a non map-in-map")
    if d.values_kind == "progs" and d.map_type != C.MapType.PROG_ARRAY:
        raise ObjectError(f"map {d.name!r}: __array(values, int (void *)) on a non prog array")
    return MapSpec(
        name=d.name[: C.BPF_OBJ_NAME_LEN - 1],
        real_name=d.name,
        map_type=d.map_type,
        key_size=key_size,
        value_size=value_size,
        max_entries=max_entries,
        flags=d.map_flags,
        key_type_id=d.key_type_id,
        value_type_id=d.value_type_id,
        numa_node=d.numa_node,
        map_extra=d.map_extra,
        offset=offset,
        inner=map_spec(d.inner, 0) if d.inner is not None else None,
        values_kind=d.values_kind,
        values_offset=d.values_offset,
    )


_FD_VALUE_MAP_TYPES = frozenset(
    {C.MapType.PERF_EVENT_ARRAY, C.MapType.PROG_ARRAY, *C.MAP_IN_MAP_TYPES}
)


def _check_map_type(name: str, map_type: int) -> None:
    if map_type not in C.SUPPORTED_MAP_TYPES:
        try:
            tname = C.MapType(map_type).name.lower()
        except ValueError:
            tname = f"type {map_type}"
        raise UnsupportedError(
            f"map {name!r}: map type {tname} is not supported; supported are "
            + ", ".join(sorted(t.name.lower() for t in C.SUPPORTED_MAP_TYPES))
        )
