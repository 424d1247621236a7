"""Offline tests of ELF object parsing and linking (no kernel)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.object import ObjectSpec, internal_map_name
from gfxbpf.bpf.specs import ObjectError, UnsupportedError
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path
from tests.conftest import compile_bpf

CATALOG = load_catalog()
HEADER = """
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
"""


def build(tmp_path: Path, source: str, name: str = "t") -> bytes:
    """Compile a small BPF C source with clang, as the catalog build does."""
    return compile_bpf(HEADER + source, tmp_path, name).read_bytes()


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_catalog_objects_parse(entry) -> None:
    spec = ObjectSpec.from_file(object_path(entry))
    assert spec.license == "GPL"
    assert spec.btf is not None
    mains = [p for p in spec.programs.values() if not p.is_subprog]
    assert mains, "an object without programs"
    for p in mains:
        linked = spec.link_program(p.name)
        assert len(linked.insns) >= len(p.insns)
        # Every map reference names a map of the object.
        assert {ref[1] for ref in linked.map_refs} <= set(spec.maps)
        # One func_info per function (program + appended subprograms).
        assert len(linked.func_info) == 1 + len(linked.subprogs)
    assert ".rodata" in spec.maps or entry.name in ("vmabind", "cgroupcpu")  # no knob


def test_internal_map_names_follow_libbpf() -> None:
    assert internal_map_name("minimal", ".bss") == "minimal.bss"
    assert internal_map_name("my_object_name", ".rodata") == "my_objec.rodata"
    assert internal_map_name("my_object_name", ".bss") == "my_objec.bss"
    assert internal_map_name("execsnoop", ".rodata") == "execsnoo.rodata"
    assert internal_map_name("x", ".rodata.str1.1") == ".rodata.str1.1"
    assert internal_map_name("x", ".rodata.abracadabra") == ".rodata.abracad"


def test_execsnoop_spec_and_knobs() -> None:
    spec = ObjectSpec.from_file(object_path(CATALOG.get("execsnoop")))
    prog = spec.programs["process_exec"]
    assert prog.prog_type == C.ProgType.TRACEPOINT
    assert prog.attach_target == "sched/sched_process_exec"
    ro = spec.maps[".rodata"]
    assert ro.name == "execsnoo.rodata"
    assert ro.flags & C.BPF_F_RDONLY_PROG and ro.freeze
    assert spec.get_variable("target_uid") == 0xFFFFFFFF
    spec.set_variable("target_uid", 1234)
    assert spec.get_variable("target_uid") == 1234
    with pytest.raises(ValueError, match="does not fit"):
        spec.set_variable("target_uid", 1 << 40)
    with pytest.raises(KeyError, match="no global variable 'nope'.*target_uid"):
        spec.set_variable("nope", 1)
    ev = spec.maps["events"]
    assert ev.map_type == C.MapType.RINGBUF and ev.max_entries == 256 * 1024


def test_subprogram_linking(tmp_path: Path) -> None:
    data = build(
        tmp_path,
        """
        struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1);
                 __type(key, __u32); __type(value, __u64); } cnt SEC(".maps");
        static __attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
        static __attribute__((noinline)) int mid(int x) { return leaf(x) + leaf(x + 1); }
        __attribute__((noinline)) int glob(int x) { return mid(x) ^ 5; }
        SEC("raw_tracepoint/sys_enter") int a(void *ctx) {
            __u32 k = 0; __u64 *v = bpf_map_lookup_elem(&cnt, &k);
            if (v) *v += glob(1);
            return 0;
        }
        SEC("raw_tracepoint/sys_exit") int b(void *ctx) { return leaf(2); }
        """,
    )
    spec = ObjectSpec.parse(data, "t")
    assert {n for n, p in spec.programs.items() if p.is_subprog} == {"leaf", "mid", "glob"}
    la = spec.link_program("a")
    assert la.subprogs == ["glob", "mid", "leaf"]  # depth first, in call order
    lb = spec.link_program("b")
    assert lb.subprogs == ["leaf"]
    # Each call now points at the start of the appended copy.
    insns = bytes(la.insns)
    starts = {}
    pos = len(spec.programs["a"].insns) // 8
    for name in la.subprogs:
        starts[pos] = name
        pos += spec.programs[name].insn_count
    for i in range(len(insns) // 8):
        code, regs, _off, imm = SLOT.unpack_from(insns, i * 8)
        if code == 0x85 and regs >> 4 == 1:
            assert i + imm + 1 in starts
    assert [r for r in la.map_refs if r[1] == "cnt"]


@pytest.mark.parametrize(
    "source, message",
    [
        ('SEC("xdp") int x(void *ctx) { return 2; }', "networking/cgroup program type"),
        ('SEC("lsm/file_open") int f(void *ctx) { return 0; }', "tracing programs only"),
        (
            """struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 4);
                        __uint(value_size, 4); } q SEC(".maps");
               SEC("raw_tracepoint/sys_enter") int p(void *ctx) {
                   __u32 v = 1; bpf_map_push_elem(&q, &v, 0); return 0; }""",
            "map type queue is not supported",
        ),
    ],
    ids=["xdp", "lsm", "queue-map"],
)
def test_unsupported_objects_are_refused(tmp_path: Path, source: str, message: str) -> None:
    data = build(tmp_path, source)
    with pytest.raises(UnsupportedError, match=message):
        ObjectSpec.parse(data, "t")


def test_not_elf_and_empty() -> None:
    with pytest.raises(ObjectError, match="not an ELF"):
        ObjectSpec.parse(b"hello world" * 10)
    with pytest.raises(ObjectError):
        ObjectSpec.parse(b"")
    with pytest.raises(ObjectError, match="truncated"):
        ObjectSpec.parse(b"\x7fELF")


def _mutations(data: bytes, rng: random.Random, n: int):
    size = len(data)
    for cut in range(0, size, max(1, size // 60)):
        yield data[:cut]
    for _ in range(n):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(size)] = rng.randrange(256)
        yield bytes(b)


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_corrupt_objects_raise_object_error_only(entry) -> None:
    """Truncated or corrupted ELF/BTF: a clear ObjectError, never a crash or a hang."""
    data = Path(object_path(entry)).read_bytes()
    rng = random.Random(entry.name)
    start = time.monotonic()
    failures = 0
    for mutated in _mutations(data, rng, 150):
        try:
            spec = ObjectSpec.parse(mutated, entry.name)
            for p in spec.programs.values():
                if not p.is_subprog:
                    spec.link_program(p.name)
        except ObjectError as e:
            assert str(e)
            failures += 1
    assert failures > 60  # most of the mutations are caught
    assert time.monotonic() - start < 60


def test_corrupt_btf_section_is_named(tmp_path: Path) -> None:
    data = bytearray(Path(object_path(CATALOG.get("syscount"))).read_bytes())
    at = bytes(data).find(b"\x9f\xeb\x01")  # BTF magic (little endian) + version
    assert at > 0
    data[at] = 0  # break the magic
    with pytest.raises(ObjectError, match="BTF"):
        ObjectSpec.parse(bytes(data), "syscount")


def test_object_from_missing_file_is_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ObjectSpec.from_file(os.fspath(tmp_path / "missing.o"))


def test_a_callback_becomes_a_pseudo_func_load(tmp_path: Path) -> None:
    # clang leaves a function's address as an ld_imm64 of .text + byte offset;
    # linked, it is a BPF_PSEUDO_FUNC load whose imm reaches the callback's
    # appended copy (relative to the next instruction, like a call).
    data = build(
        tmp_path,
        """
        struct ctxv { __u64 n; };
        static long first(void *task, void *vma, struct ctxv *c) { c->n += 1; return 0; }
        static long second(void *task, void *vma, struct ctxv *c) { c->n += 2; return 1; }
        SEC("perf_event") int p(void *ctx) {
            struct ctxv c = {};
            void *t = bpf_get_current_task_btf();
            bpf_find_vma(t, 0x1000, second, &c, 0);
            bpf_find_vma(t, 0x2000, first, &c, 0);
            return c.n;
        }
        """,
    )
    spec = ObjectSpec.parse(data, "t")
    linked = spec.link_program("p")
    assert linked.subprogs == ["second", "first"]  # in the order they are met
    starts, pos = {}, spec.programs["p"].insn_count
    for name in linked.subprogs:
        starts[pos] = name
        pos += spec.programs[name].insn_count
    loads = []
    for i in range(len(linked.insns) // 8):
        code, regs, _off, imm = SLOT.unpack_from(linked.insns, i * 8)
        if code == 0x18 and regs >> 4 == C.BPF_PSEUDO_FUNC:
            loads.append(starts[i + imm + 1])
    assert loads == ["second", "first"]
    assert len(linked.func_info) == 3  # the verifier needs one per callback too
