"""What listening to the CUPTI injection library costs, part by part (run as root on a GPU host).

  python3 bench/gpu_overhead_parts.py --inject LIB [--python PY] [--user NAME]
      [--launches N] [--measure loop|train] [--steps N] [--only NAMES] [--out FILE.json]

The launch-bound loop of bench/gpu_kernels_check.py (N tiny kernels back to
back, median of 5) in one fresh process per configuration, against a process
without the library measured in the same run; the listened configurations
also alternate listened and not listened in their own process (ROUNDS times),
which gives overhead_pct_in_process:

  no_library            PyTorch alone
  loaded                the library loaded, nothing listening
  cupti_all             CUPTI activity records and launch callbacks, no probe attached
  cupti_activity        activity records only (no launch callbacks)
  cupti_callbacks       launch callbacks only (no activity records)
  listened              `cudakernels` attached (no Python walk), every launch probed
  listened_python       the same with the target's Python frames walked at the
                        launches the library probes (as deployed: every launch
                        up to GFX_CUPTI_LAUNCH_RATE, then 1 in N at random)
  listened_every_N      the launch probe fired for 1 launch in N (1: every launch)
  listened_no_launch    `cudakernels` attached, no launch callbacks (no launch stacks)
  listened_duty_P       as listened_python, CUPTI on for P% of the time only
                        (GFX_CUPTI_DUTY=ON/20 ms): what a duty cycle would cost
  torch_profiler        torch.profiler with CUDA activities, no library

With --measure train each timing is --steps training steps of a small
transformer (bench/gpu_kernels_workload.py `train`: two encoder layers, AdamW)
instead of the loop, so the same parts are priced at a realistic launch rate.

The parts come from the library's bench knobs (GFX_CUPTI_ALWAYS,
GFX_CUPTI_NO_CALLBACKS, GFX_CUPTI_NO_ACTIVITY, GFX_CUPTI_LAUNCH_EVERY,
GFX_CUPTI_DUTY; see
gpu/cupti/inject.c). `cudakernels` is attached here from the catalog, as root,
without a broker: the program's cost is the same either way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_kernels_check as gk  # noqa: E402

EVERY = (1, 8, 64)
ROUNDS = 3


def python_files(pid: int) -> tuple[Any, ...]:
    from gfxbpf.catalog import pymaps
    from gfxbpf.client.profiles.python import targets

    found = targets.find([pid], None)
    return tuple(
        pymaps.PythonFile(f.dev, f.ino, f.runtime_off or 0, tuple(f.version[:2]), f.is_library)
        for f in found.files.values()
    )


class Attached:
    """`cudakernels` on the workload, from the catalog; walks Python if asked."""

    def __init__(self, w: gk.Workload, uid: int, inject: str, walk: bool) -> None:
        from gfxbpf.catalog import entries, instance, objects

        entry = entries.load_catalog().get("cudakernels")
        files = python_files(w.pid) if walk else ()
        params = instance.Params(uid=uid, pid=w.pid, library=inject, python_files=files)
        self.inst = instance.start(entry, objects.read_object(entry), params)
        gk.wait_collecting(w, 1, 10)

    def close(self) -> None:
        self.inst.close()


def timed(w: gk.Workload, args: argparse.Namespace) -> dict[str, float]:
    """The launch-bound loop's µs per launch, or with --measure train µs per training step."""
    if args.measure == "train":
        return gk.per_launch(w, args.steps, "train")
    return gk.per_launch(w, args.launches)


def measure(args: argparse.Namespace, uid: int, env: dict[str, str], listen: str = "") -> Any:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        w = gk.Workload(args.python, args.user, args.inject if env or listen else None)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        if env.get("GFX_CUPTI_ALWAYS"):
            gk.wait_collecting(w, 1, 10)
        if not listen:
            got = timed(w, args)
            got["stats"] = w.ask("stats")
            return got
        return alternate(args, uid, w, listen)
    finally:
        w.close()


def alternate(args: argparse.Namespace, uid: int, w: gk.Workload, listen: str) -> Any:
    """Not listened and listened in turn, ROUNDS times, in the one process: a
    process's own launch time varies by more than the goal (±20% between
    processes on an H200), so the overhead is taken against its own."""
    quiet, heard = [], []
    for _ in range(ROUNDS):
        quiet.append(timed(w, args)["median_us"])
        att = Attached(w, uid, args.inject, walk=listen == "python")
        try:
            heard.append(timed(w, args)["median_us"])
        finally:
            att.close()
        gk.wait_collecting(w, 0, 15)
    q, h = statistics.median(quiet), statistics.median(heard)
    return {
        "median_us": h,
        "min_us": min(heard),
        "max_us": max(heard),
        "stats": w.ask("stats"),
        "unlistened_median_us": q,
        "overhead_pct_in_process": round(100 * (h - q) / q, 1),
    }


def configurations() -> list[tuple[str, dict[str, str], str]]:
    one = {"GFX_CUPTI_POLL_MS": "100"}  # `loaded`: the library, nothing else
    rows = [
        ("loaded", one, ""),
        ("cupti_all", {"GFX_CUPTI_ALWAYS": "1"}, ""),
        ("cupti_activity", {"GFX_CUPTI_ALWAYS": "1", "GFX_CUPTI_NO_CALLBACKS": "1"}, ""),
        ("cupti_callbacks", {"GFX_CUPTI_ALWAYS": "1", "GFX_CUPTI_NO_ACTIVITY": "1"}, ""),
        ("listened", one, "plain"),
        ("listened_python", one, "python"),  # the product: adaptive launch sampling
        ("listened_no_launch", {"GFX_CUPTI_NO_CALLBACKS": "1"}, "plain"),
    ]
    rows += [(f"listened_every_{n}", {"GFX_CUPTI_LAUNCH_EVERY": str(n)}, "python") for n in EVERY]
    rows += [(f"listened_duty_{p}", {"GFX_CUPTI_DUTY": f"{p // 5}/20"}, "python") for p in (10, 25)]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--inject", required=True, help="the injection library (libgfxcupti-cuNN.so)")
    ap.add_argument("--python", default="python3", help="a Python with PyTorch (CUDA)")
    ap.add_argument("--user", default=None, help="run the workload as this user (default: root)")
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--out", default=None, help="write the results here as JSON")
    ap.add_argument(
        "--measure",
        choices=("loop", "train"),
        default="loop",
        help="loop: N tiny kernels back to back (per launch, the default); train: --steps "
        "training steps of a small transformer (per step: a realistic launch rate)",
    )
    ap.add_argument(
        "--steps", type=int, default=40, help="training steps a timing (--measure train)"
    )
    ap.add_argument(
        "--only",
        default="",
        metavar="NAMES",
        help="only these configurations (comma-separated names from the list above)",
    )
    ap.add_argument("--workload", default=gk.SOURCE, help=argparse.SUPPRESS)  # the stand-in's
    args = ap.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    unknown = only - {name for name, _, _ in configurations()} - {"torch_profiler"}
    if unknown:
        ap.error(f"--only: no configuration {', '.join(sorted(unknown))} (see --help)")
    gk.Workload.source = args.workload
    uid = gk.uid_of(args.user)
    t0 = time.monotonic()
    res: dict[str, Any] = {"no_library": measure(args, uid, {})}
    for name, env, listen in configurations():
        if only and name not in only:
            continue
        try:
            res[name] = measure(args, uid, env, listen)
        except Exception as e:  # one part failing must not lose the others
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{time.monotonic() - t0:6.1f} s {name}: {res[name]}", file=sys.stderr, flush=True)
    if args.measure == "loop" and (not only or "torch_profiler" in only):
        plain = gk.Workload(args.python, args.user, None)
        try:
            res["torch_profiler"] = gk.per_launch(plain, args.launches, "profile")
        finally:
            plain.close()
    base = res["no_library"]["median_us"]
    res["overhead_pct"] = {
        k: round(100.0 * (v["median_us"] - base) / base, 1)
        for k, v in res.items()
        if isinstance(v, dict) and "median_us" in v
    }
    gk.write_results(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
