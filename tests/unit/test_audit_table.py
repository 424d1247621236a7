"""The audit's table of program kinds, kfuncs and ksyms (broker/review/table.py),
applied to objects built from tests/data/programs/ and inline sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.sections import SECTION_KINDS
from gfxbpf.broker.review import checks
from gfxbpf.broker.review import table as audit_table
from tests.conftest import compile_bpf

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"
HEADER = """#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
"""


def _spec(tmp_path: Path, name: str, source: str | None = None) -> ObjectSpec:
    text = source if source is not None else (SOURCES / f"{name}.bpf.c").read_text()
    return ObjectSpec.from_file(str(compile_bpf(text, tmp_path, name)))


def test_every_loader_kind_has_a_row() -> None:
    """A kind the loader learns is refused until reviewed, but it is never forgotten."""
    known = {(int(k.prog_type), k.attach_kind) for k in SECTION_KINDS}
    assert known <= set(audit_table.PROGRAM_KINDS), known - set(audit_table.PROGRAM_KINDS)


def test_tp_btf_and_kprobe_kinds_pass(tmp_path: Path) -> None:
    report = checks.audit_spec(_spec(tmp_path, "kinds"))
    assert report.ok, report.problems
    assert {p.attach_kind for p in report.programs} == {"tp_btf", "kprobe", "ksyscall"}


def test_iterator_refused(tmp_path: Path) -> None:
    report = checks.audit_spec(_spec(tmp_path, "taskiter"))
    assert any("tracing as iter: iterators dump" in p for p in report.problems), report.problems


def test_kconfig_and_reviewed_kfuncs_pass_typeless_ksym_refused(tmp_path: Path) -> None:
    report = checks.audit_spec(_spec(tmp_path, "externs"))
    # Only the typeless ksym (vfs_read's address) is refused; kconfig and the
    # RCU kfuncs pass.
    assert len(report.problems) == 1, report.problems
    assert "loads __ksym vfs_read" in report.problems[0]
    assert "kernel address" in report.problems[0]


def test_typed_ksym_refused(tmp_path: Path) -> None:
    report = checks.audit_spec(_spec(tmp_path, "typed_ksym"))
    ksym = [p for p in report.problems if "__ksym bpf_prog_active" in p]
    assert len(ksym) == 1 and "no __ksym is on the broker's allowlist" in ksym[0], report.problems


def test_unreviewed_kfunc_refused(tmp_path: Path) -> None:
    src = (
        HEADER
        + """struct task_struct;
extern struct task_struct *bpf_task_from_pid(int pid) __ksym;
extern void bpf_task_release(struct task_struct *p) __ksym;
SEC("tp_btf/sys_enter") int p(void *ctx) {
    struct task_struct *t = bpf_task_from_pid(1);
    if (t) bpf_task_release(t);
    return 0;
}
"""
    )
    report = checks.audit_spec(_spec(tmp_path, "kf", src))
    assert any("calls kfunc bpf_task_from_pid" in p and "references" in p for p in report.problems)
    assert any("bpf_task_release" in p and "allowlist" in p for p in report.problems)


@pytest.mark.parametrize(
    "kind, name, typed, allowed",
    [
        ("kconfig", "LINUX_KERNEL_VERSION", True, True),
        ("kfunc", "bpf_rcu_read_lock", True, True),
        ("kfunc", "bpf_obj_new_impl", True, False),
        ("kfunc", "made_up", True, False),
        ("ksym", "runqueues", True, False),
        ("ksym", "vfs_read", False, False),
    ],
)
def test_extern_rows(kind: str, name: str, typed: bool, allowed: bool) -> None:
    assert (audit_table.extern_problem(kind, name, typed) is None) == allowed


def test_program_rows() -> None:
    assert audit_table.program_kind_problem(C.ProgType.TRACING, "fentry") is None
    assert audit_table.program_kind_problem(C.ProgType.KPROBE, "kprobe.multi") is not None
    assert "not an allowed program kind" in str(
        audit_table.program_kind_problem(C.ProgType.TRACING, "tracepoint")
    )


def test_map_in_map_and_prog_array_refused(tmp_path: Path) -> None:
    report = checks.audit_spec(_spec(tmp_path, "mapinmap"))
    problems = "\n".join(report.problems)
    assert "map 'outer': map type array_of_maps: map-in-map" in problems
    assert "map 'jump': map type prog_array: program arrays serve tail calls" in problems
    assert "bpf_tail_call" in problems  # and the helper itself
