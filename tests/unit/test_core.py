"""CO-RE relocations resolved offline against stored target BTF.

tests/data/core/core_kinds.bpf.o holds every relocation kind clang 14 emits;
target_new.bpf.o and target_old.bpf.o stand in for two kernels (only their
BTF is used). Expected values follow from the C layouts in those sources
(x86-64 ABI), worked out in the comments. Sources and the build command:
tools/build_bpf.py, which checks the committed objects for drift.
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path

import pytest

from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.btf.encode import encode_types
from gfxbpf.bpf.btf.kinds import KIND_STRUCT, Int, Member, Struct, Void
from gfxbpf.bpf.core.apply import CoreRecord, CoreResult
from gfxbpf.bpf.core.match import types_match
from gfxbpf.bpf.core.patch import POISON_IMM, patch
from gfxbpf.bpf.core.relo import CoreError, CoreKind, essential_name, parse_spec
from gfxbpf.bpf.core.resolve import Resolution
from gfxbpf.bpf.core.target import Target
from gfxbpf.bpf.corerelo import relocate
from gfxbpf.bpf.kernel.vmlinux import kernel_target, module_order
from gfxbpf.bpf.object import ObjectSpec

DATA = Path(__file__).resolve().parent.parent / "data" / "core"


@cache
def spec() -> ObjectSpec:
    return ObjectSpec.from_file(str(DATA / "core_kinds.bpf.o"))


def target_btf(name: str) -> bytes:
    return ObjectSpec.from_file(str(DATA / f"{name}.bpf.o")).btf_bytes


def run(name: str) -> CoreResult:
    return relocate(spec(), Target.from_blobs(target_btf(name)), strict=False)


def find(core: CoreResult, program: str, kind: str, local: str) -> CoreRecord:
    hits = [
        r for r in core.records if r.program == program and r.kind_name == kind and r.local == local
    ]
    assert hits, f"no {kind} relocation of {local} in {program}"
    return hits[0]


def value(core: CoreResult, program: str, kind: str, local: str) -> int:
    r = find(core, program, kind, local)
    assert r.result is not None and not r.result.poison, r
    return r.result.new_val


def insn(core: CoreResult, r: CoreRecord, at: int = 0) -> tuple[int, int, int, int]:
    code, regs, off, imm = SLOT.unpack_from(core.insns[r.program], (r.insn + at) * 8)
    return code, regs, off, imm


def is_poisoned(core: CoreResult, r: CoreRecord) -> bool:
    return r.result is not None and r.result.poison and insn(core, r) == (0x85, 0, 0, POISON_IMM)


TS = "struct task_struct"


def test_field_offsets_follow_each_layout() -> None:
    new, old = run("target_new"), run("target_old")
    # new: pad0@0, __state@8, pid@16, anonymous {anon_a@20, anon_b@24}, comm@28
    assert value(new, "fields", "byte_off", f"{TS}.pid") == 16
    assert value(new, "fields", "byte_off", f"{TS}.anon_b") == 24  # found inside the anon struct
    assert value(new, "fields", "byte_off", f"{TS}.comm") == 28
    # old: pid@0, state@8, anon_b@16, comm[8]@20
    assert value(old, "fields", "byte_off", f"{TS}.pid") == 0
    assert value(old, "fields", "byte_off", f"{TS}.anon_b") == 16
    assert value(old, "fields", "byte_sz", f"{TS}.comm") == 8
    # The patched instruction carries the value (BPF_CORE_READ: r = imm).
    r = find(new, "fields", "byte_off", f"{TS}.pid")
    assert insn(new, r)[3] == 16
    # total_vm through the mm pointer: first member of mm_struct in both.
    assert value(new, "fields", "byte_off", "struct mm_struct.total_vm") == 0


def test_flavoured_struct_and_field_exists_pick_the_layout() -> None:
    new, old = run("target_new"), run("target_old")
    assert value(new, "fields", "field_exists", f"{TS}.__state") == 1
    assert value(new, "fields", "byte_off", f"{TS}.__state") == 8
    # task_struct___old is matched to task_struct by its essential name.
    assert is_poisoned(new, find(new, "fields", "byte_off", "struct task_struct___old.state"))
    assert value(old, "fields", "field_exists", f"{TS}.__state") == 0
    assert is_poisoned(old, find(old, "fields", "byte_off", f"{TS}.__state"))
    assert value(old, "fields", "byte_off", "struct task_struct___old.state") == 8


def test_missing_field_guarded_by_exists_is_poisoned() -> None:
    for core in (run("target_new"), run("target_old")):
        assert value(core, "fields", "field_exists", f"{TS}.missing") == 0
        r = find(core, "fields", "byte_off", f"{TS}.missing")
        assert is_poisoned(core, r)
        assert r.result is not None and "missing" in r.result.why


def test_bitfields() -> None:
    new, old = run("target_new"), run("target_old")
    # new: `unsigned flags_lo:3, prio:5; int nice:7` at byte 44: prio is bits
    # 355..359 of the struct, nice 360..366; one aligned u32 load at 44 holds both.
    prio = {k: value(new, "bitfields", k, f"{TS}.prio") for k in _BITFIELD_KINDS}
    assert prio == {"byte_off": 44, "byte_sz": 4, "lshift_u64": 56, "rshift_u64": 59, "signed": 0}
    nice = {k: value(new, "bitfields", k, f"{TS}.nice") for k in _BITFIELD_KINDS}
    assert nice == {"byte_off": 44, "byte_sz": 4, "lshift_u64": 49, "rshift_u64": 57, "signed": 1}
    # old: prio is a plain unsigned char at 28; nice `unsigned short :9` does
    # not fit the short at 28 after it, so it starts the next one, at 30.
    prio = {k: value(old, "bitfields", k, f"{TS}.prio") for k in _BITFIELD_KINDS}
    assert prio == {"byte_off": 28, "byte_sz": 1, "lshift_u64": 56, "rshift_u64": 56, "signed": 0}
    nice = {k: value(old, "bitfields", k, f"{TS}.nice") for k in _BITFIELD_KINDS}
    assert nice == {"byte_off": 30, "byte_sz": 2, "lshift_u64": 55, "rshift_u64": 55, "signed": 0}


_BITFIELD_KINDS = ("byte_off", "byte_sz", "lshift_u64", "rshift_u64", "signed")


def test_type_kinds() -> None:
    new, old = run("target_new"), run("target_old")
    assert value(new, "types", "type_exists", "struct only_new") == 1
    assert value(old, "types", "type_exists", "struct only_new") == 0
    assert value(new, "types", "type_exists", "struct not_anywhere") == 0
    assert value(new, "types", "type_size", "struct not_anywhere") == 0
    # 4+pad, 8, 4, 8 (anon), 16, 4 (bitfields), 4 (nice), 8 (mm), 4, 4, 0 (tail[]) -> 64
    assert value(new, "types", "type_size", TS) == 64
    assert value(old, "types", "type_size", TS) == 56
    # A union is not a struct: u_thing is a union in new, a struct in old.
    assert value(new, "types", "type_exists", "union u_thing") == 1
    assert value(old, "types", "type_exists", "union u_thing") == 0
    local_id = spec().btf.find("task_struct", KIND_STRUCT)  # type: ignore[union-attr]
    assert value(new, "types", "local_type_id", TS) == local_id
    table = Target.from_blobs(target_btf("target_old")).vmlinux.table
    assert value(old, "types", "target_type_id", TS) == table.find("task_struct", KIND_STRUCT)


def test_enum_values() -> None:
    new, old = run("target_new"), run("target_old")
    assert value(new, "enums", "enumval_value", "enum rq_state::RQ_BUSY") == 20
    assert value(old, "enums", "enumval_value", "enum rq_state::RQ_BUSY") == 3
    assert value(new, "enums", "enumval_exists", "enum rq_state::RQ_OLD") == 0
    assert value(old, "enums", "enumval_exists", "enum rq_state::RQ_OLD") == 1
    assert value(old, "enums", "enumval_value", "enum rq_state::RQ_OLD") == 2
    # A missing enumerator's value is an ld_imm64: both slots are poisoned.
    r = find(new, "enums", "enumval_value", "enum rq_state::RQ_OLD")
    assert is_poisoned(new, r) and insn(new, r, 1) == (0x85, 0, 0, POISON_IMM)


def test_direct_loads_change_offset_and_size() -> None:
    old = run("target_old")
    r = find(old, "direct", "byte_off", f"{TS}.usage")
    code, _, off, _ = insn(old, r)
    assert off == 40 and code & 0x18 == 0x18  # unsigned int -> unsigned long: now a u64 load
    weight = find(old, "direct", "byte_off", f"{TS}.weight")
    assert is_poisoned(old, weight)  # int -> long cannot be read by resizing the load
    new = run("target_new")
    code, _, off, _ = insn(new, find(new, "direct", "byte_off", f"{TS}.usage"))
    assert off == 56 and code & 0x18 == 0  # still a u32 load


def test_ambiguous_candidates_fail() -> None:
    core = run("target_new")
    r = find(core, "ambiguous", "byte_off", "struct amb.x")
    assert r.error is not None and "ambiguous" in r.error
    with pytest.raises(CoreError, match=r"program 'ambiguous'.*ambiguous"):
        relocate(spec(), Target.from_blobs(target_btf("target_new")))
    # One candidate (target_old has no amb___v2): no ambiguity.
    assert value(run("target_old"), "ambiguous", "byte_off", "struct amb.x") == 0


def test_resolution_is_pure() -> None:
    a, b = run("target_new"), run("target_new")
    assert a.insns == b.insns
    assert spec().programs["fields"].insns != bytes(a.insns["fields"])  # the spec is untouched


def test_essential_names() -> None:
    assert essential_name("task_struct___old") == "task_struct"
    assert essential_name("a___b___c") == "a___b"
    assert essential_name("a____b") == "a____b"  # four underscores: no flavour
    assert essential_name("___x") == "___x"
    assert essential_name("plain") == "plain"


def _tm(local: str, kind: int, target: str) -> bool:
    lbtf = spec().btf
    assert lbtf is not None
    table = Target.from_blobs(target_btf(target)).vmlinux.table
    lid, tid = lbtf.find(local, kind), table.find(local, kind)
    assert lid is not None
    return tid is not None and types_match(lbtf, lid, table, tid)


def test_type_matches_rules() -> None:
    # clang 14 cannot emit TYPE_MATCHES; the rule itself, on the stored BTF.
    from gfxbpf.bpf.btf.kinds import KIND_ENUM, KIND_UNION

    assert _tm("u_thing", KIND_UNION, "target_new")  # same kind, members by name
    assert not _tm("u_thing", KIND_UNION, "target_old")  # a struct there
    assert _tm("mm_struct", KIND_STRUCT, "target_new")  # local members are a subset
    assert not _tm("task_struct", KIND_STRUCT, "target_new")  # local `missing` is absent
    assert not _tm("rq_state", KIND_ENUM, "target_new")  # RQ_OLD is absent
    assert _tm("rq_state", KIND_ENUM, "target_old")


def test_type_matches_relocation_resolves_and_patches() -> None:
    """A TYPE_MATCHES record (as clang 15 writes it) on `union u_thing`."""
    lbtf = spec().btf
    assert lbtf is not None
    from gfxbpf.bpf.btf.kinds import KIND_UNION
    from gfxbpf.bpf.core.resolve import resolve

    lid = lbtf.find("u_thing", KIND_UNION)
    assert lid is not None
    local = parse_spec(lbtf, lid, "0", CoreKind.TYPE_MATCHES)
    for target, want in (("target_new", 1), ("target_old", 0)):
        t = Target.from_blobs(target_btf(target))
        res, _ = resolve(local, t.candidates(lbtf.types[lid]))
        assert (res.orig_val, res.new_val, res.poison) == (1, want, False)
        code = bytearray(SLOT.pack(0xB7, 1, 0, 1))  # r1 = 1
        patch(code, 0, res)
        assert SLOT.unpack(code) == (0xB7, 1, 0, want)


def test_patch_refuses_an_instruction_that_disagrees() -> None:
    code = bytearray(SLOT.pack(0xB7, 1, 0, 7))  # r1 = 7, but the record says 8
    with pytest.raises(CoreError, match="expects 8"):
        patch(code, 0, Resolution(orig_val=8, new_val=16))
    code = bytearray(SLOT.pack(0x61, 0x21, 8, 0))  # r1 = *(u32 *)(r2 + 8)
    with pytest.raises(CoreError, match="does not fit"):
        patch(code, 0, Resolution(orig_val=8, new_val=1 << 15))


def _split_module(base_blob: bytes, base_types: int, base_strings: int) -> bytes:
    """A module's split BTF on top of `base`: struct only_new { int x; } (int from base)."""
    strings = b"only_new\0x\0"
    int_id = next(
        t.id for t in Target.from_blobs(base_blob).vmlinux.table.types if isinstance(t, Int)
    )
    members = [Member("x", base_strings + 9, int_id, 0, 0)]
    struct_ = Struct(base_types, KIND_STRUCT, "only_new", base_strings, False, 4, members)
    types = encode_types([Void(0, 0, "", 0, False), struct_])  # void is never written
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_module_btf_is_searched_when_vmlinux_has_no_candidate() -> None:
    base = target_btf("target_old")  # has no only_new
    table = Target.from_blobs(base).vmlinux.table
    mod = _split_module(base, len(table.types), len(table.strings))
    core = relocate(spec(), Target.from_blobs(base, {"gfxmod": mod}), strict=False)
    r = find(core, "types", "type_exists", "struct only_new")
    assert r.result is not None and r.result.new_val == 1 and r.result.target_btf == "gfxmod"
    # vmlinux candidates win: task_struct still resolves in the base.
    assert find(core, "fields", "byte_off", f"{TS}.pid").result.target_btf == "vmlinux"  # type: ignore[union-attr]


def test_programs_not_autoloaded_are_skipped_unless_named(tmp_path: Path) -> None:
    data = (DATA / "core_kinds.bpf.o").read_bytes()
    # Rename section "raw_tracepoint/direct" (in the ELF and the BTF strings) to
    # "?raw_tp/sys_in/direct": same length, same tail (the symbol name "direct"
    # shares it); "?" is libbpf's mark of a program that is not autoloaded.
    data = data.replace(b"raw_tracepoint/direct\0", b"?raw_tp/sys_in/direct\0")
    s = ObjectSpec.parse(data, "k")
    assert not s.programs["direct"].autoload
    target = Target.from_blobs(target_btf("target_old"))
    assert "direct" not in relocate(s, target).insns and "fields" in relocate(s, target).insns
    assert "direct" in relocate(s, target, also=["direct"]).insns


def test_corrupt_records_give_core_errors_only() -> None:
    """Random type ids, access strings and kinds: a CoreError or a result, nothing else."""
    import random

    rng = random.Random(14)
    base = spec()
    assert base.btf is not None and base.btf_ext is not None
    target = Target.from_blobs(target_btf("target_new"))
    strings = [base.btf.add_string(s) for s in ("0", "0:1", "0:9:3", "1:0", "0:99", ":", "x", "-1")]
    sections = list(base.btf_ext.core_relos.items())
    for _ in range(300):
        s = ObjectSpec.from_file(str(DATA / "core_kinds.bpf.o"))
        assert s.btf is not None and s.btf_ext is not None
        s.btf.strings = base.btf.strings
        sec, records = sections[rng.randrange(len(sections))]
        i = rng.randrange(len(records))
        r = records[i]
        r = r._replace(
            type_id=rng.choice([r.type_id, 0, 1, rng.randrange(len(s.btf.types) + 3)]),
            access_str_off=rng.choice([r.access_str_off, *strings]),
            kind=rng.choice([r.kind, rng.randrange(14)]),
        )
        s.btf_ext.core_relos[sec][i] = r
        try:
            relocate(s, target)
        except CoreError:
            pass


def test_kernel_target_reads_modules_from_sysfs_in_load_order(tmp_path: Path) -> None:
    base = target_btf("target_old")
    table = Target.from_blobs(base).vmlinux.table
    root = tmp_path / "btf"
    root.mkdir()
    (root / "vmlinux").write_bytes(base)
    mod = _split_module(base, len(table.types), len(table.strings))
    for name in ("zeta", "alpha", "nvidia"):
        (root / name).write_bytes(mod)
    proc = tmp_path / "modules"
    # /proc/modules lists the newest module first.
    proc.write_text("nvidia 1 0 - Live 0x0\nzeta 1 0 - Live 0x0\n")
    assert module_order(str(root), str(proc)) == ["zeta", "nvidia", "alpha"]
    t = kernel_target(str(root))
    local = spec().btf.types[spec().btf.find("only_new", KIND_STRUCT)]  # type: ignore[union-attr,index]
    found = t.candidates(local)
    assert [c.btf_name for c in found] == [m.name for m in t.modules()]
    assert {c.type_id for c in found} == {len(table.types)}  # ids continue vmlinux's


def test_kernel_without_btf_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CoreError, match="CONFIG_DEBUG_INFO_BTF"):
        kernel_target(str(tmp_path))
