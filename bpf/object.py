"""Parse a clang-built BPF ELF object into an ObjectSpec, with no syscalls.

This is libbpf's "open" phase: programs from section names, BTF-defined maps,
global data, relocations and subprograms, all inspectable and changeable
(e.g. `.rodata` knobs) before anything touches the kernel. `link_program`
produces the final instruction stream of one program with its subprograms
appended the way libbpf appends them, so gfxbpf and bpftool load identical
code.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Mapping

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.asm import CODE_CALL, CODE_LD_IMM64, SLOT
from gfxbpf.bpf.btf.facade import (
    KIND_DATASEC,
    LINKAGE_STATIC,
    Btf,
    BtfError,
    BtfExt,
    Datasec,
    Var,
    parse_btf_maps,
)
from gfxbpf.bpf.externs.decls import Extern, ExternError, collect, fix_ksyms_btf, layout_kconfig
from gfxbpf.bpf.linker import Linker
from gfxbpf.bpf.sections import SectionError, SectionProgram, SectionUnsupported, parse_section
from gfxbpf.bpf.specs import (
    LinkedProgram,
    MapSpec,
    ObjectError,
    ProgramSpec,
    Relocation,
    Symbol,
    UnsupportedError,
    Variable,
    is_rodata,
    map_spec,
)
from gfxbpf.elf.reader import ElfError
from gfxbpf.elf.relocatable import ObjSection as _Section
from gfxbpf.elf.relocatable import Relocatable, read_relocatable

EM_BPF = 247
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_NOBITS = 8
SHT_REL = 9
SHF_EXECINSTR = 0x4
STT_OBJECT = 1
STT_FUNC = 2
STT_SECTION = 3
STB_LOCAL = 0
STV_INTERNAL = 1
STV_HIDDEN = 2
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00

MAX_OBJECT_SIZE = 64 << 20  # far above any real program; bounds memory on hostile input


def _is_data(name: str) -> bool:
    return name == ".data" or name.startswith(".data.")


def _is_bss(name: str) -> bool:
    return name == ".bss" or name.startswith(".bss.")


def _section_program_type(section: str) -> SectionProgram:
    """The program type, attach type and target a section name declares (sections.py)."""
    try:
        return parse_section(section)
    except SectionUnsupported as e:
        raise UnsupportedError(str(e)) from None
    except SectionError as e:
        raise ObjectError(str(e)) from None


def internal_map_name(obj_name: str, section: str) -> str:
    """The kernel name libbpf gives a global-data map (bpftool reads the same)."""
    sfx_len = min(max(7, len(section)), C.BPF_OBJ_NAME_LEN - 1)
    # Two or more dots: a custom section like .rodata.str1.1 keeps its own name.
    if "." in section[1:]:
        pfx_len = 0
    else:
        pfx_len = min(C.BPF_OBJ_NAME_LEN - sfx_len - 1, len(obj_name))
    name = (obj_name[:pfx_len] + section[:sfx_len])[: C.BPF_OBJ_NAME_LEN - 1]
    return "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in name)


def object_name(path: str) -> str:
    """libbpf's object name: the file's basename up to its first dot."""
    return os.path.basename(path).split(".", 1)[0] or "obj"


class ObjectSpec:
    """A parsed BPF object. Build with ObjectSpec.parse(data, name) or from_file()."""

    def __init__(self) -> None:
        self.name = "obj"
        self.sha256 = ""
        self.size = 0
        self.license = ""
        self.kern_version = 0
        self.programs: dict[str, ProgramSpec] = {}
        self.maps: dict[str, MapSpec] = {}  # keyed by real name (variable / section)
        self.btf: Btf | None = None
        self.btf_ext: BtfExt | None = None
        self.btf_error: str | None = None  # why BTF could not be used, if so
        self.btf_bytes: bytes = b""  # the object's raw .BTF section (for clients)
        self.externs: dict[str, Extern] = {}  # __kconfig, __ksym and kfunc externs
        self.kconfig_size = 0  # value size of the .kconfig map (0: none)
        self._text_index: int | None = None
        self._sections: dict[str, int] = {}

    # ---------------------------------------------------------------- parsing
    @classmethod
    def from_file(cls, path: str) -> ObjectSpec:
        with open(path, "rb") as f:
            data = f.read(MAX_OBJECT_SIZE + 1)
        return cls.parse(data, object_name(path))

    @classmethod
    def parse(cls, data: bytes, name: str = "obj") -> ObjectSpec:
        """Parse object bytes. Raises ObjectError (or UnsupportedError), nothing else."""
        if len(data) > MAX_OBJECT_SIZE:
            raise ObjectError(f"object is larger than {MAX_OBJECT_SIZE >> 20} MiB")
        spec = cls()
        spec.name = name
        spec.size = len(data)
        spec.sha256 = hashlib.sha256(data).hexdigest()
        try:
            spec._parse(bytes(data))
        except ObjectError:
            raise
        except BtfError as e:
            raise ObjectError(f"bad BTF: {e}") from None
        except (struct.error, IndexError, KeyError, ValueError, UnicodeError) as e:
            raise ObjectError(f"corrupt ELF object: {e}") from None
        except Exception as e:  # hostile input: whatever a parser did not foresee
            raise ObjectError(f"corrupt ELF object: {type(e).__name__}: {e}") from None
        return spec

    def _parse(self, data: bytes) -> None:
        elf = _open_elf(data)
        sections = elf.sections
        self._sections = {s.name: s.index for s in sections}
        symbols = _read_symtab(elf)
        by_name = {s.name: s for s in sections}
        self._parse_metadata(by_name, sections)
        text = by_name.get(".text")
        self._text_index = text.index if text is not None and text.size else None

        self._parse_btf(by_name, sections, symbols)
        self._parse_externs(symbols)
        self._parse_programs(sections, symbols)
        self._parse_maps(by_name, sections, symbols)
        self._parse_relocations(elf, symbols)

    def _parse_metadata(self, by_name: dict[str, _Section], sections: list[_Section]) -> None:
        """License and kernel version; refuse the sections gfxbpf does not support."""
        if "maps" in by_name:
            raise UnsupportedError(
                "legacy 'maps' section: define maps with BTF in SEC(\".maps\") "
                "(libbpf >= 1.0 refuses it too)"
            )
        lic = by_name.get("license")
        # No license section: libbpf loads with an empty license, so the kernel
        # refuses only GPL-only helpers (its verifier log says which).
        self.license = lic.data.split(b"\0", 1)[0].decode("ascii", "replace") if lic else ""
        if "version" in by_name and len(by_name["version"].data) >= 4:
            self.kern_version = struct.unpack_from("<I", by_name["version"].data)[0]
        for s in sections:
            if s.name.startswith(".struct_ops"):
                raise UnsupportedError(f"section {s.name!r} is not supported")

    def _parse_btf(
        self, by_name: dict[str, _Section], sections: list[_Section], symbols: list[Symbol]
    ) -> None:
        btf_sec = by_name.get(".BTF")
        if btf_sec is None:
            if ".maps" in by_name:
                raise ObjectError("the object has a .maps section but no .BTF to describe it")
            return
        self.btf_bytes = btf_sec.data
        btf = Btf.parse(btf_sec.data)
        sizes = {s.name: s.size for s in sections if s.index}
        offsets: dict[str, int] = {}
        for sym in symbols:
            if sym.type == STT_OBJECT and 0 < sym.shndx < len(sections):
                offsets.setdefault(sym.name, sym.value)
        btf.fixup_datasecs(sizes, offsets)
        self.btf = btf
        ext = by_name.get(".BTF.ext")
        if ext is not None:
            # CO-RE relocations are applied at load time (core/apply.py).
            self.btf_ext = BtfExt.parse(ext.data, btf)

    def _parse_externs(self, symbols: list[Symbol]) -> None:
        """Extern symbols (externs/decls.py); the BTF is fixed so the kernel accepts it."""
        undefined = [(s.name, s.bind) for s in symbols if s.shndx == SHN_UNDEF and s.index]
        try:
            self.externs = collect(self.btf, undefined)
        except ExternError as e:
            raise UnsupportedError(str(e)) from None
        if self.externs and self.btf is not None:
            self.kconfig_size = layout_kconfig(self.btf, self.externs)
            fix_ksyms_btf(self.btf)

    def _parse_programs(self, sections: list[_Section], symbols: list[Symbol]) -> None:
        progs: list[ProgramSpec] = []
        for sec in sections:
            if sec.type == SHT_PROGBITS and sec.flags & SHF_EXECINSTR and sec.size:
                progs += self._section_programs(sec, symbols, progs)
        # libbpf orders programs by section index, then offset.
        progs.sort(key=lambda p: (p.section_index, p.insn_offset))
        if not any(not p.is_subprog for p in progs) and progs:
            raise ObjectError("the object has subprograms in .text but no program section")
        self.programs = {p.name: p for p in progs}

    def _section_programs(
        self, sec: _Section, symbols: list[Symbol], earlier: list[ProgramSpec]
    ) -> list[ProgramSpec]:
        """The functions of one code section: programs, or subprograms in .text."""
        if sec.size % C.INSN_SIZE:
            raise ObjectError(f"section {sec.name!r}: size is not a multiple of 8")
        is_text = sec.index == self._text_index
        autoload = not sec.name.startswith("?")
        kind_of = (
            SectionProgram(0, 0, "subprog", None, None, 0)
            if is_text
            else _section_program_type(sec.name.removeprefix("?"))
        )
        funcs = [s for s in symbols if s.shndx == sec.index and s.type == STT_FUNC]
        if not funcs:
            raise ObjectError(f"section {sec.name!r} holds code but no function symbol")
        out: list[ProgramSpec] = []
        for sym in funcs:
            _check_function(sym, sec, is_text)
            if sym.name in self.programs or any(p.name == sym.name for p in (*earlier, *out)):
                raise ObjectError(f"two functions are named {sym.name!r}")
            out.append(
                ProgramSpec(
                    name=sym.name,
                    section=sec.name,
                    prog_type=kind_of.prog_type,
                    expected_attach_type=kind_of.attach_type,
                    attach_kind=kind_of.attach_kind,
                    attach_target=kind_of.target,
                    insns=sec.data[sym.value : sym.value + sym.size],
                    section_index=sec.index,
                    insn_offset=sym.value // C.INSN_SIZE,
                    autoload=autoload,
                    btf_static=sym.bind != STB_LOCAL
                    and sym.visibility in (STV_HIDDEN, STV_INTERNAL),
                    attach_btf_name=kind_of.btf_name,
                    attach_btf_kind=kind_of.btf_kind,
                )
            )
        return out

    def _parse_maps(
        self, by_name: dict[str, _Section], sections: list[_Section], symbols: list[Symbol]
    ) -> None:
        maps: dict[str, MapSpec] = {}
        if ".maps" in by_name and by_name[".maps"].size:
            maps.update(self._btf_maps(by_name[".maps"], symbols))
        for sec in sections:
            kind = _data_section_kind(sec)
            if kind is not None:
                maps[sec.name] = self._data_map(sec, kind, symbols)
        if self.kconfig_size:
            maps[".kconfig"] = self._kconfig_map()
        self.maps = maps

    def _kconfig_map(self) -> MapSpec:
        """libbpf's read-only `<obj>.kconfig` map; filled with values at load time."""
        assert self.btf is not None  # externs need BTF
        kcfg = [e for e in self.externs.values() if e.kind == "kconfig"]
        return MapSpec(
            name=internal_map_name(self.name, ".kconfig"),
            real_name=".kconfig",
            map_type=C.MapType.ARRAY,
            key_size=4,
            value_size=self.kconfig_size,
            max_entries=1,
            flags=C.BPF_F_RDONLY_PROG | C.BPF_F_MMAPABLE,
            value_type_id=self.btf.find(".kconfig", KIND_DATASEC) or 0,
            section=".kconfig",
            data=bytearray(self.kconfig_size),
            variables={e.name: Variable(e.name, e.offset, e.size) for e in kcfg},
        )

    def _btf_maps(self, maps_sec: _Section, symbols: list[Symbol]) -> dict[str, MapSpec]:
        """The maps BTF defines in .maps, by variable name."""
        assert self.btf is not None  # checked in _parse_btf
        offsets = {s.name: s.value for s in symbols if s.shndx == maps_sec.index}
        maps: dict[str, MapSpec] = {}
        for d in parse_btf_maps(self.btf):
            if d.name not in offsets:
                raise ObjectError(f"map {d.name!r} is in BTF but has no symbol in .maps")
            maps[d.name] = map_spec(d, offsets[d.name])
        return maps

    def _data_map(self, sec: _Section, kind: str, symbols: list[Symbol]) -> MapSpec:
        """The one-entry array map libbpf makes of a .data, .rodata or .bss section."""
        value_type_id = 0
        mmapable = False
        if self.btf is not None:
            ds = self.btf.find(sec.name, KIND_DATASEC)
            if ds is not None:
                value_type_id = ds
                mmapable = _datasec_has_global_var(self.btf, ds)
        flags = C.BPF_F_RDONLY_PROG if kind == "rodata" else 0
        if mmapable:
            flags |= C.BPF_F_MMAPABLE
        variables = {
            s.name: Variable(s.name, s.value, s.size)
            for s in symbols
            if s.shndx == sec.index and s.type == STT_OBJECT
        }
        return MapSpec(
            name=internal_map_name(self.name, sec.name),
            real_name=sec.name,
            map_type=C.MapType.ARRAY,
            key_size=4,
            value_size=sec.size,
            max_entries=1,
            flags=flags,
            value_type_id=value_type_id,
            section=sec.name,
            data=bytearray(sec.size) if kind == "bss" else bytearray(sec.data),
            variables=variables,
        )

    def _parse_relocations(self, elf: Relocatable, symbols: list[Symbol]) -> None:
        relocator = _Relocator(self, elf.sections, symbols)
        for sec in elf.sections:
            if sec.type == SHT_REL:
                relocator.apply_section(sec, elf.rels)
        for p in self.programs.values():
            p.relocations.sort(key=lambda r: r.insn_index)

    # ------------------------------------------------------------ inspection
    def variable(self, name: str) -> tuple[MapSpec, Variable]:
        """Find a global variable (e.g. a `const volatile` knob) by name."""
        for m in self.maps.values():
            if name in m.variables:
                return m, m.variables[name]
        knobs = sorted(v for m in self.maps.values() for v in m.variables)
        raise KeyError(
            f"object {self.name!r} has no global variable {name!r}"
            + (f"; it has: {', '.join(knobs)}" if knobs else "")
        )

    def get_variable(self, name: str) -> int | bytes:
        m, v = self.variable(name)
        assert m.data is not None
        raw = bytes(m.data[v.offset : v.offset + v.size])
        if v.size in (1, 2, 4, 8):
            return int.from_bytes(raw, "little")
        return raw

    def set_variable(self, name: str, value: int | bytes) -> None:
        """Set a global variable's initial value, e.g. a `.rodata` knob, before loading."""
        m, v = self.variable(name)
        assert m.data is not None
        if isinstance(value, int):
            if v.size not in (1, 2, 4, 8):
                raise TypeError(f"variable {name!r} is {v.size} bytes: pass bytes")
            if not -(1 << (8 * v.size - 1)) <= value < (1 << (8 * v.size)):
                raise ValueError(f"value {value} does not fit variable {name!r} ({v.size} bytes)")
            raw = (value & ((1 << (8 * v.size)) - 1)).to_bytes(v.size, "little")
        else:
            raw = bytes(value)
            if len(raw) > v.size:
                raise ValueError(f"{len(raw)} bytes do not fit variable {name!r} ({v.size} bytes)")
            raw = raw.ljust(v.size, b"\0")
        if m.section is not None and _is_bss(m.section):
            raise ValueError(f"variable {name!r} is in .bss; only .data/.rodata take values")
        if m.section == ".kconfig":
            raise ValueError(f"{name!r} is a .kconfig extern: the loader fills it from this kernel")
        m.data[v.offset : v.offset + v.size] = raw

    def map_by_kernel_name(self, name: str) -> MapSpec | None:
        return next((m for m in self.maps.values() if m.name == name), None)

    # ---------------------------------------------------------------- linking
    def link_program(
        self, name: str, patched: Mapping[str, bytes | bytearray] | None = None
    ) -> LinkedProgram:
        """Append the subprograms a program calls and resolve calls, as libbpf does.

        Map and data references are left for the loader, which knows the fds.
        patched: instructions by (sub)program name that replace the parsed
        ones, e.g. after CO-RE relocation (same length, same relocations).
        """
        main = self.programs[name]
        if main.is_subprog:
            raise ValueError(f"{name!r} is a subprogram in .text, not a loadable program")
        linker = Linker(self.programs.values(), self.btf_ext, main, patched or {})
        linker.place(main, 0)
        linker.func_info.sort()
        linker.line_info.sort()
        return LinkedProgram(
            name, linker.insns, linker.map_refs, linker.func_info, linker.line_info, linker.order
        )


_EMPTY_SEC = _Section(0, "", 0, 0, 0, 0, 0, 0, 0, b"")


class _Relocator:
    """Turns the object's REL entries into Relocations of its programs."""

    def __init__(self, spec: ObjectSpec, sections: list[_Section], symbols: list[Symbol]) -> None:
        self.symbols = symbols
        self.text_index = spec._text_index
        self.by_index = {s.index: s for s in sections}
        self.progs_by_sec: dict[int, list[ProgramSpec]] = {}
        for p in spec.programs.values():
            self.progs_by_sec.setdefault(p.section_index, []).append(p)
        self.maps_sec = spec._sections.get(".maps")
        self.map_by_offset = {m.offset: m for m in spec.maps.values() if not m.is_data}
        self.data_maps = {
            spec._sections[m.section]: m for m in spec.maps.values() if m.section in spec._sections
        }
        self.externs = spec.externs

    def apply_section(
        self, rel: _Section, entries_of: Callable[[_Section], list[tuple[int, int, int]]]
    ) -> None:
        """Record every relocation of one REL section (entries_of gives its
        (offset, symbol, type) entries) that targets program code or .maps."""
        target = self.by_index.get(rel.info)
        if target is None:
            raise ObjectError(f"relocation section {rel.name!r} targets a missing section")
        if target.name == ".maps":
            for r_offset, sym_idx, _rtype in entries_of(rel):
                self.map_slot(r_offset, sym_idx)
            return
        if not target.flags & SHF_EXECINSTR or target.index not in self.progs_by_sec:
            return  # .rel.BTF and friends: never applied (docs/BPF-ABI.md, BTF)
        for r_offset, sym_idx, rtype in entries_of(rel):
            self.apply_one(rel, target, r_offset, sym_idx, rtype)

    def apply_one(
        self, rel: _Section, target: _Section, r_offset: int, sym_idx: int, rtype: int
    ) -> None:
        """One REL entry: find its instruction and program, check it, record it."""
        if sym_idx >= len(self.symbols):
            raise ObjectError(f"{rel.name}: relocation names symbol #{sym_idx}, past the end")
        sym = self.symbols[sym_idx]
        if r_offset % C.INSN_SIZE or r_offset + C.INSN_SIZE > target.size:
            raise ObjectError(f"{rel.name}: relocation offset {r_offset} is not an insn")
        insn_idx = r_offset // C.INSN_SIZE
        prog = next(
            (
                p
                for p in self.progs_by_sec[target.index]
                if p.insn_offset <= insn_idx < p.insn_offset + p.insn_count
            ),
            None,
        )
        if prog is None:
            raise ObjectError(f"{rel.name}: relocation at insn {insn_idx} is outside code")
        local = insn_idx - prog.insn_offset
        code, regs, _off, _imm = SLOT.unpack_from(prog.insns, local * C.INSN_SIZE)
        sname = sym.name or self.by_index.get(sym.shndx, _EMPTY_SEC).name
        _check_relocation(prog, local, code, rtype, sym, sname, self.externs)
        if sym.shndx == SHN_UNDEF:
            prog.relocations.append(self.extern(prog, local, code, self.externs[sname]))
        elif code == CODE_CALL:
            prog.relocations.append(self.call(prog, local, regs >> 4, sym, sname))
        else:
            prog.relocations.append(self.load(prog, local, sym, sname))

    def map_slot(self, r_offset: int, sym_idx: int) -> None:
        """One initial value in a map-in-map or prog array: `.values = { [i] = &x }`."""
        if sym_idx >= len(self.symbols):
            raise ObjectError(f".rel.maps: relocation names symbol #{sym_idx}, past the end")
        sym = self.symbols[sym_idx]
        outer = max(
            (m for m in self.map_by_offset.values() if m.offset <= r_offset),
            key=lambda m: m.offset,
            default=None,
        )
        if outer is None or not outer.values_kind:
            raise ObjectError(f".rel.maps: relocation at {r_offset} is in no map's 'values'")
        slot, rem = divmod(r_offset - outer.offset - outer.values_offset, 8)
        if rem or not 0 <= slot < outer.max_entries:
            raise ObjectError(f"map {outer.real_name!r}: initial value at a bad offset")
        if outer.values_kind == "maps":
            inner = self.map_by_offset.get(sym.value) if sym.shndx == self.maps_sec else None
            if inner is None:
                raise ObjectError(f"map {outer.real_name!r}: slot {slot} names no map")
            outer.init[slot] = inner.real_name
        else:
            if sym.type != STT_FUNC or sym.shndx not in self.progs_by_sec:
                raise ObjectError(f"map {outer.real_name!r}: slot {slot} names no program")
            outer.init[slot] = sym.name

    def extern(self, prog: ProgramSpec, local: int, code: int, e: Extern) -> Relocation:
        """A use of an extern: a kfunc call, or an ld_imm64 of a kconfig value or ksym
        (or of a kfunc: `if (kfunc)` tests whether the kernel has it)."""
        if code == CODE_CALL and e.kind != "kfunc":
            raise ObjectError(
                f"program {prog.name!r}: insn {local} calls {e.kind} extern {e.name!r}"
            )
        if e.kind == "kconfig":
            return Relocation(local, "data", e.name, ".kconfig", offset=e.offset)
        return Relocation(local, "kfunc" if code == CODE_CALL else "ksym", e.name)

    def call(self, prog: ProgramSpec, local: int, src: int, sym: Symbol, sname: str) -> Relocation:
        """A call into a subprogram in .text."""
        if src != C.BPF_PSEUDO_CALL:
            raise UnsupportedError(
                f"program {prog.name!r}: call relocation on a non-subprogram call"
            )
        if sym.shndx != self.text_index:
            raise ObjectError(f"program {prog.name!r}: call into {sname!r} outside .text")
        if sym.value % C.INSN_SIZE:
            raise ObjectError(f"program {prog.name!r}: misaligned call target")
        return Relocation(local, "call", sname, offset=sym.value)

    def load(self, prog: ProgramSpec, local: int, sym: Symbol, sname: str) -> Relocation:
        """An ld_imm64 of a map or of an address in global data."""
        if sym.shndx == self.text_index:
            # A callback: clang writes the function's byte offset from the symbol
            # into imm; the linker turns it into a BPF_PSEUDO_FUNC load.
            return Relocation(local, "func", sname, offset=sym.value)
        if sym.shndx == self.maps_sec:
            m = self.map_by_offset.get(sym.value)
            if m is None:
                raise ObjectError(f"program {prog.name!r}: no map at .maps offset {sym.value}")
            return Relocation(local, "map", sname, m.real_name)
        dm = self.data_maps.get(sym.shndx)
        if dm is None:
            secname = self.by_index.get(sym.shndx, _EMPTY_SEC).name
            raise ObjectError(
                f"program {prog.name!r}: reference to {sname!r} in section "
                f"{secname!r}, which is neither a map nor global data"
            )
        return Relocation(local, "data", sname, dm.real_name, offset=sym.value)


def _check_relocation(
    prog: ProgramSpec,
    local: int,
    code: int,
    rtype: int,
    sym: Symbol,
    sname: str,
    externs: dict[str, Extern],
) -> None:
    """A relocation gfxbpf can apply: a known type, on a call or ld_imm64, to a defined symbol."""
    if rtype not in (C.R_BPF_64_64, C.R_BPF_64_32):
        raise UnsupportedError(f"program {prog.name!r}: relocation type {rtype} at insn {local}")
    if code not in (CODE_CALL, CODE_LD_IMM64):
        raise ObjectError(
            f"program {prog.name!r}: relocation against {sname!r} on insn "
            f"{local} (opcode {code:#x}) that is neither a call nor ld_imm64"
        )
    if sym.shndx == SHN_UNDEF and sname not in externs:
        raise ObjectError(f"program {prog.name!r}: undefined symbol {sname!r} is not an extern")
    if sym.shndx >= SHN_LORESERVE:
        raise ObjectError(
            f"program {prog.name!r}: relocation against {sname!r} in a special "
            "section (an uninitialised global variable? initialise it)"
        )


def _open_elf(data: bytes) -> Relocatable:
    """The object read whole, checked: a 64-bit little-endian BPF object."""
    if data[:4] != b"\x7fELF":
        raise ObjectError("not an ELF file (bad magic)")
    if len(data) < 64:
        raise ObjectError("truncated ELF header")
    try:
        elf = read_relocatable(data, "object")
    except ElfError as e:
        raise ObjectError(str(e)) from None
    if not elf.is64 or not elf.little_endian:
        raise ObjectError("not a 64-bit little-endian ELF object")
    if elf.machine != EM_BPF:
        raise ObjectError(f"not a BPF object (e_machine {elf.machine})")
    return elf


def _read_symtab(elf: Relocatable) -> list[Symbol]:
    """The symbols of the object's one symbol table."""
    if sum(s.type == SHT_SYMTAB for s in elf.sections) != 1:
        raise ObjectError("expected exactly one symbol table (is the object stripped?)")
    return [Symbol(*s) for s in elf.symbols]


def _check_function(sym: Symbol, sec: _Section, is_text: bool) -> None:
    """A function that is whole instructions inside its section, global unless in .text."""
    if sym.value % C.INSN_SIZE or sym.size % C.INSN_SIZE or not sym.size:
        raise ObjectError(f"program {sym.name!r}: misaligned or empty function")
    if sym.value + sym.size > sec.size:
        raise ObjectError(f"program {sym.name!r} runs past the end of {sec.name!r}")
    if not is_text and sym.bind == STB_LOCAL:
        raise UnsupportedError(f"program {sym.name!r} in {sec.name!r} is static: make it global")


def _data_section_kind(sec: _Section) -> str | None:
    """ "data", "rodata" or "bss" for a non-empty global-data section, else None."""
    if not sec.index or not sec.size:
        return None
    if sec.type == SHT_PROGBITS and not sec.flags & SHF_EXECINSTR:
        if _is_data(sec.name):
            return "data"
        if is_rodata(sec.name):
            return "rodata"
    elif sec.type == SHT_NOBITS and _is_bss(sec.name):
        return "bss"
    return None


def _datasec_has_global_var(btf: Btf, datasec_id: int) -> bool:
    """libbpf makes a data map mmapable when its DATASEC holds a non-static VAR."""
    ds = btf.types[datasec_id]
    if not isinstance(ds, Datasec):
        return False
    for si in ds.secinfos:
        var = btf.types[si.type] if 0 <= si.type < len(btf.types) else None
        if isinstance(var, Var) and var.linkage != LINKAGE_STATIC:
            return True
    return False
