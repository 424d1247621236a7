"""execsnoop's BTF-typed build (issue #14 item 5), offline.

Its CO-RE reads follow the target kernel's layout (a stand-in kernel whose
task_struct.pid and linux_binprm.filename moved: tests/data/core/target_exec),
the tracefs build carries no CO-RE relocation (it loads without kernel BTF),
and the variant choice takes the tp_btf build only where BTF has its target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.core.apply import CoreRecord
from gfxbpf.bpf.core.target import Target
from gfxbpf.bpf.corerelo import has_core_relos, relocate
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

DATA = Path(__file__).resolve().parent.parent / "data" / "core"
ENTRY = load_catalog().get("execsnoop")


def _spec() -> ObjectSpec:
    return ObjectSpec.from_file(str(object_path(ENTRY)))


def _target() -> Target:
    return Target.from_blobs(ObjectSpec.from_file(str(DATA / "target_exec.bpf.o")).btf_bytes)


def _record(records: list[CoreRecord], local: str) -> CoreRecord:
    hits = [r for r in records if r.kind_name == "byte_off" and r.local == local]
    assert len(hits) == 1, [(r.kind_name, r.local) for r in records]
    return hits[0]


def test_btf_build_reads_follow_the_target_layout() -> None:
    spec = _spec()
    core = relocate(spec, _target(), only=["process_exec_btf"])
    assert {r.program for r in core.records} == {"process_exec_btf"}
    code = core.insns["process_exec_btf"]
    for local, offset in (("struct task_struct.pid", 24), ("struct linux_binprm.filename", 136)):
        r = _record(core.records, local)
        assert r.result is not None and not r.result.poison
        assert r.result.new_val == offset
        # A direct load through the typed pointer: its offset field is patched.
        op, _regs, off, _imm = SLOT.unpack_from(code, r.insn * 8)
        assert op & 0x07 == 0x01 and off == offset  # BPF_LDX ... at the target's offset


def test_tracefs_build_needs_no_kernel_btf() -> None:
    spec = _spec()
    assert not has_core_relos(spec, ["process_exec"])
    assert has_core_relos(spec, ["process_exec_btf"]) and has_core_relos(spec)
    assert relocate(spec, _target(), only=["process_exec"]).records == []


@pytest.mark.parametrize(("btf", "want"), [(True, "btf"), (False, "tracefs")])
def test_variant_prefers_the_btf_build_where_the_kernel_has_its_type(btf: bool, want: str) -> None:
    asked: list[str] = []

    def btf_exists(name: str) -> bool:
        asked.append(name)
        return btf

    assert instance.choose_variant(ENTRY, lambda _s, _e: True, btf_exists) == want
    assert asked == ["sched_process_exec"]
    attach = ENTRY.attach_for(want)
    assert [a.kind for a in attach] == (["tp_btf"] if btf else ["tracepoint"])
    assert [f.knob for f in ENTRY.fields_for(want)] == ([] if btf else ["off_pid", "off_filename"])


def test_neither_build_available_says_both_needs() -> None:
    with pytest.raises(instance.Unavailable) as e:
        instance.choose_variant(ENTRY, lambda _s, _e: False, lambda _n: False)
    assert str(e.value) == (
        "tracepoint sched:sched_process_exec does not exist on this kernel: the subsystem "
        "that provides it is not built or loaded; tried variants btf (needs kernel BTF with "
        "btf_trace_sched_process_exec), tracefs (needs sched/sched_process_exec)"
    )
