"""7. Profiles: a CPU-bound workload's slowdown under `gfxclient profile` at 99
and 999 Hz, against `perf record -g -F` and bpftrace's `profile:hz:` one-liner;
and the time from the end of sampling to a written flame graph.

The workload is generated here: 100 functions a_i each calling 100 functions
b_j through a table, so main;a_i;b_j are 10,000 distinct stacks, every one
spinning the same number of iterations per round (built with frame pointers, -O0).
It times itself, so start-up and attach are outside its figure.
gfxclient runs it as `-- COMMAND` (as the bench user); perf record runs it
through setpriv as the bench user; bpftrace samples system-wide, filtered by
the bench user's uid, as the one-liner would be written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.harness import BENCH_USER, BenchError, Bpftrace, Stage, log, sh, workload_timing
from bench.stats import median, ratio

FANOUT = 100  # a_i x b_j: FANOUT**2 distinct stacks


def _source() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <time.h>",
        "volatile unsigned long sink;",
        "static unsigned long spin;",
        "typedef void (*fn)(void);",
    ]
    for j in range(FANOUT):
        lines.append(
            f"__attribute__((noinline)) void b{j}(void) "
            "{ for (unsigned long k = 0; k < spin; k++) sink += k; }"
        )
    lines.append("static fn bs[] = {" + ", ".join(f"b{j}" for j in range(FANOUT)) + "};")
    for i in range(FANOUT):
        lines.append(
            f'__attribute__((noinline)) void a{i}(int j) {{ bs[j](); __asm__ volatile(""); }}'
        )
    lines.append("static void (*as[])(int) = {" + ", ".join(f"a{i}" for i in range(FANOUT)) + "};")
    lines.append(
        f"""
static double now(void)
{{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }}
int main(int argc, char **argv)
{{
    long rounds = atol(argv[1]);
    double t0;
    spin = strtoul(argv[2], 0, 10);
    t0 = now();
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < {FANOUT}; i++)
            for (int j = 0; j < {FANOUT}; j++)
                as[i](j);
    printf("{{\\"elapsed\\": %.6f}}\\n", now() - t0);
    return 0;
}}
"""
    )
    return "\n".join(lines) + "\n"


def build(stage: Stage) -> Path:
    src = stage.work / "paths.c"
    out = stage.work / "paths"
    src.write_text(_source())
    gcc = shutil.which("gcc") or "gcc"
    # -O0: gcc omits the frame of a leaf that needs no stack even with
    # -fno-omit-frame-pointer at -O1, and b_j's caller would vanish from its stacks.
    sh([gcc, "-O0", "-g", "-fno-omit-frame-pointer", "-o", str(out), str(src)])
    out.chmod(0o755)
    return out


def untraced(stage: Stage, prog: Path, rounds: int, spin: int) -> float:
    p = stage.as_bench_user([str(prog), str(rounds), str(spin)], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=900)
    return workload_timing(out)["elapsed"]


def user_dir(stage: Stage) -> Path:
    """A directory the bench user writes profiles to (the work directory is root's;
    its symbol cache is in the HOME the stage gives it)."""
    d = stage.work / "profiles"
    d.mkdir(exist_ok=True)
    os.chown(d, stage.bench_uid, stage.bench_gid)
    return d


def under_gfxclient(
    stage: Stage, prog: Path, rounds: int, spin: int, hz: int, fmt: str = "folded"
) -> tuple[float, dict[str, Any]]:
    """(workload seconds, gfxclient's JSON summary)."""
    output = str(user_dir(stage) / f"profile-{hz}.{fmt}")
    # --scope system: frame-pointer stacks (program profile), as perf -g; without
    # it the bench user's stackcopy grant (python_profile.py) would be used.
    args = ["--json", "profile", "--scope", "system", "--frequency", str(hz)]
    args += ["--format", fmt, "-o", output]
    return profile_run(stage, [*args, "--", str(prog), str(rounds), str(spin)], timeout=900)


def profile_run(
    stage: Stage, args: list[str], timeout: float = 600
) -> tuple[float, dict[str, Any]]:
    """gfxclient ARGS (a --json profile of a bench workload) as the bench user:
    (the workload's own seconds, gfxclient's JSON summary)."""
    p = stage.gfxclient(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise BenchError(f"gfxclient {' '.join(args[1:3])} failed ({p.returncode}): "
                         f"{err.strip()[-1000:]}")  # fmt: skip
    summary = json.loads(out[out.index("\n{") + 1 :] if not out.startswith("{\n") else out)
    return workload_timing(out)["elapsed"], summary


def under_perf(stage: Stage, prog: Path, rounds: int, spin: int, hz: int, data: Path) -> float:
    argv = ["perf", "record", "-q", "-g", "-F", str(hz), "-o", str(data), "--"]
    r = subprocess.run(
        argv + stage.setpriv([str(prog), str(rounds), str(spin)]),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise BenchError(f"perf record failed: {r.stderr[-1000:]}")
    return workload_timing(r.stdout)["elapsed"]


def under_bpftrace(stage: Stage, prog: Path, rounds: int, spin: int, hz: int) -> float:
    script = f"profile:hz:{hz} /uid == {stage.bench_uid}/ {{ @[ustack] = count(); }}"
    bt = Bpftrace(script, stage.work / f"profile-{hz}.bt.out")
    try:
        bt.wait_attached()
        return untraced(stage, prog, rounds, spin)
    finally:
        bt.stop()


def perf_fold(data: Path, out: Path) -> tuple[float, int]:
    """perf script, folded in Python (Debian has no stackcollapse-perf.pl):
    (seconds, distinct stacks)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,ip,sym"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode != 0:
        raise BenchError(f"perf script failed: {p.stderr[-1000:]}")
    stacks: dict[str, int] = {}
    for block in p.stdout.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        comm = lines[0].split()[0]
        frames = [ln.split(None, 1)[1] if " " in ln.strip() else "[unknown]" for ln in lines[1:]]
        key = ";".join([comm, *reversed([f.strip() for f in frames])])
        stacks[key] = stacks.get(key, 0) + 1
    out.write_text("".join(f"{k} {v}\n" for k, v in stacks.items()))
    return time.perf_counter() - t0, len(stacks)


def _calibrate(stage: Stage, prog: Path, seconds: float) -> tuple[int, int]:
    spin = 200
    one = untraced(stage, prog, 1, spin)
    return max(1, round(seconds / max(one, 1e-6))), spin


def run(stage: Stage, rounds: int, seconds: float, fold_hz: int, fold_seconds: float) -> dict:
    prog = build(stage)
    n, spin = _calibrate(stage, prog, seconds)
    log(f"profile: workload {FANOUT**2} paths x {n} rounds (~{seconds} s untraced)")
    out: dict[str, Any] = {"workload": f"{FANOUT**2} distinct stacks x {n} rounds", "hz": {}}
    plain = [untraced(stage, prog, n, spin) for _ in range(rounds)]
    base = median(plain)
    out["untraced_s"] = round(base, 4)
    out["untraced_rounds_s"] = [round(x, 4) for x in plain]
    for hz in (99, 999):
        log(f"profile: {hz} Hz, gfxclient / perf record / bpftrace")
        data = stage.work / f"perf-{hz}.data"
        # Rounds interleave the tools, so that the machine's other load falls on all alike.
        runs: dict[str, list[float]] = {"gfxbpf": [], "perf": [], "bpftrace": []}
        for _ in range(rounds):
            runs["gfxbpf"].append(under_gfxclient(stage, prog, n, spin, hz)[0])
            runs["perf"].append(under_perf(stage, prog, n, spin, hz, data))
            runs["bpftrace"].append(under_bpftrace(stage, prog, n, spin, hz))
        cell: dict[str, Any] = {f"{t}_s": round(median(v), 4) for t, v in runs.items()}
        cell |= {f"{t}_slowdown": ratio(median(v), base) for t, v in runs.items()}
        cell["rounds_s"] = {t: [round(x, 4) for x in v] for t, v in runs.items()}
        out["hz"][str(hz)] = cell
    out["flamegraph"] = _flamegraph(stage, prog, spin, fold_hz, fold_seconds, base / n)
    return out


def _flamegraph(
    stage: Stage, prog: Path, spin: int, hz: int, seconds: float, per_round: float
) -> dict[str, Any]:
    """End of sampling -> folded file, for as many of the 10,000 stacks as each tool saw."""
    n = max(1, round(seconds / max(per_round, 1e-6)))
    log(f"profile: flame graph of {FANOUT**2} paths at {hz} Hz")
    _, summary = under_gfxclient(stage, prog, n, spin, hz)
    _, svg_summary = under_gfxclient(stage, prog, n, spin, hz, "svg")
    data = stage.work / "perf-fold.data"
    under_perf(stage, prog, n, spin, hz, data)
    perf_s, perf_stacks = perf_fold(data, stage.work / "perf.folded")
    return {
        "hz": hz,
        "gfxbpf_folded_s": summary["output_s"],
        "gfxbpf_svg_s": svg_summary["output_s"],
        "gfxbpf_read_s": summary["read_s"],
        "gfxbpf_stacks": summary["stacks"],
        "gfxbpf_lost": summary["lost"],
        "gfxbpf_samples": summary["total"],
        "perf_fold_s": round(perf_s, 4),
        "perf_stacks": perf_stacks,
        "ratio_vs_perf": ratio(summary["output_s"], perf_s),
        "user": BENCH_USER,
    }
