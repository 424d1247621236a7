"""15. Lock contention: the cost per contended lock operation of a workload
whose four threads contend one pthread mutex, under `gfxclient profile
--locks` (program locks, scope self) and under `perf lock contention -b`
(root), in one run.

A contended operation is a futex wait that slept (and the wake that ended
it: two records with stack copies for gfxclient), as `--locks` counts them
in the same round; the workload's own count of failed trylocks is larger (a
lock released before the waiter sleeps costs no system call) and is kept in
the JSON only. The workload times itself, so start-up and attach are
outside its figure. gfxclient runs it as `-- COMMAND`; perf runs it
through setpriv as the bench user. `perf lock contention -b` traces the
kernel's contention_begin/contention_end tracepoints (kernel locks, the
futex hash bucket's among them) with BPF; Debian's perf is built without
BUILD_BPF_SKEL, and then the row says so in perf's words.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.harness import (
    BenchError,
    Stage,
    bpf_stats_enabled,
    log,
    new_prog_stats,
    sh,
    workload_timing,
)
from bench.profile_bench import user_dir
from bench.stats import median, ratio

CONTEND_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static pthread_mutex_t hot = PTHREAD_MUTEX_INITIALIZER;
static long iterations;
static long contended[4];
volatile unsigned long sink;
static double now(void)
{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *worker(void *arg)
{
    long me = (long)arg;
    for (long i = 0; i < iterations; i++) {
        if (pthread_mutex_trylock(&hot)) {
            contended[me]++;
            pthread_mutex_lock(&hot);
        }
        for (int k = 0; k < 200; k++) sink += k;  /* held: others queue */
        pthread_mutex_unlock(&hot);
        for (int k = 0; k < 200; k++) sink += k;
    }
    return 0;
}
int main(int argc, char **argv)
{
    pthread_t t[4];
    long n = 0;
    double t0;
    iterations = atol(argv[1]);
    t0 = now();
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    for (int i = 0; i < 4; i++) n += contended[i];
    printf("{\"elapsed\": %.6f, \"contended\": %ld}\n", now() - t0, n);
    fflush(stdout);
    return 0;
}
"""


def build(stage: Stage) -> Path:
    src, out = stage.work / "contend.c", stage.work / "contend"
    src.write_text(CONTEND_C)
    sh([shutil.which("gcc") or "gcc", "-O2", "-pthread", "-o", str(out), str(src)])
    out.chmod(0o755)
    return out


def untraced(stage: Stage, prog: Path, n: int) -> dict[str, float]:
    p = stage.as_bench_user([str(prog), str(n)], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=600)
    return workload_timing(out)


def under_gfxclient(
    stage: Stage, prog: Path, n: int
) -> tuple[dict[str, float], dict[str, Any], int]:
    out_file = str(user_dir(stage) / "locks.folded")
    with new_prog_stats(stage.broker_pid) as stats:
        p = stage.gfxclient(
            "--json", "profile", "--locks", "--format", "folded", "-o", out_file,
            "--", str(prog), str(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise BenchError(f"gfxclient profile --locks failed ({p.returncode}): {err[-1000:]}")
    summary = json.loads(out[out.index("\n{") + 1 :] if not out.startswith("{\n") else out)
    return workload_timing(out), summary, sum(ns for _, ns in stats.values())


def perf_lock_support() -> str | None:
    """None when this perf runs `perf lock contention -b`; else why not, in its words."""
    r = subprocess.run(
        ["perf", "lock", "contention", "-b", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode == 0 and "not available" not in r.stderr:
        return None
    lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
    return lines[0] if lines else f"exit status {r.returncode}"


def under_perf(stage: Stage, prog: Path, n: int) -> dict[str, float]:
    argv = ["perf", "lock", "contention", "-b", "--", *stage.setpriv([str(prog), str(n)])]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise BenchError(f"perf lock contention -b failed: {r.stderr[-1000:]}")
    return workload_timing(r.stdout)


def _calibrate(stage: Stage, prog: Path, seconds: float) -> int:
    probe = 50_000
    one = untraced(stage, prog, probe)["elapsed"]
    return max(probe, round(probe * seconds / max(one, 1e-6)))


def _per_op(runs: list[dict[str, float]], base: list[dict[str, float]], ops: float) -> float:
    """The median run's added time per contended operation, in ns."""
    added = median([r["elapsed"] for r in runs]) - median([b["elapsed"] for b in base])
    return round(1e9 * added / max(ops, 1), 1)


def run(stage: Stage, rounds: int, seconds: float) -> dict[str, Any]:
    prog = build(stage)
    n = _calibrate(stage, prog, seconds)
    log(f"locks: 4 threads, {n} lock/unlock each (~{seconds} s untraced)")
    out: dict[str, Any] = {"workload": f"4 threads, {n} lock/unlock each", "iterations": n}
    out["perf_unsupported"] = perf_lock_support()
    runs: dict[str, list[dict[str, float]]] = {"untraced": [], "gfxbpf": [], "perf": []}
    bpf_ns: list[int] = []
    waits: list[int] = []  # futex waits that slept, per --locks round
    with bpf_stats_enabled():
        for _ in range(rounds):  # interleaved: this VM's speed drifts over a minute
            runs["untraced"].append(untraced(stage, prog, n))
            timing, summary, ns = under_gfxclient(stage, prog, n)
            runs["gfxbpf"].append(timing)
            bpf_ns.append(ns)
            waits.append(sum(row["waits"] for row in summary["locks"]))
            out["gfxbpf_lost"] = summary["lost"]
            if out["perf_unsupported"] is None:
                runs["perf"].append(under_perf(stage, prog, n))
    out["rounds"] = {k: v for k, v in runs.items() if v}
    base = runs["untraced"]
    out["untraced_s"] = round(median([b["elapsed"] for b in base]), 4)
    out["trylock_failures_untraced"] = median([b["contended"] for b in base])
    out["contended_ops"] = ops = median(waits)
    for name in ("gfxbpf", "perf"):
        if runs[name]:
            out[f"{name}_s"] = round(median([r["elapsed"] for r in runs[name]]), 4)
            out[f"{name}_slowdown"] = ratio(out[f"{name}_s"], out["untraced_s"])
            out[f"{name}_ns_per_contended_op"] = _per_op(runs[name], base, ops)
    out["gfxbpf_bpf_ns_per_contended_op"] = round(median(bpf_ns) / max(ops, 1), 1)
    return out
