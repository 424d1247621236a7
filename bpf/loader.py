"""Load an ObjectSpec into the kernel: BTF, maps, global data, programs.

libbpf's "load" phase. All or nothing: if any step fails, everything created
so far is closed before the error propagates, so no half-loaded object ever
stays in the kernel.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass, field

from gfxbpf.bpf import consts as C
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.asm import CODE_CALL, SLOT
from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.sanitize import needs_sanitizing, sanitize
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.corerelo import has_core_relos
from gfxbpf.bpf.corerelo import relocate as core_relocate
from gfxbpf.bpf.errors import KernelError
from gfxbpf.bpf.externs.decls import Extern, ExternError, kconfig_data, resolve_ksym
from gfxbpf.bpf.externs.kconfig import KconfigError
from gfxbpf.bpf.kernel.btfprobe import missing_features
from gfxbpf.bpf.kernel.vmlinux import KernelBtfError, find_type, kernel_target, module_btf_fd
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import LinkedProgram, MapSpec, ProgramSpec

log = logging.getLogger(__name__)


class LoadError(KernelError):
    """Loading failed; the message names the object and the step."""

    def __init__(self, message: str, log: str | None = None) -> None:
        super().__init__(message)
        self.log = log


@dataclass
class LoadedProgram:
    name: str
    fd: int
    id: int
    spec: ProgramSpec
    linked: LinkedProgram

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class LoadedObject:
    spec: ObjectSpec
    maps: dict[str, Map] = field(default_factory=dict)  # by real name (C variable / section)
    programs: dict[str, LoadedProgram] = field(default_factory=dict)
    btf_fd: int = -1
    btf_error: str | None = None  # why the kernel refused our BTF, if it did

    def map(self, name: str) -> Map:
        """A map by C variable name, section name (".rodata") or kernel name."""
        if name in self.maps:
            return self.maps[name]
        for m in self.maps.values():
            if m.name == name:
                return m
        raise KeyError(f"object {self.spec.name!r} has no map {name!r}; maps: {list(self.maps)}")

    def close(self) -> None:
        for p in self.programs.values():
            p.close()
        for m in self.maps.values():
            m.close()
        if self.btf_fd >= 0:
            os.close(self.btf_fd)
            self.btf_fd = -1

    def __enter__(self) -> LoadedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    spec: ObjectSpec,
    programs: list[str] | None = None,
    read_only: Collection[str] = (),
    *,
    allow_no_btf: bool = False,
) -> LoadedObject:
    """Load `spec`: every autoload program, or just the ones named.

    read_only names maps (by real name) to freeze right after creation, before
    any program uses them: from then on no fd can update or delete their
    elements, not even one opened later from a bpffs pin, while the programs
    still write them. Ring buffers cannot be frozen (their consumer maps a
    writable page), nor maps whose values hold spin locks, timers and the like.
    `spec` itself is never changed by this option.

    An object that carries BTF loads with it or not at all: when the kernel
    refuses the BTF (after the fix-ups libbpf makes too), LoadError carries
    the kernel's BTF log. allow_no_btf: load without it instead, as libbpf
    does for an object whose programs do not need it (its maps lose their
    types, subprograms their names and line info); obj.btf_error says why.

    Raises LoadError (with .log holding the verifier log for a rejected program).
    """
    frozen = set(read_only)
    unknown = frozen - set(spec.maps)
    if unknown:
        raise LoadError(
            f"object {spec.name!r} has no map {sorted(unknown)[0]!r} to make read-only; "
            f"maps: {list(spec.maps)}"
        )
    obj = LoadedObject(spec)
    try:
        _load_btf(obj, allow_no_btf)
        if obj.btf_error:
            log.warning("object %r: %s; its maps have no BTF types", spec.name, obj.btf_error)
        for m in spec.maps.values():
            obj.maps[m.real_name] = _create_map(obj, m)
        _init_slots(obj, "maps", {n: m.fileno() for n, m in obj.maps.items()})
        for m in spec.maps.values():
            if m.real_name in frozen:
                _freeze(obj, m, obj.maps[m.real_name])
        core = _relocate_core(spec, programs)
        names = (
            programs
            if programs is not None
            else [p.name for p in spec.programs.values() if not p.is_subprog and p.autoload]
        )
        for name in names:
            if name not in spec.programs or spec.programs[name].is_subprog:
                raise LoadError(f"object {spec.name!r} has no program {name!r}")
            obj.programs[name] = _load_program(obj, spec.programs[name], core)
        _init_slots(obj, "progs", {n: p.fd for n, p in obj.programs.items()})
    except BaseException:
        obj.close()
        raise
    return obj


def _load_btf(obj: LoadedObject, allow_no_btf: bool) -> None:
    spec = obj.spec
    if spec.btf is None:
        return
    btf = spec.btf
    # Hidden global subprograms are verified as static functions (as libbpf
    # does), in a copy: the spec stays as parsed.
    hidden = [p.name for p in spec.programs.values() if p.btf_static]
    if hidden:
        btf = Btf.parse(btf.to_bytes())
        for name in hidden:
            btf.set_func_linkage(name, 0)
    missing = missing_features()
    if needs_sanitizing(btf, missing):  # kinds this kernel refuses, rewritten as libbpf does
        btf = sanitize(btf, missing)
    try:
        obj.btf_fd = bpfsys.btf_load(btf.to_bytes())
    except bpfsys.BpfError as e:
        if not allow_no_btf:
            raise LoadError(
                f"object {spec.name!r}: the kernel refused the object's BTF ({e.strerror or e}); "
                "the object needs a BTF this kernel accepts (rebuild it against this kernel's "
                "features), or an explicit permission to load without BTF"
                f"{_log_tail(e.log)}",
                log=e.log,
            ) from e
        # Allowed: programs that do not need BTF load without it (libbpf goes
        # on too); maps lose their types, so say why.
        obj.btf_error = f"kernel refused the object's BTF: {e}"
        obj.btf_fd = -1


def _log_tail(log: str | None) -> str:
    """The last lines of a BTF log (the kernel's reason comes last)."""
    lines = [ln for ln in (log or "").splitlines() if ln.strip()]
    return (": " + " / ".join(lines[-3:])) if lines else ""


def _init_slots(obj: LoadedObject, kind: str, fds: dict[str, int]) -> None:
    """Initial values of map-in-maps ("maps") or program arrays ("progs"), as libbpf
    sets them: maps once all exist, programs once loaded (slots of programs not
    loaded stay empty)."""
    for m in obj.spec.maps.values():
        if m.values_kind != kind:
            continue
        for slot, target in sorted(m.init.items()):
            if target not in fds:
                continue
            try:
                obj.maps[m.real_name].update(slot, struct.pack("<I", fds[target]))
            except OSError as e:
                raise LoadError(
                    f"object {obj.spec.name!r}: setting {m.real_name}[{slot}] = {target}: {e}"
                ) from e


def _create_map(obj: LoadedObject, m: MapSpec) -> Map:
    if m.inner is None:
        return _create_map_with(obj, m, -1)
    template = _create_map(obj, m.inner)  # for the kernel's checks, closed once used
    try:
        return _create_map_with(obj, m, template.fileno())
    finally:
        template.close()


def _create_map_with(obj: LoadedObject, m: MapSpec, inner_fd: int) -> Map:
    btf_fd = obj.btf_fd if obj.btf_fd >= 0 else 0
    key_id, value_id = (m.key_type_id, m.value_type_id) if btf_fd else (0, 0)
    if m.map_type in C.MAP_TYPES_WITHOUT_BTF:
        btf_fd, key_id, value_id = 0, 0, 0
    max_entries = m.max_entries
    if m.map_type == C.MapType.PERF_EVENT_ARRAY and not max_entries:
        max_entries = bpfsys.possible_cpus()
    try:
        fd = bpfsys.map_create(
            m.map_type,
            m.key_size,
            m.value_size,
            max_entries,
            flags=m.flags,
            name=m.name,
            btf_fd=btf_fd,
            btf_key_type_id=key_id,
            btf_value_type_id=value_id,
            map_extra=m.map_extra,
            numa_node=m.numa_node,
            inner_map_fd=max(inner_fd, 0),
        )
    except bpfsys.BpfError as e:
        raise LoadError(
            f"object {obj.spec.name!r}: creating map {m.real_name!r} failed: {e}"
        ) from e
    result = Map(
        fd,
        name=m.name,
        map_type=m.map_type,
        key_size=m.key_size,
        value_size=m.value_size,
        max_entries=max_entries,
        flags=m.flags,
        btf=obj.spec.btf,
        key_type_id=m.key_type_id,
        value_type_id=m.value_type_id,
    )
    data = _kconfig_value(obj) if m.real_name == ".kconfig" else m.data
    if data is not None:
        try:
            bpfsys.map_update_elem(fd, b"\0\0\0\0", bytes(data))
            if m.freeze:
                bpfsys.map_freeze(fd)
        except bpfsys.BpfError as e:
            result.close()
            raise LoadError(
                f"object {obj.spec.name!r}: filling global data {m.real_name!r} failed: {e}"
            ) from e
    return result


def _kconfig_value(obj: LoadedObject) -> bytes:
    """The .kconfig map's value: this kernel's config and version (kconfig.py)."""
    spec = obj.spec
    assert spec.btf is not None  # externs need BTF
    try:
        return kconfig_data(spec.btf, spec.externs, spec.kconfig_size)
    except (ExternError, KconfigError) as e:
        raise LoadError(f"object {spec.name!r}: {e}") from e


def _freeze(obj: LoadedObject, m: MapSpec, kmap: Map) -> None:
    where = f"object {obj.spec.name!r}: making map {m.real_name!r} read-only"
    if m.map_type == C.MapType.RINGBUF:
        # A frozen ring buffer refuses the writable mapping of its consumer page.
        raise LoadError(f"{where}: a ring buffer cannot be frozen and still be consumed")
    try:
        bpfsys.map_freeze(kmap.fileno())
    except bpfsys.BpfError as e:
        why = str(e)
        if e.errno in (bpfsys.ENOTSUPP, errno.EOPNOTSUPP):
            why = "its value holds a field the kernel cannot freeze (spin lock, timer, kptr...)"
        raise LoadError(f"{where}: {why}") from e


def _relocate_core(spec: ObjectSpec, named: Collection[str] | None) -> dict[str, bytearray]:
    """CO-RE: the patched code of every autoload program (or only those named),
    against this kernel. A named subset without relocations needs no kernel
    BTF: a catalog object's tracefs build loads where its tp_btf build cannot."""
    if not has_core_relos(spec, named):
        return {}
    try:
        return core_relocate(spec, kernel_target(), also=named or (), only=named).insns
    except CoreError as e:
        raise LoadError(f"object {spec.name!r}: {e}") from e


def _load_program(
    obj: LoadedObject, p: ProgramSpec, core: dict[str, bytearray] | None = None
) -> LoadedProgram:
    spec = obj.spec
    linked = spec.link_program(p.name, core)
    insns = linked.insns
    for idx, map_name, kind, offset in linked.map_refs:
        if kind in ("ksym", "kfunc"):
            _patch_extern(obj, insns, idx, spec.externs[map_name])
            continue
        fd = obj.maps[map_name].fileno()
        at = idx * C.INSN_SIZE
        code, regs, off, imm = SLOT.unpack_from(insns, at)
        src = C.BPF_PSEUDO_MAP_FD if kind == "map" else C.BPF_PSEUDO_MAP_VALUE
        if kind == "data":
            # The second slot of ld_imm64 carries the offset into the value.
            c2, r2, o2, imm2 = SLOT.unpack_from(insns, at + C.INSN_SIZE)
            SLOT.pack_into(insns, at + C.INSN_SIZE, c2, r2, o2, imm + offset)
        SLOT.pack_into(insns, at, code, (regs & 0x0F) | (src << 4), off, fd)

    kwargs: dict[str, object] = {}
    if obj.btf_fd >= 0 and spec.btf_ext is not None and linked.func_info:
        ext = spec.btf_ext
        kwargs.update(
            prog_btf_fd=obj.btf_fd,
            func_info=ext.encode_func_info(linked.func_info),
            func_info_rec_size=ext.func_info_rec_size,
            line_info=ext.encode_line_info(linked.line_info),
            line_info_rec_size=ext.line_info_rec_size,
        )
    btf_id, btf_obj_fd = _attach_target(spec, p)
    try:
        fd = bpfsys.prog_load(
            p.prog_type,
            bytes(insns),
            spec.license,
            name=_prog_name(p.name),
            expected_attach_type=p.expected_attach_type,
            kern_version=spec.kern_version,
            attach_btf_id=btf_id,
            attach_btf_obj_fd=btf_obj_fd,
            **kwargs,  # type: ignore[arg-type]
        )
    except bpfsys.BpfError as e:
        raise LoadError(
            f"object {spec.name!r}: the kernel refused program {p.name!r} "
            f"(section {p.section!r}): {e.strerror or e}{_refusal_hint(p, e)}",
            log=e.log,
        ) from e
    finally:
        if btf_obj_fd:
            os.close(btf_obj_fd)
    _bind_rodata(obj, fd)
    info = bpfsys.prog_info(fd)
    return LoadedProgram(p.name, fd, info.id, p, linked)


def _refusal_hint(p: ProgramSpec, e: bpfsys.BpfError) -> str:
    """Why a refusal with no verifier log is likely, where the kernel does not say."""
    if p.attach_kind in ("fentry", "fexit") and e.errno == errno.EPERM and not e.log:
        return (
            " before verifying it: this kernel refuses BPF trampolines (fentry/fexit), "
            "as it does for libbpf (docs/BPF-ABI.md); use tp_btf, a raw tracepoint or a kprobe"
        )
    return ""


def _bind_rodata(obj: LoadedObject, prog_fd: int) -> None:
    """libbpf binds the object's .rodata map to every program, even one that never
    reads it (so its metadata travels with the program); so does gfxbpf, for the
    same map set. Kernels before 5.10 lack the command: skipped there, as libbpf does."""
    rodata = obj.maps.get(".rodata")
    if rodata is None:
        return
    try:
        bpfsys.prog_bind_map(prog_fd, rodata.fileno())
    except bpfsys.BpfError as e:
        if e.errno != errno.EINVAL:
            os.close(prog_fd)
            raise LoadError(f"object {obj.spec.name!r}: binding .rodata failed: {e}") from e


def _patch_extern(obj: LoadedObject, insns: bytearray, idx: int, e: Extern) -> None:
    """A ksym ld_imm64 or kfunc call, resolved on the running kernel as libbpf does."""
    try:
        how, value = resolve_ksym(e)
    except (ExternError, OSError) as err:
        raise LoadError(f"object {obj.spec.name!r}: {err}") from err
    at = idx * C.INSN_SIZE
    code, regs, off, _imm = SLOT.unpack_from(insns, at)
    if code == CODE_CALL:  # id 0: an unresolved __weak kfunc, left to dead-code removal
        src = C.BPF_PSEUDO_KFUNC_CALL
        SLOT.pack_into(insns, at, code, (regs & 0x0F) | (src << 4), 0, value)
        return
    c2, r2, o2, _ = SLOT.unpack_from(insns, at + C.INSN_SIZE)
    if how == "btf_id" and value:  # typed ksym, or a kfunc's address: the verifier's to fill
        SLOT.pack_into(insns, at, code, (regs & 0x0F) | (C.BPF_PSEUDO_BTF_ID << 4), off, value)
        SLOT.pack_into(insns, at + C.INSN_SIZE, c2, r2, o2, 0)  # vmlinux, not a module
        return
    # A kernel address (typeless ksym), or 0 for an unresolved __weak one.
    lo, hi = value & 0xFFFFFFFF, value >> 32
    SLOT.pack_into(insns, at, code, regs & 0x0F, off, lo - (1 << 32) if lo >= 1 << 31 else lo)
    SLOT.pack_into(insns, at + C.INSN_SIZE, c2, r2, o2, hi - (1 << 32) if hi >= 1 << 31 else hi)


def _attach_target(spec: ObjectSpec, p: ProgramSpec) -> tuple[int, int]:
    """tp_btf, fentry, iter...: (type id, module BTF fd or 0 for vmlinux); (0, 0) otherwise.

    The caller closes a module BTF fd once the program is loaded."""
    if p.attach_btf_name is None:
        return 0, 0
    try:
        t = find_type(p.attach_btf_name, p.attach_btf_kind)
        return t.type_id, (0 if t.module == "vmlinux" else module_btf_fd(t.module))
    except KernelBtfError as e:
        raise LoadError(
            f"object {spec.name!r}: program {p.name!r} (section {p.section!r}): {e}"
        ) from e


def _prog_name(name: str) -> str:
    # The kernel keeps 15 chars of [A-Za-z0-9_.]; libbpf passes the name cut to fit.
    return name[: C.BPF_OBJ_NAME_LEN - 1]
