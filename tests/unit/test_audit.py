"""The broker's static audit (broker/review/checks.py), offline: catalog objects pass,
forbidden helpers, kfuncs, program types and sizes are refused, and the
committed test objects are what clang builds from their sources."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.broker.access.budget import map_bytes
from gfxbpf.broker.review import checks
from gfxbpf.catalog.entries import load_catalog

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = ROOT / "tests" / "data" / "objects"
TEST_OBJECTS = ("probe_write_user", "trace_printk", "ksym_address")
_CALL = 0x85


def catalog_spec(name: str) -> ObjectSpec:
    entry = load_catalog().get(name)
    return ObjectSpec.parse((entry.directory / entry.object).read_bytes(), name)


def patch_helper(spec: ObjectSpec, program: str, old: int, new: int, src: int = 0) -> None:
    """Rewrite the first call of helper `old` in program's own instructions."""
    p = spec.programs[program]
    insns = bytearray(p.insns)
    for at in range(0, len(insns), 8):
        code, regs, off, imm = SLOT.unpack_from(insns, at)
        if code == _CALL and regs >> 4 == 0 and imm == old:
            SLOT.pack_into(insns, at, code, (regs & 0x0F) | (src << 4), off, new)
            p.insns = bytes(insns)
            return
    raise AssertionError(f"{program} calls no helper {old}")


@pytest.mark.parametrize("name", [p.name for p in load_catalog()])
def test_every_catalog_object_passes(name: str) -> None:
    report = checks.audit_spec(catalog_spec(name), ncpus=64)
    assert report.ok, report.problems
    assert report.programs and all(p.insn_count > 0 for p in report.programs)
    assert report.verdict() == "accepted"
    # Everything the catalog programs call is on the allowlist, by name.
    for p in report.programs:
        assert set(p.helpers) <= checks.ALLOWED_HELPERS


def test_probe_write_user_object_refused() -> None:
    data = (OBJECTS / "probe_write_user.bpf.o").read_bytes()
    report = checks.audit_bytes(data, "probe_write_user")
    assert not report.ok
    assert report.sha256 == hashlib.sha256(data).hexdigest()
    assert [p.name for p in report.programs] == ["clobber_path"]
    assert "probe_write_user" in report.programs[0].helpers
    assert len(report.problems) == 1
    assert "bpf_probe_write_user" in report.problems[0]
    assert "clobber_path" in report.problems[0]
    with pytest.raises(checks.AuditError, match="probe_write_user"):
        checks.check(ObjectSpec.parse(data, "probe_write_user"))


def test_trace_printk_object_refused() -> None:
    report = checks.audit_bytes((OBJECTS / "trace_printk.bpf.o").read_bytes(), "trace_printk")
    assert not report.ok
    assert len(report.problems) == 1
    assert "bpf_trace_printk" in report.problems[0]
    assert "trace pipe" in report.problems[0]
    text = report.text()
    assert "helpers: trace_printk" in text
    assert text.splitlines()[-1].startswith("verdict: refused")


def test_ksym_address_object_refused() -> None:
    data = (OBJECTS / "ksym_address.bpf.o").read_bytes()
    report = checks.audit_bytes(data, "ksym_address")
    assert len(report.problems) == 1, report.problems  # only the extern stops it
    assert "loads __ksym vfs_read" in report.problems[0]
    assert "kernel address" in report.problems[0]


def test_forbidden_helper_in_a_subprogram_is_seen_after_linking() -> None:
    # execsnoop's fill_event (.text) calls get_current_comm (16); make it
    # probe_write_user (36): the audit must see it in process_exec.
    spec = catalog_spec("execsnoop")
    assert spec.programs["fill_event"].is_subprog
    patch_helper(spec, "fill_event", 16, 36)
    report = checks.audit_spec(spec)
    assert not report.ok
    assert any("process_exec" in p and "bpf_probe_write_user" in p for p in report.problems), (
        report.problems
    )


@pytest.mark.parametrize(
    ("helper", "words"),
    [
        (58, "override_return"),
        (109, "send_signal"),
        (117, "send_signal_thread"),
        (177, "trace_vprintk"),
        (35, "get_current_task"),
    ],
)
def test_dangerous_helpers_refused(helper: int, words: str) -> None:
    spec = catalog_spec("syscount")
    patch_helper(spec, "sys_enter", 15, helper)  # get_current_uid_gid -> helper
    report = checks.audit_spec(spec)
    assert not report.ok
    assert f"bpf_{words} " in report.problems[0]


def test_a_callback_may_only_go_to_bpf_find_vma() -> None:
    # stackcopy passes bpf_find_vma callbacks (gfx_python.h, in the global
    # function gfx_py_walk, a subprogram); the same callbacks handed to
    # bpf_loop (181) instead are refused twice over.
    spec = catalog_spec("stackcopy")
    assert checks.audit_spec(spec).ok
    patched = 0
    for name in list(spec.programs):
        while patched < 100:
            try:
                patch_helper(spec, name, 180, 181)
            except AssertionError:  # no bpf_find_vma call left here
                break
            patched += 1
    assert patched >= 1
    report = checks.audit_spec(spec)
    assert not report.ok
    assert any("bpf_loop" in p and "allowlist" in p for p in report.problems), report.problems
    assert any("callback function pointer" in p for p in report.problems), report.problems


def test_unknown_helper_refused_as_not_allowlisted() -> None:
    spec = catalog_spec("syscount")
    patch_helper(spec, "sys_enter", 15, 9)  # skb_store_bytes: not for tracing
    report = checks.audit_spec(spec)
    assert not report.ok
    assert "not on the broker's helper allowlist" in report.problems[0]


def test_kfunc_call_refused() -> None:
    spec = catalog_spec("syscount")
    patch_helper(spec, "sys_enter", 15, 12345, src=C.BPF_PSEUDO_KFUNC_CALL)
    report = checks.audit_spec(spec)
    assert not report.ok
    assert any("kfunc" in p and "12345" in p for p in report.problems), report.problems


def test_program_type_refused() -> None:
    spec = catalog_spec("syscount")
    spec.programs["sys_enter"].prog_type = C.ProgType.TRACING
    report = checks.audit_spec(spec)
    assert not report.ok
    assert "not an allowed program kind" in report.problems[0]
    # KPROBE as a tracepoint is no kind the table knows.
    spec = catalog_spec("syscount")
    spec.programs["sys_enter"].prog_type = C.ProgType.KPROBE
    assert not checks.audit_spec(spec).ok
    assert checks.audit_spec(catalog_spec("ucalls")).ok


def test_size_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = catalog_spec("syscount")
    n = checks.audit_spec(spec).programs[0].insn_count
    monkeypatch.setattr(checks, "MAX_PROGRAM_INSNS", n - 1)
    report = checks.audit_spec(spec)
    assert any(f"{n} instructions" in p for p in report.problems), report.problems

    monkeypatch.setattr(checks, "MAX_PROGRAM_INSNS", 1 << 20)
    spec = catalog_spec("execsnoop")
    mem = checks.audit_spec(spec).map_memory
    assert mem >= 256 * 1024  # the ring buffer alone
    monkeypatch.setattr(checks, "MAX_MAP_MEMORY", mem - 1)
    assert any("bytes, more than the limit" in p for p in checks.audit_spec(spec).problems)

    monkeypatch.setattr(checks, "MAX_MAPS", 1)
    assert any("maps, more than the limit" in p for p in checks.audit_spec(spec).problems)


def test_per_cpu_memory_scales_with_cpus() -> None:
    one = checks._map_memory(C.MapType.PERCPU_ARRAY, 4, 4096, 100, 0, 1)
    assert checks._map_memory(C.MapType.PERCPU_ARRAY, 4, 4096, 100, 0, 4) > 3 * one
    # The map budget's estimate: one model for the audit and the budget.
    for shape in ((C.MapType.HASH, 4, 8, 10, 0, 4), (C.MapType.RINGBUF, 0, 0, 1 << 20, 0, 4)):
        assert checks._map_memory(*shape) == map_bytes(*shape)
    assert checks._map_memory(C.MapType.RINGBUF, 0, 0, 1 << 20, 0, 4) >= 1 << 20


def test_garbage_is_a_refusal_not_a_crash() -> None:
    for data in (b"", b"\x7fELF" + b"\0" * 60, b"not an object at all"):
        report = checks.audit_bytes(data)
        assert not report.ok
        assert report.problems[0].startswith("not a usable BPF object")


def test_allowlist_never_holds_a_forbidden_helper() -> None:
    assert not checks.ALLOWED_HELPERS & set(checks.FORBIDDEN_HELPERS)
    for name in ("probe_write_user", "override_return", "send_signal", "trace_printk"):
        assert name in checks.FORBIDDEN_HELPERS


def test_readme_lists_the_committed_hashes() -> None:
    readme = (OBJECTS / "README.md").read_text()
    for name in TEST_OBJECTS:
        digest = hashlib.sha256((OBJECTS / f"{name}.bpf.o").read_bytes()).hexdigest()
        assert re.search(rf"{digest}\s+{name}\.bpf\.o", readme), name
