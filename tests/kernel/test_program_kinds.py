"""The BTF-typed and kprobe program kinds on the live kernel.

tp_btf counts exact events; an iter/ program runs through BPF_ITER_CREATE;
kprobe kinds load, and attaching them says plainly when the kernel has no
kprobes. Sources: tests/data/programs/, compiled here with clang.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.kernel.vmlinux import KernelBtfError, module_btf_fd
from gfxbpf.bpf.link import tracing
from gfxbpf.bpf.link.attach import AttachError
from gfxbpf.bpf.loader import LoadError, load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf
from tests.kernel.bpftool_compare import LibbpfRefused, assert_loads_like_libbpf, ensure_bpffs

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"


def _spec(tmp_path: Path, name: str) -> ObjectSpec:
    obj = compile_bpf((SOURCES / f"{name}.bpf.c").read_text(), tmp_path, name)
    return ObjectSpec.from_file(str(obj))


def _hits(obj) -> int:  # type: ignore[no-untyped-def]
    raw = obj.map("hits").lookup(0)
    return int(struct.unpack("<Q", raw)[0])


def test_tp_btf_counts_exact_getppid_calls(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "kinds")
    prog = spec.programs["getppid_enter"]
    assert (prog.attach_kind, prog.attach_btf_name) == ("tp_btf", "btf_trace_sys_enter")
    spec.set_variable("target_tgid", os.getpid())
    with load(spec) as obj:
        with tracing.attach_btf_traced(obj.programs["getppid_enter"].fd, "tp_btf sys_enter"):
            for _ in range(1000):
                os.getppid()
            assert _hits(obj) == 1000
        os.getppid()  # detached: no longer counted
        assert _hits(obj) == 1000


def test_kprobe_kinds_load_and_attach_says_why(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "kinds")
    with load(spec, programs=["kprobe_prog", "ksyscall_prog"]) as obj:
        kp = obj.programs["kprobe_prog"].fd
        ks = obj.programs["ksyscall_prog"].fd
        if os.path.exists(tracing.KPROBE_PMU_DIR):
            with tracing.attach_ksyscall(ks, "getppid"):
                os.getppid()
                assert _hits(obj) >= 1
            return
        with pytest.raises(AttachError, match="CONFIG_KPROBES") as e:
            tracing.attach_kprobe(kp, "vfs_read")
        assert "unavailable" in str(e.value)
        with pytest.raises(AttachError, match="no kprobe PMU"):
            tracing.attach_ksyscall(ks, "getppid", retprobe=True)


def test_task_iterator_runs_once_per_line(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "taskiter")
    assert spec.programs["tasks"].attach_btf_name == "bpf_iter_task"
    with load(spec) as obj:
        with tracing.attach_iter(obj.programs["tasks"].fd, "iter/task") as link:
            out = tracing.read_iter(link)
        lines = out.decode().splitlines()
        runs = int.from_bytes(obj.map(".bss").lookup(0)[:8], "little")
    assert set(lines) == {"task"}
    assert len(lines) == runs  # every run wrote its line, nothing else was written
    assert runs >= len(os.listdir("/proc/self/task"))  # at least this process's threads


def test_object_without_license_loads_like_libbpf(tmp_path: Path) -> None:
    src = """#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1);
         __type(key, __u32); __type(value, __u64); } hits SEC(".maps");
SEC("raw_tp/sys_enter") int nolicense(void *ctx) {
    __u32 k = 0; __u64 *v = bpf_map_lookup_elem(&hits, &k);
    if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
"""
    path = compile_bpf(src, tmp_path, "nolicense")
    spec = ObjectSpec.from_file(str(path))
    assert spec.license == ""  # as libbpf: the kernel then refuses only GPL-only helpers
    assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 1


def test_map_in_map_and_prog_array_initial_values(tmp_path: Path) -> None:
    path = compile_bpf((SOURCES / "mapinmap.bpf.c").read_text(), tmp_path, "mapinmap")
    spec = ObjectSpec.from_file(str(path))
    assert spec.maps["outer"].init == {0: "first", 2: "second"}
    assert spec.maps["jump"].init == {1: "leaf"}
    assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 2
    with load(spec) as obj:

        def slot(m: str, i: int) -> int | None:
            raw = obj.map(m).lookup(i)  # the kernel answers with ids for fd arrays
            return None if raw is None else struct.unpack("<I", raw)[0]

        assert slot("outer", 0) == bpfsys.map_info(obj.map("first").fileno()).id
        assert slot("outer", 2) == bpfsys.map_info(obj.map("second").fileno()).id
        assert slot("outer", 1) is None
        assert slot("jump", 1) == obj.programs["leaf"].id
        assert slot("jump", 0) is None


def test_kernel_btf_objects_are_found_by_name() -> None:
    """The walk a module target's attach_btf_obj_fd takes, on the one kernel BTF
    this VM has (it loads no modules): vmlinux's object, marked as kernel BTF."""
    fd = module_btf_fd("vmlinux")
    try:
        assert bpfsys.btf_name(fd) == ("vmlinux", True)
    finally:
        os.close(fd)
    with pytest.raises(KernelBtfError, match="no kernel BTF object for module 'no_such_mod'"):
        module_btf_fd("no_such_mod")


def test_fentry_loads_like_libbpf_or_is_refused_like_it(tmp_path: Path) -> None:
    """Where the kernel allows trampolines, fentry loads as libbpf loads it and
    counts exact calls; where it refuses them (this VM: EPERM, docs/BPF-ABI.md),
    libbpf is refused too and gfxbpf's error says why."""
    path = compile_bpf((SOURCES / "fentry.bpf.c").read_text(), tmp_path, "fentry")
    spec = ObjectSpec.from_file(str(path))
    assert spec.programs["on_vfs_read"].attach_btf_name == "vfs_read"
    spec.set_variable("target_tgid", os.getpid())
    try:
        obj = load(spec)
    except LoadError as e:
        assert "refuses BPF trampolines" in str(e), e
        with pytest.raises(LibbpfRefused):
            assert_loads_like_libbpf(str(path), spec, ensure_bpffs())
        return
    with obj:
        with tracing.attach_btf_traced(obj.programs["on_vfs_read"].fd, "fentry vfs_read"):
            fd = os.open("/proc/self/stat", os.O_RDONLY)
            try:
                for _ in range(10):
                    os.pread(fd, 64, 0)
            finally:
                os.close(fd)
        raw = obj.map(".bss").lookup(0)
        assert int.from_bytes(raw[:8], "little") >= 10
    assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 1
