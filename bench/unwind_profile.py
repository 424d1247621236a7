"""11. Complete stacks (issue #22): `gfxclient profile` (program stackcopy, the
client's CFI unwinder) against `perf record --call-graph dwarf` and
`perf record -g` on the same three workloads, built or shipped the way
distributions do: a C call chain at -O2 without frame pointers, Debian's
stripped xz -9, and Debian's python3 running a loop.

Per workload and tool: completeness (the share of the workload's samples
whose stack reaches main: `main`, `__libc_start_main*`, `Py_BytesMain`), and
the workload's wall time at 99 and 999 Hz against an untraced run. Then, at
999 Hz: the time from the end of sampling to a written flame graph (gfxclient
-o x.svg, its own output_s) against `perf script` of the dwarf data plus a
fold of its output (collapse_perf_script below); the BPF run time per sample
(kernel.bpf_stats_enabled=1, the broker's program fds' run_time_ns / run_cnt);
and the kernel memory of stackcopy's maps (bpftool's bytes_memlock). Last, the
parse time and table size of the largest .eh_frame on the machine, first and
from the disk cache (bench/unwind_tables.py).

Every workload runs as the bench user under a `timeit` launcher built here,
which times exec to exit (the tools' own start-up and write-out are outside
it), reports the workload's CPU time, and sends its output to /dev/null. The
profiler's own CPU time (gfxclient reads and unwinds while sampling; perf
record writes the samples) is what the bench's children used beyond the
workload's. On a machine with few CPUs and other load, the client's CPU
competes with the workload's, which the wall time shows and the workload's
CPU time does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import (
    BENCH_USER,
    BenchError,
    Stage,
    bpf_stats_enabled,
    log,
    new_prog_stats,
    sh,
)
from bench.stats import median, ratio
from bench.unwind_tables import largest_eh_frame, table_costs

HZ = (99, 999)
TOOLS = ("gfxclient", "perf_dwarf", "perf_fp")

TIMEIT_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
int main(int argc, char **argv)
{
    struct timespec a, b;
    int st = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t p = fork();
    if (p == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execv(argv[1], argv + 1);
        _exit(127);
    }
    waitpid(p, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double wall = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec
                 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    fprintf(stderr, "UNWIND_ELAPSED %.6f %.6f\n", wall, cpu);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
"""

CHAIN_C = r"""
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) unsigned long chain_leaf(unsigned long n)
{ for (unsigned long i = 0; i < n; i++) sink += i * i; return sink; }
__attribute__((noinline)) unsigned long chain_d(unsigned long n) { return chain_leaf(n) + 1; }
__attribute__((noinline)) unsigned long chain_c(unsigned long n) { return chain_d(n) + 2; }
__attribute__((noinline)) unsigned long chain_b(unsigned long n) { return chain_c(n) + 3; }
__attribute__((noinline)) unsigned long chain_a(unsigned long n) { return chain_b(n) + 4; }
int main(int argc, char **argv)
{
    unsigned long rounds = strtoul(argv[1], 0, 10), t = 0;
    for (unsigned long r = 0; r < rounds; r++) t += chain_a(1000000);
    return (int)(t & 1);
}
"""

PY_LOOP = (
    "import sys\n"
    "def inner(n):\n"
    "    s = 0\n"
    "    for i in range(n):\n"
    "        s += i * i\n"
    "    return s\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    inner(20000)\n"
)


@dataclass(frozen=True)
class Workload:
    name: str  # the row's label
    comm: str  # the process name its samples carry
    argv: Callable[[int], list[str]]  # size -> command line
    reached: Callable[[list[str]], bool]  # frames (root first) -> reaches main


# --------------------------------------------------------------- pure parts


def collapse_perf_script(text: str) -> dict[tuple[str, ...], int]:
    """Stacks of `perf script -F comm,ip,sym` output, root first with the comm
    as the root frame (as gfxclient's folded output), and their counts."""
    stacks: dict[tuple[str, ...], int] = {}
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        comm = lines[0].strip()
        frames = [_perf_frame(ln) for ln in lines[1:]]
        key = (comm, *reversed(frames))
        stacks[key] = stacks.get(key, 0) + 1
    return stacks


def _perf_frame(line: str) -> str:
    """'    7f3a1c2b main' -> 'main'; an address alone -> '[unknown]'."""
    parts = line.split(None, 1)
    return parts[1].strip() if len(parts) == 2 else "[unknown]"


def parse_folded(text: str) -> dict[tuple[str, ...], int]:
    """gfxclient's folded file: `root;...;leaf COUNT` per line."""
    out: dict[tuple[str, ...], int] = {}
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            key = tuple(stack.split(";"))
            out[key] = out.get(key, 0) + int(n)
    return out


def completeness(
    stacks: dict[tuple[str, ...], int], comm: str, reached: Callable[[list[str]], bool]
) -> tuple[float | None, int]:
    """(share of comm's samples whose frames reach main, comm's samples)."""
    mine = {s: n for s, n in stacks.items() if s and s[0] == comm}
    total = sum(mine.values())
    if not total:
        return None, 0
    return round(sum(n for s, n in mine.items() if reached(list(s))) / total, 3), total


def elapsed_of(stderr: str) -> tuple[float, float]:
    """The timeit launcher's figures from a tool's stderr: the workload's wall
    and CPU (user + system) seconds."""
    for line in stderr.splitlines():
        if line.startswith("UNWIND_ELAPSED "):
            _, wall, cpu = line.split()
            return float(wall), float(cpu)
    raise BenchError(f"no timing from the workload: {stderr.strip()[-800:]!r}")


def busiest_new(ran: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(run_cnt, run_time_ns) of the program that ran most while the profile ran
    (new_prog_stats): its sampling program (its fork hook runs once per fork)."""
    if not ran:
        raise BenchError("no program of the profile was seen running at the broker")
    return max(ran.values())


def bpf_cost(runs: tuple[int, int], recorded: int) -> dict[str, float | None]:
    """ns per run of the program (every CPU's samples, most filtered out at once) and
    per sample it recorded (all its time charged to those: an upper bound)."""
    cnt, ns = runs
    return {
        "runs": cnt,
        "ns_per_run": round(ns / cnt, 1) if cnt else None,
        "ns_per_recorded_sample": round(ns / recorded, 1) if recorded else None,
    }


def starts(*prefixes: str) -> Callable[[list[str]], bool]:
    return lambda frames: any(f.startswith(prefixes) for f in frames)


def holds(name: str) -> Callable[[list[str]], bool]:
    return lambda frames: name in frames


# --------------------------------------------------------------- measuring


def _build(stage: Stage) -> Path:
    """The launcher, the chain program and the loop in a directory the bench user reads."""
    work = stage.work / "unwind"
    work.mkdir(exist_ok=True)
    work.chmod(0o755)
    gcc = shutil.which("gcc") or "gcc"
    for name, src, flags in (
        ("timeit", TIMEIT_C, ["-O2"]),
        ("chain", CHAIN_C, ["-O2", "-fomit-frame-pointer"]),  # as distributions build
    ):
        (work / f"{name}.c").write_text(src)
        sh([gcc, *flags, "-o", str(work / name), str(work / f"{name}.c")])
        (work / name).chmod(0o755)
    (work / "loop.py").write_text(PY_LOOP)
    (work / "loop.py").chmod(0o644)
    out = work / "profiles"
    out.mkdir(exist_ok=True)
    os.chown(out, stage.bench_uid, stage.bench_gid)
    return work


def _random_file(work: Path, mib: int) -> str:
    path = work / f"random-{mib}.bin"
    if not path.exists():
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        path.chmod(0o644)
    return str(path)


def workloads(work: Path) -> list[Workload]:
    return [
        Workload("C chain -O2", "chain", lambda n: [str(work / "chain"), str(n)], holds("main")),
        Workload(
            "Debian xz -9",
            "xz",
            lambda mib: ["/usr/bin/xz", "-9", "-T1", "-c", _random_file(work, mib)],
            # perf names the frame under main __libc_start_call_main, and
            # sometimes not the __libc_start_main_impl it is inlined in.
            starts("__libc_start_main", "__libc_start_call_main"),
        ),
        Workload(
            "Debian python3 loop",
            "python3",
            lambda n: ["/usr/bin/python3", str(work / "loop.py"), str(n)],
            holds("Py_BytesMain"),
        ),
    ]


@dataclass(frozen=True)
class Timing:
    wall: float  # the workload's, exec to exit
    cpu: float  # the workload's user + system
    tool_cpu: float  # the profiler's own (its process and helpers, not the workload)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def untraced(stage: Stage, work: Path, argv: list[str]) -> tuple[float, float]:
    p = stage.as_bench_user([str(work / "timeit"), *argv], stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=900)
    if p.returncode != 0:
        raise BenchError(f"{argv[0]} failed ({p.returncode}): {err[-500:]}")
    return elapsed_of(err)


def under_gfxclient(
    stage: Stage, work: Path, argv: list[str], hz: int, out: Path
) -> tuple[Timing, dict[str, Any]]:
    """(the timing, gfxclient's summary); the profile in out (format from its suffix)."""
    args = ["--json", "profile", "--frequency", str(hz), "-o", str(out)]
    before = _children_cpu()
    p = stage.gfxclient(*args, "--", str(work / "timeit"), *argv,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    stdout, err = p.communicate(timeout=900)
    if p.returncode != 0:
        raise BenchError(f"gfxclient profile failed ({p.returncode}): {err.strip()[-1000:]}")
    wall, cpu = elapsed_of(err)
    return Timing(wall, cpu, _children_cpu() - before - cpu), json.loads(stdout)


def under_perf(
    stage: Stage, work: Path, argv: list[str], hz: int, dwarf: bool, data: Path
) -> Timing:
    graph = ["--call-graph", "dwarf"] if dwarf else ["-g"]
    cmd = ["perf", "record", "-q", "-F", str(hz), *graph, "-o", str(data), "--"]
    before = _children_cpu()
    r = subprocess.run(cmd + stage.setpriv([str(work / "timeit"), *argv]),
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    if r.returncode != 0:
        raise BenchError(f"perf record failed: {r.stderr[-1000:]}")
    wall, cpu = elapsed_of(r.stderr)
    return Timing(wall, cpu, _children_cpu() - before - cpu)


def perf_folded(data: Path, out: Path) -> tuple[float, dict[tuple[str, ...], int]]:
    """(seconds of `perf script` + the fold + writing it, the stacks)."""
    t0 = time.perf_counter()
    p = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,ip,sym"],
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    if p.returncode != 0:
        raise BenchError(f"perf script failed: {p.stderr[-1000:]}")
    stacks = collapse_perf_script(p.stdout)
    out.write_text("".join(f"{';'.join(k)} {v}\n" for k, v in stacks.items()))
    return time.perf_counter() - t0, stacks


def _calibrate(stage: Stage, work: Path, wl: Workload, seconds: float) -> int:
    """The size (rounds, MiB, loops) that runs about `seconds` untraced."""
    probe = {"chain": 200, "xz": 2, "python3": 100}[wl.comm]
    t, _ = untraced(stage, work, wl.argv(probe))
    return max(1, round(probe * seconds / max(t, 1e-3)))


@dataclass
class BrokerWatch:
    """The broker's BPF programs while a profile runs: the stats of those the
    profile added, and the kernel memory of their maps."""

    last: dict[int, tuple[int, int]]  # what each program ran (new_prog_stats)
    maps: dict[str, int]  # map name -> bytes_memlock


@contextlib.contextmanager
def watching(stage: Stage) -> Iterator[BrokerWatch]:
    maps: dict[str, int] = {}
    # programs of one object share maps: each new one adds what is not in yet
    with new_prog_stats(stage.broker_pid, on_new=lambda p: maps.update(_maps_of(p))) as last:
        yield BrokerWatch(last, maps)


def _bpftool(*args: str) -> Any:
    r = subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}


def _maps_of(prog_id: int) -> dict[str, int]:
    """{map name: bytes_memlock} of the maps prog_id uses."""
    out: dict[str, int] = {}
    for map_id in _bpftool("prog", "show", "id", str(prog_id)).get("map_ids", []):
        info = _bpftool("map", "show", "id", str(map_id))
        if info:
            out[str(info.get("name", map_id))] = int(info.get("bytes_memlock", 0))
    return out


def _share_row(stacks: dict[tuple[str, ...], int], wl: Workload) -> dict[str, Any]:
    share, n = completeness(stacks, wl.comm, wl.reached)
    return {"complete": share, "samples": n}


def measure(stage: Stage, work: Path, wl: Workload, rounds: int, seconds: float) -> dict[str, Any]:
    """One workload's rows. Each round runs it untraced and under each tool in
    turn, so that the machine's other load falls on all of them alike."""
    size = _calibrate(stage, work, wl, seconds)
    argv = wl.argv(size)
    log(f"unwind: {wl.name} ({' '.join(argv[-2:])}), {rounds} round(s)")
    runs = {hz: _rounds(stage, work, wl, argv, hz, rounds) for hz in HZ}
    plain = [t for hz in HZ for t in runs[hz][0]["untraced"]]
    base, base_cpu = median([t.wall for t in plain]), median([t.cpu for t in plain])
    row: dict[str, Any] = {"argv": argv, "untraced_s": round(base, 4), "hz": {}}
    row["untraced_cpu_s"] = round(base_cpu, 4)
    for hz, (times, cell) in runs.items():
        for tool in TOOLS:
            s, cpu = median([t.wall for t in times[tool]]), median([t.cpu for t in times[tool]])
            cell[tool] |= {"s": round(s, 4), "slowdown": ratio(s, base)}
            cell[tool] |= {"cpu_s": round(cpu, 4), "cpu_slowdown": ratio(cpu, base_cpu)}
            cell[tool]["tool_cpu_s"] = round(median([t.tool_cpu for t in times[tool]]), 3)
        # Every round's, in the order run (untraced, gfxclient, perf dwarf, perf -g):
        # what "Goals missed, and why" weighs a median's difference against.
        cell["rounds"] = {
            tool: {
                "s": [round(t.wall, 4) for t in ts],
                "tool_cpu_s": [round(t.tool_cpu, 3) for t in ts],
            }
            for tool, ts in times.items()
        }
        row["hz"][str(hz)] = cell
    row["flamegraph"] = _flamegraph(stage, work, wl, argv, row["hz"][str(HZ[-1])])
    return row


def _rounds(
    stage: Stage, work: Path, wl: Workload, argv: list[str], hz: int, rounds: int
) -> tuple[dict[str, list[Timing]], dict[str, Any]]:
    """The timings of every round at hz (untraced and per tool), and the cell of
    what the last round's profiles hold."""
    out = work / "profiles"
    times: dict[str, list[Timing]] = {t: [] for t in ("untraced", *TOOLS)}
    for _ in range(rounds):
        wall, cpu = untraced(stage, work, argv)
        times["untraced"].append(Timing(wall, cpu, 0.0))
        with watching(stage) as watch:
            t, summary = under_gfxclient(stage, work, argv, hz, out / f"{wl.comm}-{hz}.folded")
        times["gfxclient"].append(t)
        for tool, dwarf in (("perf_dwarf", True), ("perf_fp", False)):
            data = work / f"{wl.comm}-{hz}-{tool}.data"
            times[tool].append(under_perf(stage, work, argv, hz, dwarf, data))
    cell: dict[str, Any] = {}
    gfx = parse_folded((out / f"{wl.comm}-{hz}.folded").read_text())
    cell["gfxclient"] = _share_row(gfx, wl) | {"output_s": summary["output_s"]}
    for tool in ("perf_dwarf", "perf_fp"):
        stem = work / f"{wl.comm}-{hz}-{tool}"
        fold_s, stacks = perf_folded(stem.with_suffix(".data"), stem.with_suffix(".folded"))
        cell[tool] = _share_row(stacks, wl) | {"script_fold_s": round(fold_s, 3)}
    # The last run's, whose profile was kept:
    cell["bpf"] = bpf_cost(busiest_new(watch.last), summary["total"])
    cell["map_bytes"] = watch.maps
    return times, cell


def _flamegraph(
    stage: Stage, work: Path, wl: Workload, argv: list[str], cell: dict[str, Any]
) -> dict[str, Any]:
    """End of sampling -> written flame graph (svg) at the highest rate, against
    perf script + fold of the dwarf data of the same rate."""
    _, summary = under_gfxclient(stage, work, argv, HZ[-1], work / "profiles" / f"{wl.comm}.svg")
    perf_s = cell["perf_dwarf"]["script_fold_s"]
    return {
        "hz": HZ[-1],
        "gfxclient_svg_s": summary["output_s"],
        "gfxclient_folded_s": cell["gfxclient"]["output_s"],
        "perf_script_fold_s": perf_s,
        "ratio_vs_perf": ratio(summary["output_s"], perf_s),
    }


def largest_library() -> dict[str, Any]:
    found = largest_eh_frame()
    if found is None:
        return {"path": None}
    with tempfile.TemporaryDirectory(prefix="gfxbpf-unwind-bench-") as tmp:
        return table_costs(found[0], tmp)


@contextlib.contextmanager
def copies_granted(stage: Stage) -> Iterator[None]:
    """stackcopy granted to the bench user for the duration (policy reload), so
    that the other measurements keep timing the frame-pointer program `profile`."""
    policy = stage.work / "policy.toml"
    before = policy.read_text()
    admin = str(stage.venv / "bin/gfxbpf-admin")
    grant = sh([admin, "approve", "stackcopy", "--users", BENCH_USER, "--scope", "self"]
               + ["--max-frequency", str(max(HZ))]).stdout  # fmt: skip
    reload_policy(stage, grant + before)
    try:
        yield
    finally:
        reload_policy(stage, before)


def reload_policy(stage: Stage, text: str) -> None:
    (stage.work / "policy.toml").write_text(text)
    done = _reloads(stage)
    os.kill(stage.broker_pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while _reloads(stage) == done:
        if time.monotonic() > deadline:
            raise BenchError("the broker did not reload its policy (broker.log)")
        time.sleep(0.05)


def _reloads(stage: Stage) -> int:
    return sum(1 for e in stage.audit() if e.get("op") == "reload" and e.get("result") == "ok")


def run(stage: Stage, rounds: int, seconds: float) -> dict[str, Any]:
    work = _build(stage)
    out: dict[str, Any] = {"workloads": {}}
    with bpf_stats_enabled(), copies_granted(stage):
        for wl in workloads(work):
            out["workloads"][wl.name] = measure(stage, work, wl, rounds, seconds)
    log("unwind: the largest .eh_frame on the machine, first parse and cached")
    out["largest_library"] = largest_library()
    return out
