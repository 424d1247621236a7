"""Section names to program kinds: libbpf's names, gfxbpf's refusals."""

from __future__ import annotations

import pytest

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.sections import (
    KIND_FUNC,
    KIND_TYPEDEF,
    SectionError,
    SectionUnsupported,
    parse_section,
)


@pytest.mark.parametrize(
    "section, ptype, atype, kind, target, btf",
    [
        ("tp/sched/sched_switch", C.ProgType.TRACEPOINT, 0, "tracepoint", "sched/sched_switch",
         None),
        ("raw_tp/sys_enter", C.ProgType.RAW_TRACEPOINT, 0, "raw_tracepoint", "sys_enter", None),
        ("kprobe/vfs_read", C.ProgType.KPROBE, 0, "kprobe", "vfs_read", None),
        ("kprobe", C.ProgType.KPROBE, 0, "kprobe", None, None),
        ("kretprobe/vfs_read", C.ProgType.KPROBE, 0, "kretprobe", "vfs_read", None),
        ("ksyscall/kill", C.ProgType.KPROBE, 0, "ksyscall", "kill", None),
        ("kretsyscall/kill", C.ProgType.KPROBE, 0, "kretsyscall", "kill", None),
        ("usdt/./bin:prov:probe", C.ProgType.KPROBE, 0, "usdt", "./bin:prov:probe", None),
        ("uprobe.multi/libc.so.6:malloc", C.ProgType.KPROBE, C.BPF_TRACE_UPROBE_MULTI, "uprobe",
         "libc.so.6:malloc", None),
        ("tp_btf/sched_switch", C.ProgType.TRACING, C.BPF_TRACE_RAW_TP, "tp_btf", "sched_switch",
         ("btf_trace_sched_switch", KIND_TYPEDEF)),
        ("fentry/vfs_read", C.ProgType.TRACING, C.BPF_TRACE_FENTRY, "fentry", "vfs_read",
         ("vfs_read", KIND_FUNC)),
        ("fexit/vfs_read", C.ProgType.TRACING, C.BPF_TRACE_FEXIT, "fexit", "vfs_read",
         ("vfs_read", KIND_FUNC)),
        ("iter/task", C.ProgType.TRACING, C.BPF_TRACE_ITER, "iter", "task",
         ("bpf_iter_task", KIND_FUNC)),
        ("perf_event", C.ProgType.PERF_EVENT, 0, "perf_event", None, None),
    ],
)  # fmt: skip
def test_libbpf_section_names(
    section: str, ptype: int, atype: int, kind: str, target: str | None, btf: tuple | None
) -> None:
    p = parse_section(section)
    assert (p.prog_type, p.attach_type, p.attach_kind, p.target) == (ptype, atype, kind, target)
    assert (None if p.btf_name is None else (p.btf_name, p.btf_kind)) == btf


@pytest.mark.parametrize(
    "section, why",
    [
        ("xdp", "networking/cgroup program type"),
        ("socket", "networking/cgroup program type"),
        ("tc/ingress", "networking/cgroup program type"),
        ("cgroup_skb/egress", "networking/cgroup program type"),
        ("sockops", "networking/cgroup program type"),
        ("sk_lookup", "networking/cgroup program type"),
        ("fmod_ret/vfs_read", "return values"),
        ("lsm/file_open", "tracing programs only"),
        ("fentry.s/vfs_read", "sleepable"),
        ("bogus/x", "unknown program type"),
    ],
)
def test_refused_kinds_say_why(section: str, why: str) -> None:
    with pytest.raises(SectionUnsupported, match=why):
        parse_section(section)


@pytest.mark.parametrize(
    "section", ["tracepoint/sched", "tp_btf", "fentry/", "iter", "perf_event/x", "raw_tp"]
)
def test_malformed_targets(section: str) -> None:
    with pytest.raises(SectionError):
        parse_section(section)
