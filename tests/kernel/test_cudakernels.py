"""GPU time per kernel end to end on the CUPTI stand-in (CI has no GPU).

gfxbpf's injection library (gpu/cupti/inject.c) is built against the
stand-in libcupti (gpu/cupti/standin.c), which makes the activity records a
GPU would for the workload's kernels ("gemm" 250 µs, "relu" 40 µs, launched
from two Python functions: bench/cupti_standin.py). The broker runs as
gfxbpf with CAP_BPF + CAP_PERFMON; `gfxclient watch cuda --gpu` runs as an
ordinary user, finds the library in the target's maps, and program
`cudakernels` attaches to its USDT probes. Compared exactly: kernels and
device nanoseconds per (kernel, launching Python function); another user's
process on the same library; the library's own counter while nothing listens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import cupti_standin as cs
from bench.gpu_kernels_check import COPIES as COPIES_CHECK
from gfxbpf.catalog.stack_copies import (
    APPROVED_STACK_BYTES,
    DEEP_STACK_BYTES,
    MAX_STACK_BYTES,
)
from gfxbpf.client.profiles.python.records import MAIN_FRAME
from gfxbpf.client.profiles.unwind.result import Stop, marker_frame
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BASE_ENV,
    BOB,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
    setpriv_user_argv,
    shared_dir,
    uid_of,
)
from tests.viewers import need_pprof, pprof, pprof_top

pytestmark = pytest.mark.kernel
PYTHON = "/usr/bin/python3"
CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_kernels_check.py"
N, M, COPIES, MEMSETS = 40, 25, 6, 4


@pytest.fixture(scope="module")
def built() -> Iterator[cs.Built]:
    if not os.access(PYTHON, os.X_OK):
        skip_or_fail(f"{PYTHON} is not installed")
    d = shared_dir(prefix="gfxbpf-cupti-")
    try:
        b = cs.build(d)
    except cs.BuildError as e:
        skip_or_fail(str(e))
    subprocess.run(["chmod", "-R", "a+rX", str(d)], check=True)
    yield b
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    built: cs.Built = request.getfixturevalue("built")
    lib = [str(built.inject)]
    return policy_for(
        {
            "cudakernels": [
                # approve's default copy for the program (72 KiB, under cuBLASLt)
                {
                    "users": [ALICE, BOB],
                    "scope": "self",
                    "libraries": lib,
                    "max_stack_bytes": APPROVED_STACK_BYTES["cudakernels"],
                },
                {"users": [MALLORY], "scope": "system", "libraries": lib},
            ]
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def _workload(built: cs.Built, user: str) -> cs.Workload:
    return cs.Workload(built, PYTHON, prefix=setpriv_user_argv(user, []), env=BASE_ENV, cwd="/")


def _watch(broker: BrokerProcess, user: str, *args: str) -> subprocess.Popen[str]:
    assert broker.grpc is not None
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--grpc", broker.grpc]
    return run_as(
        user,
        [*argv, "watch", "cuda", "--gpu", "--json", "--interval", "0.5", *args],
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stats_until(
    w: cs.Workload, ok: Callable[[dict[str, int]], bool], never: str, timeout: float = 10.0
) -> None:
    """Until the library's counters satisfy ok; never: what failing says."""
    deadline = time.monotonic() + timeout
    while not ok(w.stats()):
        assert time.monotonic() < deadline, never
        time.sleep(0.02)


def _collecting(w: cs.Workload, want: int, timeout: float = 10.0) -> None:
    never = f"the library never reached collecting={want}"
    _stats_until(w, lambda s: s["collecting"] == want, never, timeout)


# CUptiResult: cuptiSubscribe's answer while another client subscribes
MULTIPLE_SUBSCRIBERS = 39


def _refused(w: cs.Workload, timeout: float = 10.0) -> None:
    """Until the library, probed, has tried to subscribe and been refused twice."""
    _stats_until(w, lambda s: s["refused"] >= 2, "the library never tried to collect", timeout)


def _first(watch: subprocess.Popen[str]) -> dict[str, Any]:
    """The first view, right after attaching (or what gfxclient said instead)."""
    assert watch.stdout is not None
    line = watch.stdout.readline()
    if not line:
        watch.wait(30)
        raise AssertionError(watch.stderr.read() if watch.stderr else "gfxclient said nothing")
    out: dict[str, Any] = json.loads(line)
    return out


def _finish(watch: subprocess.Popen[str], stop: bool = True) -> list[dict[str, Any]]:
    """Stop the watch (the work is handed over: the library answers after its
    poll) and read its views; the last one, taken at the stop, holds it all.
    A stop, not a --duration: a fixed window races a slow, loaded machine."""
    assert watch.stdout is not None
    if stop:
        watch.terminate()
    lines = [json.loads(ln) for ln in watch.stdout]
    err = watch.stderr.read() if watch.stderr else ""
    assert watch.wait(30) == 0, err
    assert lines, f"no view after the first: {err}"
    return lines


def _work(w: cs.Workload) -> None:
    w.command(f"a {N}")
    w.command(f"b {M}")
    w.command(f"copy {COPIES}")


def test_device_time_per_kernel_and_python_function_exactly(
    broker: BrokerProcess, built: cs.Built
) -> None:
    with _workload(built, ALICE) as mine, _workload(built, BOB) as bobs:
        _work(mine)  # before anyone listens: nothing collected
        assert mine.stats()["records"] == 0
        watch = _watch(broker, ALICE, "--pid", str(mine.pid))
        try:
            first = _first(watch)
            _collecting(mine, 1)
            _work(mine)
            _work(bobs)  # same library file, another user: never seen, never collected
            lines = _finish(watch)
        finally:
            if watch.poll() is None:
                watch.kill()
        _collecting(mine, 0)  # detached: the library stops collecting
        # The copy and memset calls the stand-in makes, named by its CUPTI: 5 + 2.
        assert mine.stats()["copy_apis"] == 7
        after = mine.stats()["records"]
        _work(mine)
        assert mine.stats()["records"] == after
        assert bobs.stats()["records"] == 0
    assert first["kernels"] == 0 and first["library"] == str(built.inject)
    last = lines[-1]
    script = str(built.script)
    got = {(k["kernel"], k["function"]): k for k in last["by_kernel"]}
    a = ("gemm", f"launch_a ({script}:{cs.A_LINE})")
    b_gemm = ("gemm", f"launch_b ({script}:{cs.B_GEMM_LINE})")
    b_relu = ("relu", f"launch_b ({script}:{cs.B_RELU_LINE})")
    assert set(got) == {a, b_gemm, b_relu}, got
    assert (got[a]["kernels"], got[a]["device_ns"]) == (N, N * cs.NS["gemm"])
    assert (got[b_gemm]["kernels"], got[b_gemm]["device_ns"]) == (M, M * cs.NS["gemm"])
    assert (got[b_relu]["kernels"], got[b_relu]["device_ns"]) == (M, M * cs.NS["relu"])
    assert {k["pid"] for k in last["by_kernel"]} == {mine.pid}
    assert last["kernels"] == N + 2 * M and last["lost"] == 0
    assert got[a]["chains"] == [
        {"chain": [f"<module> ({script}:{cs.MODULE_A_LINE})", a[1]], "kernels": N,
         "device_ns": N * cs.NS["gemm"]}
    ]  # fmt: skip
    # Copies keep their own table: hers only, each with the stand-in's bytes and time,
    # and per Python line that made them.
    copied = {"pid": mine.pid, "uid": uid_of(ALICE), "kind": "htod", "copies": COPIES,
              "bytes": COPIES * cs.COPY_BYTES, "device_ns": COPIES * cs.NS["copy"]}  # fmt: skip
    assert last["copies"] == [copied]
    function = f"<module> ({script}:{cs.MODULE_COPY_LINE})"
    assert last["copies_by_function"] == [{**copied, "function": function, "estimated": False}]


def test_copy_calls_are_probed_where_cupti_names_no_callback(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """libcupti without a driver names no callback; should a real one do so,
    the library probes the copy and memset calls PyTorch makes from its own
    list (19), and the watch still names the line behind each copy."""
    work = [f"copy {COPIES}", f"memset {MEMSETS}"]
    last, stats = _watched(broker, built, {"GFX_STANDIN_NO_NAMES": "1"}, work)
    assert stats["copy_apis"] == 19
    script = str(built.script)
    got = {(c["kind"], c["function"]): c["copies"] for c in last["copies_by_function"]}
    assert got == {
        ("htod", f"<module> ({script}:{cs.MODULE_COPY_LINE})"): COPIES,
        ("memset", f"<module> ({script}:{cs.MODULE_MEMSET_LINE})"): MEMSETS,
    }, got


def test_system_scope_sees_every_user_per_process(broker: BrokerProcess, built: cs.Built) -> None:
    with _workload(built, ALICE) as alices, _workload(built, BOB) as bobs:
        watch = _watch(broker, MALLORY, "--scope", "system", "--library", str(built.inject))
        try:
            _first(watch)
            _collecting(alices, 1)
            _collecting(bobs, 1)
            alices.command(f"a {N}")
            bobs.command(f"b {M}")
            lines = _finish(watch)
        finally:
            if watch.poll() is None:
                watch.kill()
    rows = {(k["pid"], k["kernel"]): (k["kernels"], k["device_ns"]) for k in lines[-1]["by_kernel"]}
    assert rows == {
        (alices.pid, "gemm"): (N, N * cs.NS["gemm"]),
        (bobs.pid, "gemm"): (M, M * cs.NS["gemm"]),
        (bobs.pid, "relu"): (M, M * cs.NS["relu"]),
    }
    # No Python chain in scope system: the rows say only that the launch was seen.
    assert {k["function"] for k in lines[-1]["by_kernel"]} == {"[no Python frame]"}


def test_another_cupti_client_is_left_alone(broker: BrokerProcess, built: cs.Built) -> None:
    """A profiler holds CUPTI: the library collects nothing, says so once on
    the process's stderr, and the watch (in another terminal) says so too."""
    prefix = setpriv_user_argv(ALICE, [])
    with cs.Workload(built, PYTHON, prefix, env=BASE_ENV, cwd="/", stderr=subprocess.PIPE) as mine:
        mine.command("hold")  # a profiler holds CUPTI before anyone attaches
        watch = _watch(broker, ALICE, "--pid", str(mine.pid), "--duration", "2")
        try:
            lines = _finish(watch, stop=False)
        finally:
            if watch.poll() is None:
                watch.kill()
        stats = mine.stats()
        mine.close()
        assert mine.proc.stderr is not None
        err = mine.proc.stderr.read()
    assert stats["collecting"] == 0 and stats["records"] == 0
    # Said once, however often the library tried while the probes were attached.
    assert err.count("gfxcupti: not collecting GPU activity: another CUPTI client") == 1, err
    # The watch learns it from the library's probe, at each refused poll.
    (refused,) = lines[-1]["refused"]
    assert refused["pid"] == mine.pid and refused["result"] == MULTIPLE_SUBSCRIBERS, refused
    assert refused["polls"] >= 2 and refused["current"], refused


def test_the_library_collects_once_the_other_client_lets_go(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """profile --gpu while a profiler holds CUPTI, which lets go during the
    profile: the kernels after that count, and the notes say why the time
    before had none."""

    pid = 0

    def work(w: cs.Workload) -> None:
        nonlocal pid
        pid = w.pid
        w.command("release")
        _collecting(w, 1)
        w.command("a 3")

    def hold(w: cs.Workload) -> None:
        w.command("hold")

    summary, _ = _profile_gpu(broker, built, work, before=hold)
    assert summary["total_ns"] == 3 * cs.NS["gemm"], summary
    (note,) = [n for n in summary["notes"] if "held CUPTI" in n]
    assert note.startswith(f"pid {pid}: its CUPTI injection library collected nothing"), note
    assert note.endswith("it collects again since that client let go"), note


def _profile_gpu(
    broker: BrokerProcess,
    built: cs.Built,
    work: Callable[[cs.Workload], None],
    *args: str,
    output: str = "gpu.folded",
    before: Callable[[cs.Workload], None] | None = None,
) -> tuple[dict[str, Any], Path]:
    """`profile --gpu` of alice's workload while `work` runs: its --json summary
    and the file it wrote (its format by output's name). before: what the
    workload does first (the library then need not collect when attached)."""
    out = built.script.parent / "alice"
    out.mkdir(exist_ok=True)
    shutil.chown(out, ALICE)
    folded = out / output
    assert broker.grpc is not None
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
    with _workload(built, ALICE) as mine:
        if before is not None:
            before(mine)
        prof = run_as(
            ALICE,
            [*argv, "profile", "--gpu", "--pid", str(mine.pid), "--duration", "120",
             "-o", str(folded), *args],
            background=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            if before is None:
                _collecting(mine, 1)
            else:  # attached: the library's refused polls count
                _refused(mine)
            work(mine)
            prof.terminate()  # handed over: a stop, not a window that races a loaded machine
            got, err = prof.communicate(timeout=60)
        finally:
            if prof.poll() is None:
                prof.kill()
    assert prof.returncode == 0, err
    summary: dict[str, Any] = json.loads(got)
    return summary, folded


def test_profile_gpu_weighs_launch_stacks_by_device_ns(
    broker: BrokerProcess, built: cs.Built
) -> None:
    def work(w: cs.Workload) -> None:
        _work(w)
        w.command(f"memset {MEMSETS}")

    summary, folded = _profile_gpu(broker, built, work)
    script = str(built.script)
    a = [f"<module> ({script}:{cs.MODULE_A_LINE})", f"launch_a ({script}:{cs.A_LINE})"]
    b = f"<module> ({script}:{cs.MODULE_B_LINE})"
    # Each stack: the process's start, its Python frames in place of the
    # interpreter's, the native launch path down to the probe, the kernel.
    stacks = {tuple(s["stack"]): s["device_ns"] for s in summary["stacks"]}
    python = {st: tuple(f for f in st if f.startswith(("<module> (", "launch_"))) for st in stacks}
    by_python = {(*python[st], st[-1]): ns for st, ns in stacks.items()}
    copied = f"<module> ({script}:{cs.MODULE_COPY_LINE})"
    set_line = f"<module> ({script}:{cs.MODULE_MEMSET_LINE})"
    assert by_python == {
        (*a, "gemm"): N * cs.NS["gemm"],
        (b, f"launch_b ({script}:{cs.B_GEMM_LINE})", "gemm"): M * cs.NS["gemm"],
        (b, f"launch_b ({script}:{cs.B_RELU_LINE})", "relu"): M * cs.NS["relu"],
        # copies and memsets under the line that asked for them, their kind the leaf
        (copied, "[memcpy htod]"): COPIES * cs.NS["copy"],
        (set_line, "[memset]"): MEMSETS * cs.NS["memset"],
    }
    calls = {"launch_a": "gfx_standin_launch", "[memcpy htod]": "gfx_standin_memcpy"}
    calls["[memset]"] = "gfx_standin_memset"
    for st in stacks:
        assert "Py_BytesMain" in st, st  # whole: the process's first frames
        launch = calls.get(st[-1]) or calls.get(python[st][-1].split(" (")[0])
        launch = launch or "gfx_standin_launch_runtime"
        assert st.index(python[st][-1]) < st.index(launch) < len(st) - 1, st
    kernels_ns = (N + M) * cs.NS["gemm"] + M * cs.NS["relu"]
    moved_ns = COPIES * cs.NS["copy"] + MEMSETS * cs.NS["memset"]
    assert summary["total_ns"] == kernels_ns + moved_ns
    folded_a = [ln for ln in folded.read_text().splitlines() if ";".join(a) in ln]
    assert len(folded_a) == 1 and folded_a[0].endswith(f";gemm {N * cs.NS['gemm']}"), folded_a
    # Every copy's launch was seen: the note only sums them up by kind.
    (note,) = [n for n in summary["notes"] if n.startswith("copies and memsets")]
    assert note == (
        "copies and memsets are drawn as [memcpy KIND] and [memset] leaves: "
        f"htod {COPIES} (24.0 KiB, 42.0 µs), memset {MEMSETS} (4.00 KiB, 12.0 µs)"
    ), note
    rows = {(r["line"], r["kernel"]): r["device_ns"] for r in summary["launches"]}
    assert rows[(copied, "[memcpy htod]")] == COPIES * cs.NS["copy"], rows


@pytest.mark.parametrize("stack_bytes", [0, MAX_STACK_BYTES])
def test_profile_gpu_reaches_python_from_under_a_deep_library(
    broker: BrokerProcess, built: cs.Built, stack_bytes: int
) -> None:
    """A launch from under the stand-in's 40 KiB frame (cuBLASLt's depth on an
    H200): the copy the policy approve writes allows (72 KiB, reserved in the
    ring) unwinds from the kernel to the process's first frame; a copy of the
    24 KiB a scratch record holds stops inside the library."""
    k = 12
    args = ("--stack-bytes", str(stack_bytes)) if stack_bytes else ()
    summary, written = _profile_gpu(
        broker, built, lambda w: w.command(f"deep {k}"), *args, output="gpu.pb.gz"
    )
    script = str(built.script)
    (st,) = [tuple(s["stack"]) for s in summary["stacks"]]
    assert f"launch_deep ({script}:{cs.DEEP_LINE})" in st, st  # the kernel walks Python
    assert st[-1] == "gemm" and summary["total_ns"] == k * cs.NS["gemm"], summary
    cut = marker_frame(Stop.TRUNCATED)
    if stack_bytes:
        assert cut in st and "Py_BytesMain" not in st, st
        # the note's advice names the most this program copies, not the scratch's 24 KiB
        assert any(f"--stack-bytes {DEEP_STACK_BYTES} " in n for n in summary["notes"]), summary
    else:
        assert "Py_BytesMain" in st and cut not in st, st
        assert "gfx_standin_launch_deep" in st, st
    # Google's pprof reads the device time as its own sample type.
    need_pprof()
    assert "Samples:\ngpu/nanoseconds" in pprof(written, "-raw")
    rows = pprof_top(written, "-sample_index=gpu", "-unit=ns")
    assert (f"{k * cs.NS['gemm']}ns", "gemm") in rows, rows


def test_profile_gpu_gives_each_kernel_of_a_line_its_own_launch_path(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """One Python line launches "gemm" from under a deep frame and "relu"
    straight through the runtime (as a PyTorch line launches cuBLAS's product
    and its own elementwise kernel): each kernel keeps its own native path,
    not one merged stack for the line's chain."""
    k = 9
    summary, _ = _profile_gpu(broker, built, lambda w: w.command(f"pair {k}"))
    stacks = {s["stack"][-1]: tuple(s["stack"]) for s in summary["stacks"]}
    assert sorted(stacks) == ["gemm", "relu"], summary
    line = f"launch_pair ({built.script}:{cs.PAIR_LINE})"
    merged = marker_frame(Stop.MERGED)
    for name, st in stacks.items():
        assert line in st and "Py_BytesMain" in st and merged not in st, st
        assert ("gfx_standin_launch_deep" in st) == (name == "gemm"), st
        assert "gfx_standin_launch_pair" in st, st
    assert summary["total_ns"] == k * (cs.NS["gemm"] + cs.NS["relu"])


def test_profile_gpu_gives_one_kernel_of_a_line_each_of_its_launch_paths(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """One Python line launches "gemm" through two native paths (autograd's
    thread launches one backward kernel from many backward functions, with no
    Python frame to tell them apart): each path keeps its own stack and its
    exact device time, never one stack cut at a [several call paths] marker."""
    k = 7
    summary, _ = _profile_gpu(broker, built, lambda w: w.command(f"twice {k}"))
    line = f"<module> ({built.script}:{cs.MODULE_TWICE_LINE})"
    merged = marker_frame(Stop.MERGED)
    by_path = {}
    for s in summary["stacks"]:
        st = tuple(s["stack"])
        assert line in st and "Py_BytesMain" in st and merged not in st, st
        assert st[-1] == "gemm" and "gfx_standin_launch_pair" in st, st
        by_path["gfx_standin_launch_deep" in st] = (
            by_path.get("gfx_standin_launch_deep" in st, 0) + s["device_ns"]
        )
    assert by_path == {True: k * cs.NS["gemm"], False: k * cs.NS["gemm"]}, summary
    assert summary["total_ns"] == 2 * k * cs.NS["gemm"]


def test_profile_gpu_roots_each_launch_stack_at_its_thread(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """A kernel launched from a thread of its own (named as PyTorch names
    autograd's, which launches every backward kernel and runs no Python) is
    rooted at that thread's name, as a CPU profile roots its samples; the
    main thread's launches at the process's name. The thread's stack shows
    the main thread's Python frames (waiting in the call that made the
    thread, as in loss.backward()) under a marker that says whose they are."""

    def work(w: cs.Workload) -> None:
        w.command("thread")
        w.command("a 3")

    summary, folded = _profile_gpu(broker, built, work)
    roots = {s["stack"][0]: s for s in summary["stacks"]}
    assert len(roots) == 2 and "gfx_autograd_0" in roots, summary
    own = roots.pop("gfx_autograd_0")
    waiting = f"<module> ({built.script}:{cs.MODULE_THREAD_LINE})"
    assert own["stack"][1:3] == [MAIN_FRAME, waiting], own  # then the thread's native frames
    assert [f for f in own["stack"] if " (" in f] == [waiting], own
    assert "launch_on_thread" in own["stack"][3:], own
    assert own["stack"][-1] == "gemm" and own["device_ns"] == 250000, own
    share = 100.0 * own["device_ns"] / summary["total_ns"]
    assert any(n.startswith(f"{share:.1f}% of the device time") for n in summary["notes"])
    ((main, launched),) = roots.items()
    assert main.startswith("python") and any(f.startswith("launch_a (") for f in launched["stack"])
    assert any(ln.startswith("gfx_autograd_0;") for ln in folded.read_text().splitlines())
    # The terminal's rows, in the JSON too: the thread's launch names the waiting line.
    rows = {(r["thread"], r["kernel"]): r for r in summary["launches"]}
    assert rows[("gfx_autograd_0", "gemm")]["line"] == waiting, rows
    assert rows[(main, "gemm")]["line"].startswith("launch_a ("), rows


def test_a_launch_copy_ends_with_its_threads_stack(built: cs.Built) -> None:
    """A launch from a thread whose 64 KiB stack lies right below other
    readable memory: the copy takes the stack up to its mapping's end, not the
    72 KiB a copy may take (cudakernels' ring holds so many more of them)."""
    from gfxbpf.bpf.ringbuf import RingBuffer
    from gfxbpf.catalog import entries, instance, objects
    from gfxbpf.client.profiles.copies import HEADER, parse_header
    from gfxbpf.client.profiles.python.records import is_python

    entry = entries.load_catalog().get("cudakernels")
    with _workload(built, ALICE) as w:
        params = instance.Params(
            uid=uid_of(ALICE), pid=w.pid, library=str(built.inject), stack_bytes=DEEP_STACK_BYTES
        )
        inst = instance.start(entry, objects.read_object(entry), params)
        try:
            ring = RingBuffer(inst.obj.map("stack_copies").fd)
            _collecting(w, 1)
            w.command("thread")
            w.command("deep 1")  # the main thread, from under a 40 KiB frame: 40 KiB and more
            got = ring.poll(5.0) + ring.poll(0.5)
            records = [r for r in got if len(r) >= HEADER.size and not is_python(r)]
            ring.close()
        finally:
            inst.close()
    sizes = sorted(parse_header(r)[3] for r in records)
    assert len(sizes) == 2, sizes
    assert sizes[0] < 16 << 10 and sizes[1] > 40 << 10, sizes


@pytest.mark.parametrize("listener", ["catalog", "gfxclient"])
def test_gpu_check_step6_measures_the_standin_exactly(
    broker: BrokerProcess, built: cs.Built, listener: str, tmp_path: Path
) -> None:
    """bench/gpu_kernels_check.py (tools/gpu_check.sh step 6) on the stand-in: the
    same steps as on a GPU, with a workload whose truth is known exactly."""
    out = tmp_path / "kernels.json"
    argv = [VENV_PYTHON, str(CHECK), "--inject", str(built.inject), "--python", PYTHON,
            "--launches", "2000", "--matmuls", "40", "--out", str(out),
            "--workload", str(built.script.parent / "gpu_check_workload.py")]  # fmt: skip
    if listener == "gfxclient":
        argv += ["--socket", broker.socket, "--user", ALICE]
    env = {**os.environ, "GFX_STANDIN": str(built.standin), "GFX_CUPTI_POLL_MS": "20"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    s = res["summary"]
    assert s["records_while_not_listened"] == 0 and s["records_after_detach"] == 0
    assert s["device_ns_over_events"] == 1.0 and s["kernels_per_product"] == 1.0
    assert s["copies_exact"] is True, res["copies"]
    assert s["copy_ns_over_events"] == {"htod": 1.0, "dtoh": 1.0}, res["copies"]
    assert s["copy_apis_probed"] == 7, res["stats_listened"]
    pairs = res["not_listened_interleaved"]
    assert len(pairs["no_library_us"]) == len(pairs["loaded_us"]) == 3, pairs
    assert s["overhead_pct_loaded_interleaved"] == pairs["overhead_pct"] is not None
    rows = {(r["kernel"], r["launched_from"]): r for r in res["matmul"]["rows"]}
    if listener == "gfxclient":
        prof = res["profile_gpu"]
        assert prof["total_ns"] == 40 * cs.GPU_CHECK_NS, prof
        assert {s["stack"][-1] for s in prof["stacks"]} == {"gemm"}
        assert any(f.startswith("mm_b (") for f in prof["stacks"][0]["stack"]), prof
        assert prof["whole_pct"] == 100.0 and s["profile_gpu_whole_pct"] == 100.0, prof
        assert prof["merged_pct"] == 0.0 and "profile_gpu_train" not in res, prof
        assert prof["python_line_pct"] == 100.0 and prof["main_thread_pct"] == 0.0, prof
        moved = res["profile_gpu_copies"]  # each way, under the workload's `copies`
        assert {s["stack"][-1] for s in moved["stacks"]} == {"[memcpy htod]", "[memcpy dtoh]"}
        assert moved["copy_ns"] == moved["total_ns"] == 2 * COPIES_CHECK * cs.GPU_CHECK_NS
        assert s["profile_gpu_copy_python_line_pct"] == 100.0, moved
        where = {k[1].split(" (")[0] for k in rows}
        assert where == {"mm_a", "mm_b"}, rows
        assert sorted(r["kernels"] for r in rows.values()) == [10, 30]
    else:
        assert list(rows) == [("gemm", "launch seen")]
    assert all(r["device_ns"] == r["kernels"] * cs.GPU_CHECK_NS for r in rows.values())
    # Beside torch.profiler (none on the stand-in): listened to again, every record.
    both = res["coexist"]
    assert "error" not in both and both["records_after_profiler"] == 2000, both
    # The stand-in's "profiler" holds CUPTI's subscription: started first, it
    # keeps the library out, which counts its refused tries.
    assert both["collecting_with_profiler_first"] == 0, both
    assert s["library_refusals_with_profiler_first"] >= 1, s


def _watched(
    broker: BrokerProcess, built: cs.Built, env: dict[str, str], work: list[str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """`watch cuda --gpu` of alice's workload (library or stand-in knobs in
    env) over the commands in work: its last view, and the library's counters."""
    with cs.Workload(built, PYTHON, setpriv_user_argv(ALICE, []), env={**BASE_ENV, **env},
                     cwd="/") as mine:  # fmt: skip
        watch = _watch(broker, ALICE, "--pid", str(mine.pid))
        try:
            _first(watch)
            _collecting(mine, 1)
            for command in work:
                mine.command(command)
            stats = mine.stats()
            lines = _finish(watch)
        finally:
            if watch.poll() is None:
                watch.kill()
    return lines[-1], stats


def test_fast_launches_are_sampled_and_the_totals_stay_exact(
    broker: BrokerProcess, built: cs.Built
) -> None:
    """Launches faster than the library probes: 1 in 8 (fixed here) walks the
    stacks, the rows per launching function are estimates within 15%, and the
    totals per kernel are exact; at the default, a rate too high for the
    library's budget (GFX_CUPTI_LAUNCH_RATE) turns sampling on by itself."""
    n = 4000
    got = _watched(
        broker, built, {"GFX_CUPTI_LAUNCH_EVERY": "8"}, [f"a {n}", f"b {n}", f"copy {n}"]
    )[0]
    assert got["kernels"] == 3 * n and got["device_ns"] == n * (2 * cs.NS["gemm"] + cs.NS["relu"])
    assert 0 < got["kernels_launched_unprobed"] < 3 * n
    rows = {(k["kernel"], k["function"].split(" (")[0]): k for k in got["by_kernel"]}
    assert set(rows) == {("gemm", "launch_a"), ("gemm", "launch_b"), ("relu", "launch_b")}, rows
    for (name, _), row in rows.items():
        assert row["estimated"] and abs(row["kernels"] - n) <= 0.15 * n, row
        assert row["device_ns"] == row["kernels"] * cs.NS[name]
    # Copy calls are sampled as launches are: their line's row an estimate, the total exact.
    ((copies,), (site,)) = got["copies"], got["copies_by_function"]
    assert (copies["copies"], copies["device_ns"]) == (n, n * cs.NS["copy"]), copies
    assert site["function"].startswith("<module> (") and site["estimated"], site
    assert (
        abs(site["copies"] - n) <= 0.15 * n and site["device_ns"] == site["copies"] * cs.NS["copy"]
    )
    work = [f"a {5 * n}", f"b {5 * n}"]
    adaptive = _watched(broker, built, {"GFX_CUPTI_LAUNCH_RATE": "1"}, work)[0]
    assert adaptive["kernels"] == 15 * n and adaptive["kernels_launched_unprobed"] > 0, adaptive
