"""Extern symbols of an object: `.kconfig` values, `__ksym` variables and kfuncs.

clang leaves each `extern` undefined in the symbol table and describes it in
BTF: a VAR in the `.kconfig` or `.ksyms` DATASEC, or an extern FUNC (a kfunc).
Parsing (collect, layout, BTF fixes) needs no kernel; resolve_* functions
read the running kernel's config, BTF and /proc/kallsyms at load time.

- kconfig: one read-only array map `<obj>.kconfig` holds every value, laid
  out as libbpf lays it out (larger alignment first, then smaller size,
  then name), so programs read the same offsets.
- typed ksym: ld_imm64 with src BPF_PSEUDO_BTF_ID and the vmlinux VAR id.
- typeless ksym (`extern const void x __ksym`): the symbol's kernel address,
  from /proc/kallsyms. That is a kernel address inside the program: the
  broker's audit refuses such objects (broker/review/checks.py).
- kfunc: the call gets src BPF_PSEUDO_KFUNC_CALL and the vmlinux FUNC id; an
  unresolved `__weak` kfunc gets id 0 (the program must guard the call with
  bpf_ksym_exists, and the verifier drops it as dead code).
"""

from __future__ import annotations

from dataclasses import dataclass

from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.kinds import (
    INT_BOOL,
    INT_CHAR,
    INT_SIGNED,
    KIND_DATASEC,
    KIND_VAR,
    LINKAGE_EXTERN,
    LINKAGE_GLOBAL,
    Array,
    Datasec,
    Enum,
    Func,
    FuncProto,
    Int,
    Var,
)
from gfxbpf.bpf.errors import InputError
from gfxbpf.bpf.externs import kconfig
from gfxbpf.bpf.kernel.vmlinux import KernelBtfError, vmlinux_type_id

KCONFIG_SEC = ".kconfig"
KSYMS_SEC = ".ksyms"
KALLSYMS = "/proc/kallsyms"
KIND_FUNC = 12
STB_GLOBAL, STB_WEAK = 1, 2


class ExternError(ValueError, InputError):
    """An extern gfxbpf cannot satisfy (says which and why)."""


@dataclass
class Extern:
    name: str
    kind: str  # "kconfig" | "ksym" | "kfunc"
    weak: bool
    type_id: int  # object BTF: the VAR's type (kconfig, ksym) or the FUNC (kfunc)
    typed: bool = True  # ksym: False for a typeless `const void` ksym (an address)
    size: int = 0  # kconfig: bytes in the .kconfig map
    align: int = 1
    offset: int = 0  # kconfig: offset in the .kconfig map value


def collect(btf: Btf | None, undefined: list[tuple[str, int]]) -> dict[str, Extern]:
    """The externs among undefined (name, binding) symbols, described by BTF."""
    names = {n: bind for n, bind in undefined if n and bind in (STB_GLOBAL, STB_WEAK)}
    if not names:
        return {}
    if btf is None:
        raise ExternError(f"extern {sorted(names)[0]!r} needs BTF to describe it: build with -g")
    out: dict[str, Extern] = {}
    for ds in btf.datasecs():
        if ds.name not in (KCONFIG_SEC, KSYMS_SEC):
            continue
        for si in ds.secinfos:
            t = btf.type_by_id(si.type)
            if t.name in names and isinstance(t, (Var, Func)):
                out[t.name] = _extern(btf, ds.name, t, names[t.name] == STB_WEAK)
    for name, bind in names.items():
        if name in out:
            continue
        fid = btf.find(name, KIND_FUNC)
        f = btf.types[fid] if fid is not None else None
        if not isinstance(f, Func) or f.linkage != LINKAGE_EXTERN:
            raise ExternError(
                f"extern {name!r} is neither a __kconfig or __ksym variable nor a kfunc "
                "(only those externs can be resolved: no static linking of BPF objects)"
            )
        out[name] = Extern(name, "kfunc", bind == STB_WEAK, f.id)
    return out


def _extern(btf: Btf, sec: str, t: Var | Func, weak: bool) -> Extern:
    if isinstance(t, Func):
        return Extern(t.name, "kfunc", weak, t.id)
    if sec == KSYMS_SEC:
        return Extern(t.name, "ksym", weak, t.type, typed=btf.resolve(t.type) != 0)
    size, align = _kconfig_shape(btf, t)
    return Extern(t.name, "kconfig", weak, t.type, size=size, align=align)


def _kconfig_shape(btf: Btf, var: Var) -> tuple[int, int]:
    """(size, alignment) of a .kconfig extern: integers, bools, tristates, char arrays."""
    t = btf.resolve_type(var.type)
    if isinstance(t, (Int, Enum)):
        return t.size, t.size
    if isinstance(t, Array) and isinstance(btf.resolve_type(t.type), Int):
        elem = btf.resolve_type(t.type)
        if isinstance(elem, Int) and elem.size == 1:
            return t.nelems, 1
    raise ExternError(
        f".kconfig extern {var.name!r} has type {btf.type_str(var.type)}: use an integer, "
        "bool, enum libbpf_tristate or a char array"
    )


def layout_kconfig(btf: Btf, externs: dict[str, Extern]) -> int:
    """Place the .kconfig values as libbpf does; fix the DATASEC for BPF_BTF_LOAD.

    Returns the map's value size (0 when the object has no .kconfig extern).
    """
    kcfg = sorted(
        (e for e in externs.values() if e.kind == "kconfig"),
        key=lambda e: (-e.align, e.size, e.name),
    )
    off = 0
    for e in kcfg:
        e.offset = -(-off // e.align) * e.align
        off = e.offset + e.size
    ds = _datasec(btf, KCONFIG_SEC)
    if ds is not None and kcfg:
        ds.size = off
        for si in ds.secinfos:
            var = btf.type_by_id(si.type)
            if isinstance(var, Var) and var.name in externs:
                var.linkage = LINKAGE_GLOBAL  # the kernel refuses extern VARs
                si.offset, si.size = externs[var.name].offset, externs[var.name].size
        ds.secinfos.sort(key=lambda si: si.offset)
    return off


def fix_ksyms_btf(btf: Btf) -> None:
    """The kernel refuses extern VARs and FUNCs: make .ksyms entries int-sized globals.

    A kfunc's FUNC becomes global, and so is checked like a global function:
    every parameter must be named ("Invalid arg#1" otherwise), which a
    declaration such as `struct task_struct *bpf_task_from_pid(s32) __ksym`
    leaves unnamed. As libbpf does, such parameters take the name of the
    dummy VAR that stands for the kfuncs in the DATASEC.
    """
    ds = _datasec(btf, KSYMS_SEC)
    funcs = [t for t in btf.types if isinstance(t, Func) and t.linkage == LINKAGE_EXTERN]
    for f in funcs:
        f.linkage = LINKAGE_GLOBAL
    if ds is None or not ds.secinfos:
        return
    int_id = _int_type(btf)
    dummy: Var | None = None
    for i, si in enumerate(ds.secinfos):
        t = btf.type_by_id(si.type)
        if isinstance(t, Var):
            t.linkage, t.type = LINKAGE_GLOBAL, int_id
        else:  # a kfunc: the DATASEC may hold only VARs
            if dummy is None:
                dummy = Var(0, KIND_VAR, "dummy_ksym", 0, False, int_id, LINKAGE_GLOBAL)
                _append(btf, dummy)
            if isinstance(t, Func):
                _name_params(btf, t, dummy)
            si.type = dummy.id
        si.offset, si.size = 4 * i, 4
    ds.size = 4 * len(ds.secinfos)


def _name_params(btf: Btf, f: Func, name: Var) -> None:
    """Name every unnamed, typed parameter of kfunc `f` after the dummy VAR `name`."""
    proto = btf.type_by_id(f.type)
    if not isinstance(proto, FuncProto):
        raise ExternError(f"kfunc {f.name!r}: its BTF type is not a function prototype")
    for p in proto.params:
        if p.type and not p.name_off:  # type 0 is the `...` of a variadic prototype
            p.name, p.name_off = name.name, name.name_off


def _datasec(btf: Btf, name: str) -> Datasec | None:
    tid = btf.find(name, KIND_DATASEC)
    t = btf.types[tid] if tid is not None else None
    return t if isinstance(t, Datasec) else None


def _int_type(btf: Btf) -> int:
    for t in btf.types:
        if isinstance(t, Int) and t.size == 4 and t.bits == 32 and t.encoding == INT_SIGNED:
            return t.id
    return _append(btf, Int(0, 1, "int", 0, False, 4, INT_SIGNED, 0, 32))


def _append(btf: Btf, t: Var | Int) -> int:
    t.id = len(btf.types)
    t.name_off = btf.add_string(t.name)
    btf.types.append(t)
    btf._by_name = None
    btf._forget()
    return t.id


# ------------------------------------------------------------------- load time


def encode_kconfig(btf: Btf, e: Extern, value: str | None) -> bytes:
    """One .kconfig value in its C type; None (unset) is zero for a __weak extern."""
    if value is None:
        if not e.weak:
            raise ExternError(
                f".kconfig extern {e.name!r} is not set in this kernel's config; "
                "declare it __weak to read 0 when absent"
            )
        return bytes(e.size)
    t = btf.resolve_type(e.type_id)
    if isinstance(t, Enum) and t.name == "libbpf_tristate":
        tri = {"y": 1, "n": 0, "m": 2}
        if value not in tri:
            raise ExternError(f"{e.name}={value!r} is not a tristate (y, n or m)")
        return tri[value].to_bytes(e.size, "little")
    if isinstance(t, Array):
        raw = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
        return raw.encode()[: e.size - 1].ljust(e.size, b"\0")
    if isinstance(t, Int) and t.encoding & (INT_BOOL | INT_CHAR) and value in ("y", "n", "m"):
        if t.encoding & INT_CHAR:
            return value.encode()
        return (1 if value in ("y", "m") else 0).to_bytes(1, "little")
    return _encode_int(e, t, value)


def _encode_int(e: Extern, t: object, value: str) -> bytes:
    signed = isinstance(t, Int) and bool(t.encoding & INT_SIGNED)
    try:
        n = int(value, 0)
    except ValueError:
        raise ExternError(f"{e.name}={value!r} is not an integer") from None
    try:
        return n.to_bytes(e.size, "little", signed=signed)
    except OverflowError:
        raise ExternError(f"{e.name}={value!r} does not fit in {e.size} bytes") from None


def kconfig_data(btf: Btf, externs: dict[str, Extern], size: int) -> bytes:
    """The .kconfig map's value on the running kernel."""
    data = bytearray(size)
    for e in externs.values():
        if e.kind == "kconfig":
            value, _where = kconfig.lookup(e.name)
            data[e.offset : e.offset + e.size] = encode_kconfig(btf, e, value)
    return bytes(data)


def kernel_btf_id(e: Extern) -> int | None:
    """vmlinux id of a typed ksym (VAR) or kfunc (FUNC); None if absent."""
    try:
        return vmlinux_type_id(e.name, KIND_FUNC if e.kind == "kfunc" else KIND_VAR)
    except KernelBtfError:
        return None


def kallsyms_address(name: str, path: str = KALLSYMS) -> int | None:
    """A kernel symbol's address from /proc/kallsyms: None if absent, 0 if hidden."""
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == name:
                return int(parts[0], 16)
    return None


def resolve_ksym(e: Extern) -> tuple[str, int]:
    """("btf_id", id) for typed ksyms and kfuncs, ("addr", address) for typeless ones.

    An unresolved __weak extern resolves to 0 (what libbpf does too).
    """
    if e.kind == "kfunc" or e.typed:
        tid = kernel_btf_id(e)
        if tid is not None:
            return "btf_id", tid
        if e.weak:
            return ("btf_id" if e.kind == "kfunc" else "addr"), 0
        what = "kfunc" if e.kind == "kfunc" else "kernel variable"
        raise ExternError(f"{what} {e.name!r} is not in the running kernel's BTF")
    addr = kallsyms_address(e.name)
    if addr is None and e.weak:
        return "addr", 0
    if addr is None:
        raise ExternError(f"kernel symbol {e.name!r} is not in {KALLSYMS}")
    if addr == 0:
        raise ExternError(
            f"the address of kernel symbol {e.name!r} is hidden ({KALLSYMS} shows 0: "
            "kernel.kptr_restrict, or not root): a typeless __ksym cannot be resolved here"
        )
    return "addr", addr


def describe(e: Extern) -> dict[str, object]:
    """How an extern resolves on the running kernel, for `inspect` (never raises)."""
    out: dict[str, object] = {"kind": e.kind, "weak": e.weak}
    try:
        if e.kind == "kconfig":
            value, where = kconfig.lookup(e.name)
            out |= {"offset": e.offset, "size": e.size, "value": value, "from": where}
        elif e.kind == "ksym" and not e.typed:
            out |= {"typed": False, "resolves_to": "kernel address (from /proc/kallsyms)"}
        else:
            how, n = resolve_ksym(e)
            out |= {"typed": True, "vmlinux_btf_id": n if how == "btf_id" else None}
    except (ExternError, kconfig.KconfigError, OSError) as err:
        out["error"] = str(err)
    return out
