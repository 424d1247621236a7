"""GPU catalog programs without their GPUs: each release layout passes the
verifier, and each program, its knobs pointed at stand-in tracepoints of
this machine, counts exactly, honours scope self, and keeps every kernel
pointer it reads out of the maps a client sees."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gfxbpf.bpf.link import attach as bpfattach
from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import FIELD_ABSENT, load_catalog
from gfxbpf.catalog.objects import read_object
from tests.kernel.rawclient import kernel_looking
from tests.kernel.sysmaps_util import run_unprivileged
from tests.release_formats import RUNS, exists_in, reader_for

CATALOG = load_catalog()
TEST_UID = 54322  # a uid nothing else on the machine runs as


@pytest.mark.parametrize("name", ["vmabind", "drmsched", "xe", "xid", "vblank", "amdgpu"])
def test_gpu_programs_say_why_they_cannot_attach(name: str) -> None:
    entry = CATALOG.get(name)
    reason = instance.availability(entry, read_format=tracefs.read_format)
    assert reason is not None and "does not exist on this kernel" in reason
    assert entry.requires and reason.startswith(f"needs {entry.requires}: ")
    if name == "vmabind":
        assert "i915:i915_vma_bind" in reason and "i915 driver must be loaded" in reason
    if name == "xid":
        assert "nvidia:nvidia_dev_xid" in reason and "NVIDIA kernel driver must be loaded" in reason


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda k: f"{k[1]}@{k[0]}")
def test_gpu_programs_pass_the_verifier_with_each_release_layout(key: tuple[str, str]) -> None:
    # The events are absent here, but the kernel still verifies each layout's loads.
    release, name = key
    entry = CATALOG.get(name)
    opened = instance.open_program(
        entry, read_object(entry), exists=exists_in(release), read_format=reader_for(release)
    )
    with opened.load() as inst:
        want = {a.program for a in entry.attach_for(opened.variant)}
        assert set(inst.obj.programs) == want
        assert all(p.id > 0 for p in inst.obj.programs.values())


def test_drmsched_without_client_id_passes_the_verifier() -> None:
    entry = CATALOG.get("drmsched")
    opened = instance.open_program(
        entry, read_object(entry), exists=exists_in("6.17"), read_format=reader_for("6.17")
    )
    for knob in ("off_q_client", "off_r_client"):
        opened.spec.set_variable(knob, FIELD_ABSENT)  # as on a kernel without the field
    with opened.load() as inst:
        assert all(p.id > 0 for p in inst.obj.programs.values())


# Stand-ins for GPU events that do not exist here, with knobs pointed at
# their fields, so each GPU program sees real kernel pointers where a driver
# would pass fence and vm pointers: workqueue_queue_work (work, function:
# pointers; workqueue: a string) for jobs and Xids, kmem:kmalloc (call_site,
# ptr: pointers; bytes_req: a size) for binds. Both fire all the time.
WQ = ("workqueue", "workqueue_queue_work")
KMALLOC = ("kmem", "kmalloc")
STAND_IN_FIELDS: dict[str, dict[str, tuple[tuple[str, str], str]]] = {
    "xe": {
        "off_x_dev": (WQ, "workqueue"),
        "off_x_fence": (WQ, "work"),
        "off_r_dev": (WQ, "workqueue"),
        "off_r_fence": (WQ, "work"),
        "off_f_fence": (WQ, "work"),
        "off_t_dev": (WQ, "workqueue"),
        "off_b_vm": (KMALLOC, "call_site"),
        "off_b_start": (KMALLOC, "ptr"),
        "off_b_end": (KMALLOC, "ptr"),
        "off_u_vm": (KMALLOC, "call_site"),
        "off_u_start": (KMALLOC, "ptr"),
        "off_u_end": (KMALLOC, "ptr"),
    },
    "drmsched": {
        "off_lq_fence": (WQ, "work"),
        "off_lq_name": (WQ, "workqueue"),
        "off_lr_fence": (WQ, "work"),
        "off_lr_name": (WQ, "workqueue"),
        "off_ld_fence": (WQ, "work"),
    },
    "vmabind": {
        "off_bind_vm": (KMALLOC, "call_site"),
        "off_bind_size": (KMALLOC, "bytes_req"),
        "off_unbind_vm": (KMALLOC, "call_site"),
        "off_unbind_size": (KMALLOC, "bytes_req"),
    },
    "xid": {
        "off_dev": (WQ, "workqueue"),
        "off_code": (WQ, "workqueue"),  # a small u32 (string offset and length)
        "off_msg": (WQ, "workqueue"),
    },
    "vblank": {
        "off_crtc": (WQ, "workqueue"),
        "off_seq": (WQ, "workqueue"),
        "off_time": (WQ, "work"),
    },
    "amdgpu": {
        "off_cs_context": (WQ, "work"),
        "off_cs_seqno": (WQ, "function"),
        "off_cs_ring": (WQ, "workqueue"),
        "off_run_context": (WQ, "work"),
        "off_run_seqno": (WQ, "function"),
        "off_run_ring": (WQ, "workqueue"),
        "off_sig_context": (WQ, "work"),
        "off_sig_seqno": (WQ, "function"),
        "off_map_start": (KMALLOC, "bytes_req"),
        "off_map_last": (KMALLOC, "bytes_req"),
        "off_unmap_start": (KMALLOC, "bytes_req"),
        "off_unmap_last": (KMALLOC, "bytes_req"),
    },
}
# Hidden maps that must hold pointers afterwards: proof the pointers went in.
# (Jobs are not: on one stand-in event a job is queued, run and done at once.)
POINTER_MAPS = {"xe": "vm_ids", "vmabind": "vm_ids"}


def _stand_in_event(entry, program: str, knobs: dict) -> tuple[str, str]:
    """The stand-in event of the fields this BPF program reads."""
    events = {
        knobs[f.knob][0]
        for f in entry.fields
        if f.knob in knobs
        and any(a.program == program for a in entry.attach if a.target == f.tracepoint)
    }
    assert len(events) == 1, (entry.name, program, events)
    return events.pop()


def _visible_words(inst: instance.Instance) -> tuple[int, list[str]]:
    """(bytes, kernel-looking words) over every key, value and ring-buffer record
    a client could read from the visible maps, each scanned at its own alignment."""
    total, found = 0, []
    for m in inst.entry.visible_maps:
        kmap = inst.obj.map(m.name)
        if m.show == "events":
            with RingBuffer(kmap.fileno()) as rb:
                blobs = rb.poll(0.2)
        else:
            blobs = [b for k, v in kmap.items() for b in (k, *(v if isinstance(v, list) else [v]))]
        for blob in blobs:
            total += len(blob)
            found += kernel_looking(blob)
    return total, found


@contextmanager
def _on_stand_ins(
    name: str,
    uid: int | None = None,
    fields: dict[str, tuple[tuple[str, str], str | None]] | None = None,
    variant: str | None = None,
) -> Iterator[instance.Instance]:
    """Program name loaded with its knobs on stand-in events (STAND_IN_FIELDS
    unless fields says; a field None is absent) and attached there."""
    entry = CATALOG.get(name)
    if variant is None and entry.variants:
        variant = "legacy"
    spec = ObjectSpec.parse(read_object(entry), name)
    fields = fields if fields is not None else STAND_IN_FIELDS[name]  # type: ignore[assignment]
    assert fields is not None
    size_knobs = {f.knob: f.size_knob for f in entry.fields if f.size_knob}
    for knob, (event, fld) in fields.items():
        found = None if fld is None else tracefs.read_format(*event).fields[fld]
        spec.set_variable(knob, FIELD_ABSENT if found is None else found.offset)
        if knob in size_knobs:
            spec.set_variable(size_knobs[knob], 0 if found is None else found.size)
    if uid is not None:
        assert entry.uid_knob
        spec.set_variable(entry.uid_knob, uid)
    with instance.Opened(entry, variant, spec, instance.Params()).load() as inst:
        for a in entry.attach_for(variant):
            prog = inst.obj.programs[a.program]
            event = _stand_in_event(entry, a.program, fields)
            inst.attachments.append(bpfattach.attach_tracepoint(prog.fd, *event))
        yield inst


def _queue_work() -> None:
    """Dirty a page and sync: the writeback work is queued from this thread."""
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
        f.write(b"x" * 4096)
        f.flush()
        subprocess.run(["sync"], check=True)


@pytest.mark.parametrize("name", sorted(STAND_IN_FIELDS))
def test_gpu_programs_keep_kernel_pointers_out_of_visible_maps(name: str) -> None:
    with _on_stand_ins(name) as inst:
        deadline = time.monotonic() + 10
        total, found = 0, []
        while time.monotonic() < deadline and total < 64:
            _queue_work()
            time.sleep(0.2)
            n, f = _visible_words(inst)
            total, found = total + n, found + f
        assert total >= 64, f"{name}: the stand-in events never reached the maps"
        assert found == [], name
        if name in POINTER_MAPS:
            hidden = [b for k, v in inst.obj.map(POINTER_MAPS[name]).items() for b in (k, v)]
            assert any(kernel_looking(b) for b in hidden), f"{name}: no pointer in the test"


# Scope self of the submission programs: the kernel keeps only jobs queued by
# the target uid. On the stand-in, a "job" is queued by whoever queues work.
SELF_COUNTED = {"drmsched": "queue_latency", "amdgpu": "wait_latency"}


@pytest.mark.parametrize("name", sorted(SELF_COUNTED))
def test_scope_self_counts_only_the_target_users_submissions(name: str) -> None:
    hist = SELF_COUNTED[name]
    with _on_stand_ins(name) as everyone, _on_stand_ins(name, uid=TEST_UID) as inst:
        for _ in range(5):
            _queue_work()  # root's (and the kernel's) work: not the target's
        time.sleep(0.3)
        assert dict(everyone.obj.map(hist).items()), "no stand-in jobs at all"
        assert dict(inst.obj.map(hist).items()) == {}, "another user's jobs were counted"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not dict(inst.obj.map(hist).items()):
            run_unprivileged(lambda: _queue_work() or 0, uid=TEST_UID, timeout=60)
            time.sleep(0.2)
        assert dict(inst.obj.map(hist).items()), "the target user's jobs were not counted"
        if name == "amdgpu":
            rows = [k for k, _ in inst.obj.map("proc_jobs").read()]
            assert rows and not any(k["comm"].startswith("kworker") for k in rows), rows


GETPRIORITY = ("syscalls", "sys_enter_getpriority")


def test_vblank_counts_intervals_missed_vblanks_and_resumes_exactly() -> None:
    # getpriority(which, who) as a vblank of CRTC `which` with sequence `who`.
    fields = {
        "off_crtc": (GETPRIORITY, "which"),
        "off_seq": (GETPRIORITY, "who"),
        "off_time": (GETPRIORITY, None),  # no `time`: the program's own clock
    }
    crtc = 77  # not a valid `which`: the call fails, the tracepoint fires
    with _on_stand_ins("vblank", fields=fields) as inst:
        for seq in (1, 2, 3, 5, 100):
            try:
                os.getpriority(crtc, seq)
            except OSError:
                pass
        stats = dict(inst.obj.map("crtc_stats").read())[crtc]
        assert stats == {"vblanks": 5, "missed": 1, "resumes": 1}
        intervals = [v for k, v in inst.obj.map("frame_interval").read() if k["crtc"] == crtc]
        assert sum(intervals) == 2  # 1->2 and 2->3; 3->5 and 5->100 are gaps
        assert _visible_words(inst)[1] == []


def test_xid_streams_and_counts_each_error_exactly() -> None:
    # sched_process_exec as an Xid: dev and msg = the exec'd path, code = pid.
    exec_ = ("sched", "sched_process_exec")
    fields = {
        "off_dev": (exec_, "filename"),
        "off_code": (exec_, "pid"),
        "off_msg": (exec_, "filename"),
    }
    n = 4
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="x") as tmp,  # short: dev is 32 bytes
        _on_stand_ins("xid", fields=fields) as inst,
    ):
        prog = Path(tmp, "xidtest")
        shutil.copy("/bin/true", prog)
        for _ in range(n):
            subprocess.run([str(prog)], check=True)
        counts = {
            (k["dev"], k["code"]): v
            for k, v in inst.obj.map("xid_counts").read()
            if k["dev"] == str(prog)
        }
        btf = inst.obj.spec.btf
        assert btf is not None
        ev_type = btf.find("xid_event")
        with RingBuffer(inst.obj.map("xid_events").fileno()) as rb:
            events = [btf.decode(ev_type, r) for r in rb.poll(0.5)]
        mine = [e for e in events if e["dev"] == str(prog)]
        assert len(mine) == n and all(e["msg"] == str(prog) for e in mine)
        assert sorted(counts) == sorted((str(prog), e["code"]) for e in mine)
        assert set(counts.values()) == {1}
        assert dict(inst.obj.map("xid_dropped").read()).get(0, 0) == 0


SETPRIORITY = ("syscalls", "sys_enter_setpriority")
IOPRIO_SET = ("syscalls", "sys_enter_ioprio_set")
SYS_SETPRIORITY, SYS_IOPRIO_SET = 141, 251  # x86-64
# setpriority(which=vm, who, niceval) as a bind, ioprio_set(which=vm, who,
# ioprio) as an unbind: `which` values no kernel accepts, so nothing changes.
VMA_FIELDS = {
    "xe": {
        "off_b_vm": (SETPRIORITY, "which"),
        "off_b_start": (SETPRIORITY, "who"),
        "off_b_end": (SETPRIORITY, "niceval"),  # inclusive: size = end - start + 1
        "off_u_vm": (IOPRIO_SET, "which"),
        "off_u_start": (IOPRIO_SET, "who"),
        "off_u_end": (IOPRIO_SET, "ioprio"),
    },
    "vmabind": {
        "off_bind_vm": (SETPRIORITY, "which"),
        "off_bind_size": (SETPRIORITY, "niceval"),
        "off_unbind_vm": (IOPRIO_SET, "which"),
        "off_unbind_size": (IOPRIO_SET, "ioprio"),
    },
}


def _bind(vm: int, third: int, unbind: bool = False) -> None:
    """setpriority (bind) or ioprio_set (unbind) with `which` = vm; both fail."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(SYS_IOPRIO_SET if unbind else SYS_SETPRIORITY, vm, 0, third)


@pytest.mark.parametrize("name", sorted(VMA_FIELDS))
def test_vma_programs_count_binds_per_address_space_exactly(name: str) -> None:
    vm_a, vm_b = 0x7A5E0001, 0x7A5E0002
    # Job programs (xe) stay on their usual stand-in.
    fields = {**STAND_IN_FIELDS[name], **VMA_FIELDS[name]}
    with _on_stand_ins(name, fields=fields) as inst:
        for _ in range(3):
            _bind(vm_a, 4095)
        _bind(vm_a, 4095, unbind=True)
        _bind(vm_b, 8191)
        ids = dict(inst.obj.map("vm_ids").read())
        assert {vm_a, vm_b} <= set(ids) and ids[vm_a] != ids[vm_b]
        stats = dict(inst.obj.map("vm_stats").read())
        # xe's size is end - start + 1; i915 reports the size itself.
        size_a, size_b = (4096, 8192) if name == "xe" else (4095, 8191)
        assert stats[ids[vm_a]] == {
            "bytes_bound": 3 * size_a,
            "bytes_unbound": size_a,
            "binds": 3,
            "unbinds": 1,
        }
        assert stats[ids[vm_b]] == {
            "bytes_bound": size_b,
            "bytes_unbound": 0,
            "binds": 1,
            "unbinds": 0,
        }
        assert _visible_words(inst)[1] == []  # the ids, never the vm values


EXEC = ("sched", "sched_process_exec")
# A job is queued (submitted) by an exec: ring = the exec'd path, (context,
# seqno) from the pid; getpriority(context, seqno) runs it, and
# setpriority(context, seqno, 0) completes it. Every call fails harmlessly.
JOB_FIELDS = {
    "drmsched": {
        "off_q_name": (EXEC, "filename"),
        "off_q_context": (EXEC, "pid"),  # read as u64 at 12: pid | old_pid << 32
        "off_q_seqno": (EXEC, "pid"),
        "off_q_client": (EXEC, "pid"),
        "off_r_name": (GETPRIORITY, "which"),  # not read: the job is known by then
        "off_r_context": (GETPRIORITY, "which"),
        "off_r_seqno": (GETPRIORITY, "who"),
        "off_r_client": (GETPRIORITY, "who"),
        "off_d_context": (SETPRIORITY, "which"),
        "off_d_seqno": (SETPRIORITY, "who"),
    },
    "xe": {
        **STAND_IN_FIELDS["xe"],  # the VMA programs stay on their stand-in
        "off_x_dev": (EXEC, "filename"),
        "off_x_fence": (EXEC, "pid"),  # read as u64 at 12: pid | old_pid << 32
        "off_r_dev": (GETPRIORITY, "which"),  # not read: the job is known by then
        "off_r_fence": (GETPRIORITY, "which"),
        "off_f_fence": (SETPRIORITY, "which"),
        "off_t_dev": (EXEC, "filename"),  # every job "times out" too
    },
    "amdgpu": {
        **STAND_IN_FIELDS["amdgpu"],  # the VM programs stay on their stand-in
        "off_cs_context": (EXEC, "pid"),  # the size knobs follow: 4 bytes
        "off_cs_seqno": (EXEC, "pid"),
        "off_cs_ring": (EXEC, "filename"),
        "off_run_context": (GETPRIORITY, "which"),
        "off_run_seqno": (GETPRIORITY, "who"),
        "off_run_ring": (GETPRIORITY, "which"),
        "off_sig_context": (SETPRIORITY, "which"),
        "off_sig_seqno": (SETPRIORITY, "who"),
    },
}


def _run_jobs(tmp: str, n: int, uid: int | None = None) -> tuple[str, list[int]]:
    """n jobs: exec a copy of true named `job`, then run and complete each."""
    prog = os.path.join(tmp, "job")
    if not os.path.exists(prog):
        shutil.copy("/bin/true", prog)
    pids = []
    for _ in range(n):
        p = subprocess.Popen([prog], user=uid, group=uid)
        p.wait()
        pids.append(p.pid)
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in pids:
        key = pid | pid << 32
        libc.syscall(ctypes.c_long(140), ctypes.c_ulong(key), ctypes.c_ulong(key))
        libc.syscall(ctypes.c_long(SYS_SETPRIORITY), ctypes.c_ulong(key), ctypes.c_ulong(key), 0)
    return prog, pids


def _hist_total(m: Map, **match: object) -> int:
    return sum(v for k, v in m.read() if all(k[a] == b for a, b in match.items()))


def test_drmsched_times_each_job_per_ring_and_per_client_exactly() -> None:
    n = 3
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="q") as tmp,
        _on_stand_ins("drmsched", fields=JOB_FIELDS["drmsched"], variant="6.17+") as inst,
    ):
        prog, pids = _run_jobs(tmp, n)
        for hist in ("queue_latency", "run_latency"):
            assert _hist_total(inst.obj.map(hist), ring=prog) == n, hist
        for pid in pids:
            client = pid | pid << 32
            assert _hist_total(inst.obj.map("client_queue"), client_id=client) == 1
            assert _hist_total(inst.obj.map("client_run"), client_id=client) == 1
        keys = {p | p << 32 for p in pids}
        left = [k for k, _ in inst.obj.map("sched_jobs").read() if k["context"] in keys]
        assert left == []  # done jobs are forgotten


def test_xe_times_each_job_per_device_exactly() -> None:
    n = 3
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="x") as tmp,
        _on_stand_ins("xe", fields=JOB_FIELDS["xe"]) as inst,
    ):
        prog, pids = _run_jobs(tmp, n)
        for hist in ("wait_latency", "run_latency"):
            assert _hist_total(inst.obj.map(hist), dev=prog) == n, hist
        timeouts = {k["dev"]: v for k, v in inst.obj.map("job_timeouts").read()}
        assert timeouts[prog] == n
        keys = {p | p << 32 for p in pids}
        assert not keys & {k for k, _ in inst.obj.map("xe_jobs").read()}


def test_amdgpu_self_times_only_the_callers_jobs_per_ring_and_process() -> None:
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="a") as tmp,
        _on_stand_ins("amdgpu", uid=TEST_UID, fields=JOB_FIELDS["amdgpu"]) as inst,
    ):
        os.chmod(tmp, 0o755)
        prog, root_pids = _run_jobs(tmp, 2)  # root's submissions: not counted
        _, pids = _run_jobs(tmp, 3, uid=TEST_UID)
        for hist in ("wait_latency", "run_latency"):
            assert _hist_total(inst.obj.map(hist), ring=prog) == 3, hist
        rows = {k["tgid"]: (k["comm"], v) for k, v in inst.obj.map("proc_jobs").read()}
        for pid in pids:
            comm, v = rows[pid]
            assert comm == "job" and (v["submitted"], v["done"]) == (1, 1)
            assert v["wait_ns"] > 0 and v["run_ns"] > 0
        assert not set(root_pids) & set(rows)
