"""15. A profile's fixed cost: profiling a command that does nothing.

`true` and `python3 -c pass` run for a millisecond or two, so the whole time
of `gfxclient profile -o FILE.svg -- COMMAND` is what a profile costs whatever
it profiles: start-up, connecting, attaching, holding the command until the
attachment is live, reading the maps, naming frames and writing the flame
graph. Against `perf record -g -o FILE -- COMMAND` and, for the Python
command, `py-spy record -o FILE.svg -- COMMAND` (py-spy profiles Python
only), each from start to exit, the peers started as root through setpriv as
the bench user, gfxclient as the bench user. gfxclient's --json summary says
how much of its time came after the command ended (read_s, output_s).
py-spy often fails on a process this short ("Failed to find python version
from target process"): its time is kept all the same (what its user waits)
and its failures are counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from bench.harness import BenchError, Stage, log
from bench.python_profile import find_pyspy
from bench.stats import median, ratio

TARGETS = {"true": ["true"], "python3 -c pass": ["/usr/bin/python3", "-c", "pass"]}


def _timed(argv: list[str], what: str, failed: list[str] | None = None) -> float:
    """Seconds from start to exit; a failure raises, or with failed, is
    counted there (its first line) and timed all the same."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        if failed is None:
            raise BenchError(f"{what} failed ({r.returncode}): {r.stderr.strip()[-1000:]}")
        failed.append(next((x for x in r.stderr.splitlines() if "rror" in x), r.stderr[:200]))
    return dt


def _gfxclient(stage: Stage, target: list[str], out: str) -> tuple[float, dict[str, Any]]:
    dt, text = stage.timed_gfxclient("--json", "profile", "-o", out, "--", *target)
    summary = json.loads(text[text.index("{") :])
    return dt, {k: summary.get(k) for k in ("read_s", "output_s", "duration_s")}


def _one(stage: Stage, name: str, target: list[str], rounds: int, pyspy: str) -> dict[str, Any]:
    work = stage.work / "fixed"
    ours, perf, spy, parts = [], [], [], []
    spy_failed: list[str] = []  # py-spy often misses a process this short
    for i in range(rounds):  # interleaved: a shared machine's load falls on each alike
        log(f"fixed cost: {name}, round {i + 1}/{rounds}")
        dt, part = _gfxclient(stage, target, str(work / "out.svg"))
        ours.append(dt)
        parts.append(part)
        perf_argv = ["perf", "record", "-q", "-g", "-o", str(work / "perf.data"), "--"]
        perf.append(_timed(perf_argv + stage.setpriv(target), "perf record"))
        if target[0].endswith("python3"):
            spy_argv = [pyspy, "record", "-o", str(work / "spy.svg"), "--"]
            spy.append(_timed(spy_argv + stage.setpriv(target), "py-spy record", spy_failed))
    res: dict[str, Any] = {
        "gfxclient_s": round(median(ours), 4),
        "perf_record_s": round(median(perf), 4),
        "ratio_vs_perf": ratio(median(ours), median(perf)),
        "gfxclient_rounds_s": [round(x, 4) for x in ours],
        "gfxclient_summary": parts[-1],
    }
    if spy:
        res["pyspy_record_s"] = round(median(spy), 4)
        res["ratio_vs_pyspy"] = ratio(median(ours), median(spy))
        res["pyspy_failed"] = len(spy_failed)
        res["pyspy_failure"] = spy_failed[0] if spy_failed else None
    return res


def run(stage: Stage, rounds: int) -> dict[str, Any]:
    work = stage.work / "fixed"
    work.mkdir(exist_ok=True)
    os.chown(work, stage.bench_uid, stage.bench_gid)
    pyspy = find_pyspy(stage)
    # One profile of each first, not timed: the caches a user's second profile
    # finds (symbols, unwind tables: ~/.cache/gfxbpf).
    for target in TARGETS.values():
        stage.timed_gfxclient("profile", "-o", str(work / "warm.svg"), "--", *target)
    return {name: _one(stage, name, target, rounds, pyspy) for name, target in TARGETS.items()}
