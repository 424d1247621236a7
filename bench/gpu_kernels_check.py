"""GPU time per kernel against the truth, and the injection library's cost (run as root).

tools/gpu_check.sh's step 6; also runs alone:

  python3 bench/gpu_kernels_check.py --inject LIB [--python PY] [--user NAME]
      [--launches N] [--matmuls N] [--pairs K] [--out FILE.json] [--socket SOCKET]

LIB is gfxbpf's CUPTI injection library (gpu/cupti/build.sh). The workload
(bench/gpu_kernels_workload.py) runs as --user with PyTorch. Measured:
  1. a launch-bound loop (N tiny kernels) in a process without the library,
     with it loaded but not listened to, and listened to (the `cudakernels`
     program attached to that process), and under torch.profiler: time per launch;
     and, for the not-listened cost across processes, K processes without the
     library and K with it loaded, alternately (median over processes);
  2. while nothing listens, the library's own counter of records collected (0);
  3. listened, N matrix products of a fixed size, each between CUDA events:
     kernels counted and device ns per kernel from the `cudakernels` maps
     against the events' total; then copies each way between pinned host
     memory and the GPU: counted, their bytes, their GPU time against events;
  4. with --socket SOCKET (a broker whose policy grants the user
     `cudakernels`), listened to through `gfxclient watch cuda --gpu --json`, as
     the user: rows per kernel and launching Python function;
  5. last, torch.profiler beside a watch, both ways round (coexist): the
     kernels each side still sees, and with the profiler first whether the
     library is refused CUPTI (its `refused` count).
Without --socket the program is attached here, as root, straight from the
catalog (no broker): the figures are the program's own maps.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "gpu_kernels_workload.py")
REPEATS = 5


@functools.cache
def readable_copy(path: str) -> str:
    """The workload in a folder every user can read (the checkout may be root's alone)."""
    folder = tempfile.mkdtemp(prefix="gfxbpf-gpu-kernels-")
    os.chmod(folder, 0o755)
    dest = os.path.join(folder, os.path.basename(path))
    shutil.copyfile(path, dest)
    os.chmod(dest, 0o644)
    return dest


class Workload:
    source = SOURCE  # the workload script (tests use one on the CUPTI stand-in)

    def __init__(self, py: str, user: str | None, inject: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_INJECTION64_PATH"}
        if inject:
            env["CUDA_INJECTION64_PATH"] = inject
        prefix = ["runuser", "-u", user, "--"] if user else []
        self.proc = subprocess.Popen(
            [*prefix, py, readable_copy(self.source)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/",
        )  # fmt: skip
        hello = self._read()
        self.pid: int = hello["ready"]  # its own pid (runuser may stay as its parent)
        self.injected = hello["injected"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"workload exited with {self.proc.wait()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def ask(self, cmd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.ask("exit")
        except (BrokenPipeError, RuntimeError, json.JSONDecodeError):
            pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def per_launch(w: Workload, n: int, cmd: str = "loop") -> dict[str, float]:
    # torch.profiler's trace takes seconds to process: fewer, shorter runs of it
    repeats, n = (3, min(n, 5000)) if cmd == "profile" else (REPEATS, n)
    times = [w.ask(f"{cmd} {n}")["s_per_launch"] * 1e6 for _ in range(repeats)]
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times)}


def wait_collecting(w: Workload, want: int, timeout: float = 5.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if w.ask("stats")["collecting"] == want:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"the injection library never reached collecting={want}")


class Direct:
    """cudakernels attached here, as root, straight from the catalog (no broker)."""

    def __init__(self, pid: int, uid: int, inject: str) -> None:
        from gfxbpf.catalog import entries, instance, objects

        entry = entries.load_catalog().get("cudakernels")
        params = instance.Params(uid=uid, pid=pid, library=inject)
        self.inst = instance.start(entry, objects.read_object(entry), params)

    def rows(self) -> dict[tuple[str, str], dict[str, int]]:
        """(kernel name, launch seen) -> kernels, ns, summed over the rows."""
        from gfxbpf.client.profiles.gpu.kernels import KERNEL_KEY, KERNEL_STATS

        names = {
            struct.unpack("<Q", k)[0]: v.split(b"\0", 1)[0].decode(errors="replace")
            for k, v in self.inst.obj.map("names").items()
        }
        out: dict[tuple[str, str], dict[str, int]] = {}
        for k, v in self.inst.obj.map("kernels").items():
            _tgid, _uid, _py, name_hash, flags, _weight, _sp = KERNEL_KEY.unpack(k)
            n, ns = KERNEL_STATS.unpack(v)
            seen = {1: "launch seen", 2: "launch not sampled"}.get(flags, "not seen")
            key = (names.get(name_hash, hex(name_hash)), seen)
            row = out.setdefault(key, {"kernels": 0, "ns": 0})
            row["kernels"] += n
            row["ns"] += ns
        return out

    def copies(self) -> dict[str, dict[str, int]]:
        """kind -> copies, bytes, ns, summed over the map's rows."""
        from gfxbpf.catalog.cupti_kinds import copy_kind
        from gfxbpf.client.profiles.gpu.transfers import KEY, STATS

        out: dict[str, dict[str, int]] = {}
        for k, v in self.inst.obj.map("copies").items():
            n, nbytes, ns = STATS.unpack(v)
            _add_copies(out, copy_kind(KEY.unpack(k)[2]), n, nbytes, ns)
        return out

    def close(self) -> None:
        self.inst.close()


def _add_copies(out: dict[str, dict[str, int]], kind: str, n: int, nbytes: int, ns: int) -> None:
    row = out.setdefault(kind, {"copies": 0, "bytes": 0, "ns": 0})
    row["copies"] += n
    row["bytes"] += nbytes
    row["ns"] += ns


class ClientWatch:
    """`gfxclient watch cuda --gpu --json` as the user, through the broker at socket."""

    def __init__(self, pid: int, user: str | None, socket: str) -> None:
        prefix = ["runuser", "-u", user, "--"] if user else []
        env = ["env", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}"]
        client = [sys.executable, "-m", "gfxbpf.client", "--socket", socket]
        view = ["watch", "cuda", "--gpu", "--pid", str(pid), "--json", "--interval", "0.25"]
        self.proc = subprocess.Popen(
            [*prefix, *env, *client, *view],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.last: dict[str, Any] | None = None
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.lock:
                self.last = json.loads(line)

    def rows(self) -> dict[tuple[str, str], dict[str, int]]:
        time.sleep(0.6)  # two views after the last change
        with self.lock:
            if self.last is None:
                err = self.proc.stderr.read() if self.proc.poll() is not None else ""
                raise RuntimeError(f"gfxclient showed nothing yet {err}")
            rows = self.last["by_kernel"]
        return {
            (r["kernel"], r["function"]): {"kernels": r["kernels"], "ns": r["device_ns"]}
            for r in rows
        }

    def copies(self) -> dict[str, dict[str, int]]:
        """kind -> copies, bytes, ns, from the watch's last view (`copies`)."""
        self.rows()  # waits for a view after the last change
        with self.lock:
            rows = (self.last or {}).get("copies", [])
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            _add_copies(out, r["kind"], r["copies"], r["bytes"], r["device_ns"])
        return out

    def close(self) -> None:
        # runuser passes no SIGINT on: the group (gfxclient with it) gets it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def diff(
    after: dict[Any, dict[str, int]], before: dict[Any, dict[str, int]], count: str = "kernels"
) -> dict[Any, Any]:
    """What each row gained between two readings; rows whose `count` did not move left out."""
    out = {}
    for key, row in after.items():
        old = before.get(key, {})
        delta = {k: v - old.get(k, 0) for k, v in row.items()}
        if delta[count]:
            out[key] = delta
    return out


def matmul_check(w: Workload, listener: Any, n: int) -> dict[str, Any]:
    w.ask("prep")
    time.sleep(0.3)
    before = listener.rows()
    truth = w.ask(f"matmul {n}")
    time.sleep(0.5)  # the library hands records over at its next poll (100 ms)
    got = diff(listener.rows(), before)
    rows = [
        {"kernel": name, "launched_from": where, "kernels": r["kernels"], "device_ns": r["ns"]}
        for (name, where), r in sorted(got.items(), key=lambda t: -t[1]["ns"])
    ]
    # The workload's spacers (_gpu_busy: the GPU kept busy while the host
    # launches each product) are outside the events: not the products' kernels.
    spacers = [r for r in rows if r["launched_from"].startswith("_gpu_busy ")]
    rows = [r for r in rows if r not in spacers]
    total = sum(r["device_ns"] for r in rows)
    return {
        "truth": truth,
        "spacer_kernels": sum(r["kernels"] for r in spacers),
        "rows": rows,
        "kernels_total": sum(r["kernels"] for r in rows),
        "device_ns_total": total,
        "ratio_to_events": total / truth["event_ns_total"] if truth["event_ns_total"] else None,
    }


def copies_check(w: Workload, listener: Any, n: int) -> dict[str, Any]:
    """N copies each way: counted and their bytes exactly, their GPU time
    against the CUDA events around each."""
    before = listener.copies()
    truth = w.ask(f"copies {n}")
    if "error" in truth:
        return {"error": truth["error"], "exact": None}
    time.sleep(0.5)  # the library hands records over at its next poll
    got = diff(listener.copies(), before, "copies")
    want = {kind: (n, n * truth["bytes"]) for kind in ("htod", "dtoh")}
    events = truth["event_ns"]
    return {
        "truth": truth,
        "got": got,
        "exact": {k: (v["copies"], v["bytes"]) for k, v in got.items()} == want,
        "ns_over_events": {
            k: round(v["ns"] / events[k], 4) if events.get(k) else None for k, v in got.items()
        },
    }


def profile_check(w: Workload, args: argparse.Namespace, work: str) -> dict[str, Any]:
    """`gfxclient profile --gpu` while the workload runs `work` ("matmul N",
    "train N"): the heaviest launch stacks, and the shares of device time
    whose stack is whole and whose stack merged several native paths."""
    prefix = ["runuser", "-u", args.user, "--"] if args.user else []
    env = ["env", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}"]
    argv = [sys.executable, "-m", "gfxbpf.client", "--socket", args.socket, "--json",
            "profile", "--gpu", "--pid", str(w.pid), "--duration", "6"]  # fmt: skip
    proc = subprocess.Popen(
        [*prefix, *env, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_collecting(w, 1, 30)  # attached: the library collects again
        w.ask(work)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode:
        return {"error": err[-2000:]}
    return _shares(json.loads(out))


LEAVES = ("[memcpy ", "[memset]")  # the leaves of copies and memsets in profile --gpu


def _shares(got: dict[str, Any]) -> dict[str, Any]:
    """A profile --gpu --json's shares of device time: see profile_check."""
    from gfxbpf.client.profiles.python.records import MAIN_FRAME, parse_frame_name
    from gfxbpf.client.profiles.unwind.result import Stop, marker_frame

    total = got["total_ns"]
    # Launch stacks whole down to the process's start: cuBLASLt launches ~70 KiB
    # deep, which the 72 KiB copy `approve` writes for cudakernels reaches.
    whole = sum(s["device_ns"] for s in got["stacks"] if "Py_BytesMain" in s["stack"])
    several = marker_frame(Stop.MERGED)
    merged = sum(s["device_ns"] for s in got["stacks"] if several in s["stack"])
    # Unbroken: no marker of a stop, so the unwind reached its thread's first
    # frame: Py_BytesMain's chain, or a thread's start (autograd's backward
    # kernels, whose thread has no Python frame).
    unbroken = sum(
        s["device_ns"]
        for s in got["stacks"]
        if not any(f == several or f.startswith("[unwind stopped") for f in s["stack"])
    )
    # A Python line above the launch: the launching thread's, or for autograd's
    # thread (no Python of its own) the main thread's, under MAIN_FRAME.
    under_python = [s for s in got["stacks"] if any(parse_frame_name(f) for f in s["stack"])]
    python = sum(s["device_ns"] for s in under_python)
    main = sum(s["device_ns"] for s in got["stacks"] if MAIN_FRAME in s["stack"])

    # Copies and memsets drawn under their call ([memcpy KIND], [memset] leaves),
    # and how much of that reaches a Python line (`.item()`, `.to("cuda")`).
    def moved(stacks: list[dict[str, Any]]) -> int:
        return sum(s["device_ns"] for s in stacks if s["stack"][-1].startswith(LEAVES))

    moved_ns, moved_py = moved(got["stacks"]), moved(under_python)
    return {
        "total_ns": total,
        "whole_pct": round(100.0 * whole / total, 1) if total else None,
        "python_line_pct": round(100.0 * python / total, 1) if total else None,
        "main_thread_pct": round(100.0 * main / total, 1) if total else None,
        "unbroken_pct": round(100.0 * unbroken / total, 1) if total else None,
        # a Python chain (or autograd's thread, which has none) whose kernels'
        # copies unwound to different paths: launch stacks are per kernel
        "merged_pct": round(100.0 * merged / total, 1) if total else None,
        "copy_ns": moved_ns,
        "copy_python_line_pct": round(100.0 * moved_py / moved_ns, 1) if moved_ns else None,
        "stacks": got["stacks"][:4],
        "notes": got["notes"],
    }


def listen(w: Workload, args: argparse.Namespace, uid: int, res: dict[str, Any]) -> Any:
    """gfxclient through the broker if given one, else (or if that fails) the catalog here."""
    if args.socket:
        client = ClientWatch(w.pid, args.user, args.socket)
        try:
            res["collecting_after_s"] = round(wait_collecting(w, 1, 30), 3)
            res["listener"] = "gfxclient watch cuda --gpu"
            return client
        except RuntimeError as e:
            client.close()
            assert client.proc.stderr is not None
            res["gfxclient_error"] = f"{e}: {client.proc.stderr.read()[-2000:]}"
    direct = Direct(w.pid, uid, args.inject)
    res["collecting_after_s"] = round(wait_collecting(w, 1, 10), 3)
    res["listener"] = "cudakernels from the catalog, as root"
    return direct


def interleaved(args: argparse.Namespace) -> dict[str, Any]:
    """The library loaded and not listened to, against none, across processes:
    `--pairs` processes of each, started alternately, each timing the loop.
    One process per figure cannot resolve 1%: on an H200 the same loop took
    6.6 µs a launch in one process and 10.6 in another (docs/gpu-hosts.md);
    the median over processes is steadier."""
    plain: list[float] = []
    loaded: list[float] = []
    for _ in range(args.pairs):
        for inject, out in ((None, plain), (args.inject, loaded)):
            w = Workload(args.python, args.user, inject)
            try:
                out.append(per_launch(w, args.launches)["median_us"])
            finally:
                w.close()
    base, got = statistics.median(plain), statistics.median(loaded)
    return {
        "no_library_us": plain,
        "loaded_us": loaded,
        "overhead_pct": round(100.0 * (got - base) / base, 2) if base else None,
    }


def overhead(args: argparse.Namespace, uid: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if args.pairs:
        res["not_listened_interleaved"] = interleaved(args)
    plain = Workload(args.python, args.user, None)
    try:
        res["no_library"] = per_launch(plain, args.launches)
        res["torch_profiler"] = per_launch(plain, args.launches, "profile")
    finally:
        plain.close()
    w = Workload(args.python, args.user, args.inject)
    try:
        res["loaded_not_listened"] = per_launch(w, args.launches)
        res["records_while_not_listened"] = w.ask("stats")["records"]
        listener = listen(w, args, uid, res)
        try:
            res["listened"] = per_launch(w, args.launches)
            res["matmul"] = matmul_check(w, listener, args.matmuls)
            res["copies"] = copies_check(w, listener, COPIES)
            res["stats_listened"] = w.ask("stats")
        finally:
            listener.close()
        res["stopped_after_s"] = round(wait_collecting(w, 0, 15), 3)
        if args.socket:
            res["profile_gpu"] = profile_check(w, args, f"matmul {args.matmuls}")
            wait_collecting(w, 0, 15)
            res["profile_gpu_copies"] = profile_check(w, args, f"copies {COPIES}")
            wait_collecting(w, 0, 15)
            if args.workload == SOURCE:  # PyTorch's (the stand-in has no training step)
                res["profile_gpu_train"] = profile_check(w, args, "train 5")
                wait_collecting(w, 0, 15)
        before = w.ask("stats")["records"]
        w.ask(f"loop {args.launches}")
        res["records_after_detach"] = w.ask("stats")["records"] - before
        res["torch_profiler_with_library_loaded"] = per_launch(w, args.launches, "profile")
        res["coexist"] = coexist(w, args, uid)
    finally:
        w.close()
    return res


COEXIST_LAUNCHES = 2000
COPIES = 20  # each way


def coexist(w: Workload, args: argparse.Namespace, uid: int) -> dict[str, Any]:
    """torch.profiler and a listened watch in one process, both ways round.
    torch.profiler's Kineto registers its own activity buffers and enables
    and, when done, disables the kernel records, even when CUPTI refused it
    a subscription: (a) torch.profiler run while the watch listens: the
    kernels its trace holds, and the records the library still collects
    afterwards; (b) a torch.profiler session that outlives the watch: the
    kernels its trace holds once the library let go. Last in the run: what
    CUPTI does then is what this measures."""
    out: dict[str, Any] = {}
    n = COEXIST_LAUNCHES
    listener = None
    started: dict[str, Any] = {}
    try:
        listener = listen(w, args, uid, {})
        before = w.ask("stats")["records"]
        out["profiler_while_listened"] = w.ask(f"profile_count {n}")
        time.sleep(0.5)  # the library hands records over at its polls
        during = w.ask("stats")["records"]
        after = w.ask(f"loop {n}")
        time.sleep(0.5)
        out["records_during_profiler"] = during - before
        out["records_after_profiler"] = w.ask("stats")["records"] - during
        out["launches_after_profiler"] = after.get("launched")
        started = w.ask("profiler_start")
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if listener is not None:
            listener.close()
    if started.get("started"):
        try:
            wait_collecting(w, 0, 15)
            out["profiler_after_watch_ended"] = w.ask(f"profiler_stop {n}")
            out.update(_profiler_first(w, args, uid))
        except (RuntimeError, OSError, ValueError) as e:
            out["error"] = f"{type(e).__name__}: {e}"
    return out


def _profiler_first(w: Workload, args: argparse.Namespace, uid: int) -> dict[str, Any]:
    """(c) A torch.profiler session open before the watch starts: whether
    Kineto holds CUPTI's subscription (the library refused: `refusals` rises,
    `collecting` stays 0, and the watch says so) or only its activity records."""
    out: dict[str, Any] = {}
    w.ask("profiler_start")
    watch: Direct | ClientWatch = (
        ClientWatch(w.pid, args.user, args.socket)
        if args.socket
        else Direct(w.pid, uid, args.inject)
    )
    try:
        time.sleep(2.0)  # some of the library's polls
        stats = w.ask("stats")
        out["collecting_with_profiler_first"] = stats.get("collecting")
        out["refusals_with_profiler_first"] = stats.get("refused")
    finally:
        watch.close()
    wait_collecting(w, 0, 15)
    out["profiler_first"] = w.ask(f"profiler_stop {COEXIST_LAUNCHES}")
    return out


def _pct(part: Any, whole: Any) -> float | None:
    if not isinstance(part, int) or not isinstance(whole, int) or not whole:
        return None
    return round(100.0 * part / whole, 1)


def _profile_figures(res: dict[str, Any]) -> dict[str, Any]:
    """profile --gpu's shares: of the products, of the copies, of training steps."""
    products = res.get("profile_gpu") or {}
    moved = res.get("profile_gpu_copies") or {}
    train = res.get("profile_gpu_train") or {}
    return {
        "profile_gpu_whole_pct": products.get("whole_pct"),
        # copies drawn under the Python line that made them (`copies N`: all of them)
        "profile_gpu_copy_python_line_pct": moved.get("copy_python_line_pct"),
        **{
            f"profile_gpu_train_{k}": train.get(k)
            for k in ("whole_pct", "merged_pct", "unbroken_pct", "python_line_pct")
        },
        "profile_gpu_train_main_thread_pct": train.get("main_thread_pct"),
    }


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The figures to compare with the acceptance: overheads in %, device time / events."""

    def pct(key: str, base_key: str = "no_library") -> float | None:
        base, got = res.get(base_key), res.get(key)
        if not base or not got:
            return None
        return round(100.0 * (got["median_us"] - base["median_us"]) / base["median_us"], 2)

    mm = res.get("matmul") or {}
    products = (mm.get("truth") or {}).get("products")
    both = res.get("coexist") or {}
    while_listened = both.get("profiler_while_listened") or {}
    outlived = both.get("profiler_after_watch_ended") or {}
    return {
        "launch_us_no_library": (res.get("no_library") or {}).get("median_us"),
        "overhead_pct_loaded_not_listened": pct("loaded_not_listened"),
        "overhead_pct_loaded_interleaved": (res.get("not_listened_interleaved") or {}).get(
            "overhead_pct"
        ),
        "overhead_pct_listened": pct("listened"),
        # Against the same process not listened to: processes' own launch times
        # differ by up to ±30% on an H200 (docs/gpu-hosts.md), one process does not.
        "overhead_pct_listened_same_process": pct("listened", "loaded_not_listened"),
        "overhead_pct_torch_profiler": pct("torch_profiler"),
        "device_ns_over_events": mm.get("ratio_to_events"),
        "kernels_per_product": mm["kernels_total"] / products if products else None,
        # copies each way: counted with their bytes exactly, and their GPU time
        "copies_exact": (res.get("copies") or {}).get("exact"),
        "copy_ns_over_events": (res.get("copies") or {}).get("ns_over_events"),
        # the copy and memset calls the library probes (CUPTI's names of them)
        "copy_apis_probed": (res.get("stats_listened") or {}).get("copy_apis"),
        "records_while_not_listened": res.get("records_while_not_listened"),
        "records_after_detach": res.get("records_after_detach"),
        **_profile_figures(res),
        # torch.profiler beside a watch (coexist): each side's share of the kernels
        "torch_profiler_kernels_pct_while_listened": _pct(
            while_listened.get("profiler_kernels"), while_listened.get("launches")
        ),
        "records_pct_after_torch_profiler": _pct(
            both.get("records_after_profiler"), both.get("launches_after_profiler")
        ),
        "torch_profiler_kernels_pct_after_watch_ended": _pct(
            outlived.get("profiler_kernels"), outlived.get("launches")
        ),
        # (c) torch.profiler first: the library refused CUPTI (> 0), or not (0)
        "library_refusals_with_profiler_first": both.get("refusals_with_profiler_first"),
        "torch_profiler_kernels_pct_with_profiler_first": _pct(
            (both.get("profiler_first") or {}).get("profiler_kernels"),
            (both.get("profiler_first") or {}).get("launches"),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--inject", required=True, help="the injection library (libgfxcupti-cuNN.so)")
    ap.add_argument("--python", default="python3", help="a Python with PyTorch (CUDA)")
    ap.add_argument("--user", default=None, help="run the workload as this user (default: root)")
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--matmuls", type=int, default=200)
    ap.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="processes without the library and with it loaded, alternately, for the\n"
        "not-listened overhead across processes (0: none)",
    )
    ap.add_argument("--out", default=None, help="write the results here as JSON")
    ap.add_argument("--socket", default=None, help="a broker's socket: listen with gfxclient")
    ap.add_argument("--workload", default=SOURCE, help=argparse.SUPPRESS)  # tests: a stand-in
    args = ap.parse_args(argv)
    Workload.source = args.workload
    res = overhead(args, uid_of(args.user))
    res["summary"] = summary(res)
    write_results(res, args.out)
    return 0


def uid_of(user: str | None) -> int:
    """The workload user's uid (root's 0 when there is none)."""
    if not user:
        return 0
    return int(
        subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout
    )


def write_results(res: dict[str, Any], out: str | None) -> None:
    """The results as JSON on stdout, and in out if given."""
    text = json.dumps(res, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
