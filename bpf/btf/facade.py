"""BTF: Btf, a parsed BTF blob you can query, fix up, encode and decode values with.

Pure Python, no syscalls. Btf.parse() reads a raw BTF blob (an object's
`.BTF` section or /sys/kernel/btf/vmlinux), Btf.to_bytes() writes it back
(byte for byte when nothing changed), fixup_datasecs() finishes what clang
leaves undone before BPF_BTF_LOAD, decode() turns raw map/event bytes into
Python values.

The work is split by job: btf_types (kinds, BtfError, a dataclass per
kind), btf_table (lookups), btf_parse, btf_encode, btf_decode, btf_maps
(`.maps` definitions, parse_btf_maps) and btf_ext (`.BTF.ext`). This module
re-exports their public names, so `from gfxbpf.bpf.btf.facade import X` finds them.

Every corrupt input raises BtfError (a ValueError) saying what is wrong and
where (byte offset or type id); nothing else escapes, and nothing recurses
without bound.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gfxbpf.bpf.btf.decode import Decoders
from gfxbpf.bpf.btf.kinds import (
    BTF_HEADER_LEN,
    BTF_MAGIC,
    BTF_VERSION,
    INT_BOOL,
    INT_CHAR,
    INT_SIGNED,
    KIND_ARRAY,
    KIND_CONST,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_FLOAT,
    KIND_FUNC,
    KIND_FUNC_PROTO,
    KIND_FWD,
    KIND_INT,
    KIND_NAMES,
    KIND_PTR,
    KIND_RESTRICT,
    KIND_STRUCT,
    KIND_TYPE_TAG,
    KIND_TYPEDEF,
    KIND_UNION,
    KIND_VAR,
    KIND_VOID,
    KIND_VOLATILE,
    LINKAGE_EXTERN,
    LINKAGE_GLOBAL,
    LINKAGE_STATIC,
    Array,
    BtfError,
    BtfType,
    Composite,
    Const,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Member,
    Param,
    Ptr,
    Ref,
    Restrict,
    Struct,
    Typedef,
    TypeTag,
    Union,
    Var,
    VarSecinfo,
    Void,
    Volatile,
)
from gfxbpf.bpf.btf.parse import HEADER, parse_blob
from gfxbpf.bpf.btf.table import TypeTable
from gfxbpf.bpf.lazy import lazy_exports

if TYPE_CHECKING:
    from gfxbpf.bpf.btf.ext import (
        BtfExt,
        CoreRelo,
        FuncInfo,
        LineInfo,
        pack_ext_records,
        pack_func_info,
        pack_line_info,
    )
    from gfxbpf.bpf.btf.mapdefs import BtfMapDef, parse_btf_maps

# Re-exported on first use: only object loading needs them, and importing
# them costs a client's start-up ~10% (NamedTuples and dataclasses).
_LAZY = {
    "BtfExt": "ext",
    "CoreRelo": "ext",
    "FuncInfo": "ext",
    "LineInfo": "ext",
    "pack_ext_records": "ext",
    "pack_func_info": "ext",
    "pack_line_info": "ext",
    "BtfMapDef": "mapdefs",
    "parse_btf_maps": "mapdefs",
}


__getattr__ = lazy_exports("gfxbpf.bpf.btf", _LAZY, globals())


__all__ = [
    "BtfError",
    "Btf",
    "BtfType",
    "Void",
    "Int",
    "Ref",
    "Ptr",
    "Typedef",
    "Volatile",
    "Const",
    "Restrict",
    "TypeTag",
    "Array",
    "Composite",
    "Struct",
    "Union",
    "Member",
    "Enum",
    "EnumValue",
    "Fwd",
    "Func",
    "FuncProto",
    "Param",
    "Var",
    "Datasec",
    "VarSecinfo",
    "Float",
    "DeclTag",
    "BtfMapDef",
    "parse_btf_maps",
    "BtfExt",
    "FuncInfo",
    "LineInfo",
    "CoreRelo",
    "pack_func_info",
    "pack_line_info",
    "pack_ext_records",
    "BTF_MAGIC",
    "BTF_VERSION",
    "BTF_HEADER_LEN",
    "KIND_VOID",
    "KIND_INT",
    "KIND_PTR",
    "KIND_ARRAY",
    "KIND_STRUCT",
    "KIND_UNION",
    "KIND_ENUM",
    "KIND_FWD",
    "KIND_TYPEDEF",
    "KIND_VOLATILE",
    "KIND_CONST",
    "KIND_RESTRICT",
    "KIND_FUNC",
    "KIND_FUNC_PROTO",
    "KIND_VAR",
    "KIND_DATASEC",
    "KIND_FLOAT",
    "KIND_DECL_TAG",
    "KIND_TYPE_TAG",
    "KIND_ENUM64",
    "KIND_NAMES",
    "INT_SIGNED",
    "INT_CHAR",
    "INT_BOOL",
    "LINKAGE_STATIC",
    "LINKAGE_GLOBAL",
    "LINKAGE_EXTERN",
]


class Btf(TypeTable):
    """A parsed BTF blob. `types[i]` is type id i; `types[0]` is void.

    Defines __eq__ and so, being mutable, is unhashable.
    """

    def __init__(
        self,
        types: list[BtfType],
        strings: bytes,
        *,
        version: int = BTF_VERSION,
        flags: int = 0,
    ) -> None:
        super().__init__(types, strings)
        self.version = version
        self.flags = flags
        # Original blob and where its sections were, so to_bytes() can keep
        # an unusual header or layout when the section lengths did not change.
        self._orig: bytes | None = None
        self._orig_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._decoders = Decoders(self)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> Btf:
        data = bytes(data)
        blob = parse_blob(data)
        btf = cls(blob.types, blob.strings, version=blob.version, flags=blob.flags)
        btf._str_cache = blob.names
        btf._orig = data
        btf._orig_sections = blob.sections
        return btf

    def to_bytes(self) -> bytes:
        """Encode as a BTF blob.

        When the type and string sections keep their lengths (fixups never
        change them), the original header and layout are kept, so an
        unmodified Btf gives back its input byte for byte. Otherwise the
        result has a plain 24-byte header, types first, then strings.
        """
        try:
            from gfxbpf.bpf.btf.encode import encode_types  # writing BTF: loaders only

            types = encode_types(self.types)
        except (struct.error, AttributeError, TypeError) as e:
            raise BtfError(f"cannot encode BTF: a type has an invalid field ({e})") from None
        strs = self.strings
        t_start, t_len, s_start, s_len = self._orig_sections
        if self._orig is not None and len(types) == t_len and len(strs) == s_len:
            out = bytearray(self._orig)
            out[2] = self.version
            out[3] = self.flags
            out[t_start : t_start + t_len] = types
            out[s_start : s_start + s_len] = strs
            return bytes(out)
        hdr = HEADER.pack(
            BTF_MAGIC,
            self.version,
            self.flags,
            BTF_HEADER_LEN,
            0,
            len(types),
            len(types),
            len(strs),
        )
        return hdr + types + strs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Btf):
            return NotImplemented
        return (
            self.version == other.version
            and self.flags == other.flags
            and self.strings == other.strings
            and self.types == other.types
        )

    def __repr__(self) -> str:
        return f"<Btf {len(self.types) - 1} types, {len(self.strings)} bytes of strings>"

    # ----------------------------------------------------------------- fixups

    def datasecs(self) -> list[Datasec]:
        """Every DATASEC, so a caller can see which ones fixup_datasecs() left alone."""
        return [t for t in self.types if isinstance(t, Datasec)]

    def fixup_datasecs(self, section_sizes: dict[str, int], symbol_offsets: dict[str, int]) -> None:
        """Finish the DATASECs clang leaves with size 0 and VAR offsets 0.

        For each DATASEC named in `section_sizes` whose size is still 0: set
        its size, and each global VAR's offset from `symbol_offsets` (its ELF
        symbol's st_value). Static VARs already carry their offsets, extern
        VARs have none. Then sort the secinfos by offset, as the kernel
        wants. DATASECs absent from `section_sizes` stay untouched (see
        datasecs()); .kconfig/.ksyms only get sorted.
        """
        self._forget()
        for t in self.types:
            if not isinstance(t, Datasec):
                continue
            if t.name in (".kconfig", ".ksyms"):
                t.secinfos.sort(key=_secinfo_offset)
                continue
            if t.name not in section_sizes:
                continue
            if t.size == 0:
                size = section_sizes[t.name]
                if size <= 0:
                    raise BtfError(f"DATASEC '{t.name}' (type id {t.id}): section size is {size}")
                t.size = size
                for si in t.secinfos:
                    var = self.type_by_id(si.type)
                    if not isinstance(var, Var):
                        raise BtfError(
                            f"DATASEC '{t.name}' (type id {t.id}) holds type id {si.type} "
                            f"({var.kind_name}), expected a VAR"
                        )
                    if var.linkage in (LINKAGE_STATIC, LINKAGE_EXTERN):
                        continue
                    if var.name not in symbol_offsets:
                        raise BtfError(
                            f"DATASEC '{t.name}': no ELF symbol for VAR '{var.name}' "
                            f"(type id {var.id}); the object's symbol table is incomplete"
                        )
                    si.offset = symbol_offsets[var.name]
            t.secinfos.sort(key=_secinfo_offset)

    def set_func_linkage(self, name: str, linkage: int) -> None:
        """Set the linkage of every FUNC named `name` (e.g. make a hidden subprogram static)."""
        funcs = [t for t in self.types if isinstance(t, Func) and t.name == name]
        if not funcs:
            raise BtfError(f"no BTF FUNC named '{name}'")
        for f in funcs:
            f.linkage = linkage
        self._forget()

    def _forget(self) -> None:
        """Drop cached sizes and decoders after a change to the types."""
        self._sizes.clear()
        self._decoders.clear()

    # ----------------------------------------------------------------- decode

    def decode(self, type_id: int, data: bytes | bytearray | memoryview) -> Any:
        """Decode `data` (at least size_of(type_id) bytes) as a Python value."""
        try:
            size, fn = self._decoders.get(type_id)
            if len(data) < size:
                raise BtfError(
                    f"cannot decode {self.type_str(type_id)} (type id {type_id}): "
                    f"need {size} bytes, got {len(data)}"
                )
            return fn(data, 0)
        except (struct.error, OverflowError) as e:  # corrupt sizes the checks missed
            raise BtfError(f"cannot decode type id {type_id}: {e}") from None

    def decoder(self, type_id: int) -> Callable[[bytes], Any]:
        """A function bytes -> value for `type_id`, compiled once."""
        try:
            size, fn = self._decoders.get(type_id)
        except (struct.error, OverflowError) as e:
            raise BtfError(f"cannot decode type id {type_id}: {e}") from None
        desc = f"type id {type_id}"

        def decode(data: bytes) -> Any:
            if len(data) < size:
                raise BtfError(f"cannot decode {desc}: need {size} bytes, got {len(data)}")
            try:
                return fn(data, 0)
            except struct.error as e:
                raise BtfError(f"cannot decode {desc}: {e}") from None

        return decode

    def batch_decoder(self, type_id: int, stride: int = 0) -> Callable[[Any, int], list[Any]]:
        """fn(buf, n) -> n values of `type_id` laid `stride` bytes apart (default:
        its size), compiled once: a whole batch-lookup buffer in one pass."""
        try:
            size = self._decoders.get(type_id)[0]
            fn = self._decoders.batch(type_id, stride)
        except (struct.error, OverflowError) as e:
            raise BtfError(f"cannot decode type id {type_id}: {e}") from None
        step = stride or size
        desc = f"type id {type_id}"

        def decode(buf: Any, n: int) -> list[Any]:
            if len(buf) < n * step:
                raise BtfError(f"cannot decode {n} x {desc}: need {n * step} bytes, got {len(buf)}")
            try:
                return fn(buf, n)
            except struct.error as e:
                raise BtfError(f"cannot decode {desc}: {e}") from None

        return decode


def _secinfo_offset(si: VarSecinfo) -> int:
    return si.offset
