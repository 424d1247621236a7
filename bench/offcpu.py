"""11. Off-CPU profiles: the slowdown of a context-switch-heavy workload (two
threads ping-ponging a byte over two pipes, each read a block and a switch)
under `gfxclient profile --off-cpu`, against `perf record --off-cpu` and
libbpf-tools' offcputime (run by root), in one run.

Each tool records waits of 1 ms and more (gfxclient's default, perf's
--off-cpu-thresh where it has one, offcputime -m 1000), so nearly every
switch of the workload is looked at and dropped in the kernel: the figure is
the price of a switch, not of output. gfxclient runs the workload as
`-- COMMAND` (its tree only, filtered in the kernel); offcputime -p follows
the same process; perf record runs it through setpriv. The workload times
itself, so start-up and attach are outside its figure.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    BenchError,
    Stage,
    bpf_stats_enabled,
    log,
    new_prog_stats,
    sh,
    stop_tool,
    workload_timing,
)
from bench.profile_bench import profile_run, user_dir
from bench.stats import median, ratio

PINGPONG_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int ab[2], ba[2];
static long rounds;
static double now(void)
{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *pong(void *arg)
{
    char c;
    for (long i = 0; i < rounds; i++)
        if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) exit(1);
    return arg;
}
int main(int argc, char **argv)
{
    pthread_t t;
    char c = 'x';
    double t0;
    rounds = atol(argv[1]);
    if (pipe(ab) || pipe(ba)) return 1;
    pthread_create(&t, 0, pong, 0);
    t0 = now();
    for (long i = 0; i < rounds; i++)
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
    printf("{\"elapsed\": %.6f}\n", now() - t0);
    fflush(stdout);
    pthread_join(t, 0);
    return 0;
}
"""
MIN_BLOCK_US = 1000


def build(stage: Stage) -> Path:
    src, out = stage.work / "pingpong.c", stage.work / "pingpong"
    src.write_text(PINGPONG_C)
    sh([shutil.which("gcc") or "gcc", "-O2", "-pthread", "-o", str(out), str(src)])
    out.chmod(0o755)
    return out


def untraced(stage: Stage, prog: Path, n: int) -> float:
    p = stage.as_bench_user([str(prog), str(n)], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=600)
    return workload_timing(out)["elapsed"]


def _bpf_ns(stats: dict[int, tuple[int, int]]) -> int:
    """The run time of every program a tool loaded for the run (each one runs
    at every context switch on the machine, the tool's filters inside)."""
    return sum(ns for _, ns in stats.values())


def under_gfxclient(stage: Stage, prog: Path, n: int) -> tuple[float, dict[str, Any], int]:
    out_file = str(user_dir(stage) / "offcpu.folded")
    args = ["--json", "profile", "--off-cpu", "--min-block", str(MIN_BLOCK_US / 1000)]
    with new_prog_stats(stage.broker_pid) as stats:
        args += ["--format", "folded", "-o", out_file, "--", str(prog), str(n)]
        elapsed, summary = profile_run(stage, args)
    return elapsed, summary, _bpf_ns(stats)


def perf_off_cpu_support() -> str | None:
    """None when this perf records --off-cpu; else why not, in its words."""
    r = subprocess.run(
        ["perf", "record", "--off-cpu", "-o", "/dev/null", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "off-cpu" in r.stderr and "ignored" in r.stderr:  # Debian 12's perf 6.1
        return r.stderr.strip().split("[ perf record", 1)[0].strip()
    return None if r.returncode == 0 else r.stderr.strip()[-300:]


def under_perf(stage: Stage, prog: Path, n: int) -> float:
    argv = ["perf", "record", "-q", "--off-cpu", "-o", str(stage.work / "offcpu.perf.data")]
    r = subprocess.run(
        [*argv, "--", *stage.setpriv([str(prog), str(n)])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise BenchError(f"perf record --off-cpu failed: {r.stderr[-1000:]}")
    return workload_timing(r.stdout)["elapsed"]


def under_offcputime(stage: Stage, prog: Path, n: int, tool: str) -> tuple[float, int]:
    """offcputime -p on the workload, started stopped (SIGSTOP) so that it is traced
    from its first round, as gfxclient's -- COMMAND is."""
    w = stage.as_bench_user(
        ["sh", "-c", f'kill -STOP $$; exec "{prog}" {n}'], stdout=subprocess.PIPE
    )
    trace = subprocess.Popen(
        [tool, "-p", str(w.pid), "-m", str(MIN_BLOCK_US), "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with new_prog_stats(trace.pid, since={}) as stats:
            time.sleep(2.0)  # no "attached" line to wait for: a libbpf tool attaches in ~1 s
            if trace.poll() is not None:
                raise BenchError(
                    f"offcputime exited: {trace.stderr.read()[-1000:] if trace.stderr else ''}"
                )
            w.send_signal(signal.SIGCONT)
            out, _ = w.communicate(timeout=600)
        return workload_timing(out)["elapsed"], _bpf_ns(stats)
    finally:
        stop_tool(trace, timeout=60)
        if w.poll() is None:
            w.kill()
            w.wait()


def _calibrate(stage: Stage, prog: Path, seconds: float) -> int:
    probe = 20_000
    one = untraced(stage, prog, probe)
    return max(probe, round(probe * seconds / max(one, 1e-6)))


def run(stage: Stage, rounds: int, seconds: float) -> dict[str, Any]:
    prog = build(stage)
    n = _calibrate(stage, prog, seconds)
    log(f"offcpu: ping-pong of {n} round trips (~{seconds} s untraced)")
    out: dict[str, Any] = {"workload": f"2 threads, {n} pipe round trips", "round_trips": n}
    out["min_block_us"] = MIN_BLOCK_US
    tool = shutil.which("offcputime") or "/usr/sbin/offcputime"
    if not Path(tool).exists():
        out["offcputime_unsupported"] = "offcputime is not installed (apt-get install libbpf-tools)"
    out["perf_unsupported"] = perf_off_cpu_support()
    # Rounds interleave the tools (untraced, gfxclient, perf, offcputime, then
    # again): this VM's speed drifts over a minute, and blocks of one tool's
    # rounds would carry the drift into the ratios.
    times: dict[str, list[float]] = {"untraced": [], "gfxbpf": [], "perf": [], "offcputime": []}
    bpf: dict[str, list[int]] = {"gfxbpf": [], "offcputime": []}  # BPF ns per run
    with bpf_stats_enabled():
        for _ in range(rounds):
            times["untraced"].append(untraced(stage, prog, n))
            t, summary, ns = under_gfxclient(stage, prog, n)
            times["gfxbpf"].append(t)
            bpf["gfxbpf"].append(ns)
            out["gfxbpf_waits_ns"] = summary["total"]
            if out["perf_unsupported"] is None:
                times["perf"].append(under_perf(stage, prog, n))
            if "offcputime_unsupported" not in out:
                t, ns = under_offcputime(stage, prog, n, tool)
                times["offcputime"].append(t)
                bpf["offcputime"].append(ns)
    out["rounds_s"] = {k: [round(t, 4) for t in v] for k, v in times.items() if v}
    # The programs' own time per round trip (about four switches): the kernel's
    # clock of each run, steadier than the workload's time on a shared VM.
    for name, runs in bpf.items():
        if runs:
            out[f"{name}_bpf_ns_per_round_trip"] = round(median(runs) / n, 1)
    base = median(times["untraced"])
    out["untraced_s"] = round(base, 4)
    for name in ("gfxbpf", "perf", "offcputime"):
        if times[name]:
            t = median(times[name])
            out[f"{name}_s"], out[f"{name}_slowdown"] = round(t, 4), ratio(t, base)
    out["switches_per_s_untraced"] = round(4 * n / base)
    return out
