"""15. Memory profiles: the slowdown of an allocation-heavy program (Python
building a large dict with PYTHONMALLOC=malloc: every key and value a malloc) under
`gfxclient profile --memory`, exact and sampled (--sample-bytes), against
bcc's memleak where it runs (root), else the same bookkeeping in bpftrace
uprobes (malloc size at entry, address at return, free), in one run.

gfxclient runs the workload as `-- COMMAND` (its tree, filtered in the
kernel); bpftrace follows its pid, started stopped and continued once the
probes are attached. The workload times its own CPU time, so start-up,
attach and the reading of the results are outside its figure.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.harness import BenchError, Stage, log, stop_tool, workload_timing
from bench.profile_bench import profile_run, user_dir
from bench.stats import median, ratio

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
SAMPLE_BYTES = 512 * 1024  # tcmalloc's default interval
# Its own CPU time (user and system: a probe's trap and program are charged to
# the thread that called), which a shared machine's load does not stretch as
# it stretches wall-clock time; the wall-clock time beside it.
DICT_PY = """\
import json, sys, time
n = int(sys.argv[1])
c0, t0 = time.process_time(), time.monotonic()
d = {}
for i in range(n):
    d[str(i)] = [i]
c1, t1 = time.process_time(), time.monotonic()
print(json.dumps({"elapsed": c1 - c0, "wall": t1 - t0, "entries": len(d)}), flush=True)
"""
# Every Python object from libc's malloc (not CPython's own arenas): each entry
# is then three or more malloc calls, the allocation-heavy case.
PYTHON = ["env", "PYTHONMALLOC=malloc", "python3"]
# memleak's bookkeeping, for the process $1: size at entry, address at return, frees.
BPFTRACE = f"""
uprobe:{LIBC}:malloc /pid == $1/ {{ @size[tid] = arg0; }}
uretprobe:{LIBC}:malloc /pid == $1 && @size[tid]/ {{
  @addr[retval] = @size[tid]; @bytes[ustack(perf, 16)] = sum(@size[tid]); delete(@size[tid]);
}}
uprobe:{LIBC}:free /pid == $1/ {{ delete(@addr[arg0]); }}
"""


def build(stage: Stage) -> Path:
    path = stage.work / "dict_build.py"
    path.write_text(DICT_PY)
    path.chmod(0o644)
    return path


def untraced(stage: Stage, prog: Path, n: int) -> float:
    p = stage.as_bench_user([*PYTHON, str(prog), str(n)], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=600)
    return workload_timing(out)["elapsed"]


def under_gfxclient(stage: Stage, prog: Path, n: int, sample: int) -> tuple[float, dict[str, Any]]:
    args = ["--json", "profile", "--memory"] + (["--sample-bytes", str(sample)] if sample else [])
    out_file = str(user_dir(stage) / f"memory-{sample}.folded")
    args += ["--format", "folded", "-o", out_file, "--", *PYTHON, str(prog), str(n)]
    return profile_run(stage, args)


def under_peer(stage: Stage, prog: Path, n: int) -> tuple[float, str]:
    """(the workload's time, which tool) under memleak (bcc) or bpftrace, by root."""
    w = stage.as_bench_user(
        ["sh", "-c", f'kill -STOP $$; exec {" ".join(PYTHON)} "{prog}" {n}'],
        stdout=subprocess.PIPE,
    )
    memleak = shutil.which("memleak-bpfcc")
    tool = "memleak" if memleak else "bpftrace"
    argv = [memleak, "-p", str(w.pid)] if memleak else ["bpftrace", "-e", BPFTRACE, str(w.pid)]
    trace = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0 if memleak else 0.0)
        if not memleak:  # bpftrace says when it has attached
            assert trace.stdout is not None
            line = trace.stdout.readline()
            if "Attaching" not in line:
                raise BenchError(f"bpftrace did not attach: {line!r}")
        if trace.poll() is not None:
            raise BenchError(
                f"{tool} exited: {trace.stderr.read()[-1000:] if trace.stderr else ''}"
            )
        w.send_signal(signal.SIGCONT)
        out, _ = w.communicate(timeout=600)
        return workload_timing(out)["elapsed"], tool
    finally:
        stop_tool(trace)
        if w.poll() is None:
            w.kill()
            w.wait()


def run(stage: Stage, rounds: int, entries: int) -> dict[str, Any]:
    prog = build(stage)
    log(f"memory: a dict of {entries} str -> list entries, {rounds} rounds")
    out: dict[str, Any] = {"workload": f"python3 building a dict of {entries} entries"}
    out["sample_bytes"] = SAMPLE_BYTES
    # Rounds interleave the tools: this VM's speed drifts over a minute.
    times: dict[str, list[float]] = {"untraced": [], "gfxbpf": [], "gfxbpf_sampled": [], "peer": []}
    for _ in range(rounds):
        times["untraced"].append(untraced(stage, prog, entries))
        t, summary = under_gfxclient(stage, prog, entries, 0)
        times["gfxbpf"].append(t)
        out["gfxbpf_bytes"] = summary["total"]
        t, summary = under_gfxclient(stage, prog, entries, SAMPLE_BYTES)
        times["gfxbpf_sampled"].append(t)
        out["gfxbpf_sampled_bytes"] = summary["total"]
        t, out["peer"] = under_peer(stage, prog, entries)
        times["peer"].append(t)
    out["rounds_s"] = {k: [round(t, 4) for t in v] for k, v in times.items()}
    base = median(times["untraced"])
    out["untraced_s"] = round(base, 4)
    for name in ("gfxbpf", "gfxbpf_sampled", "peer"):
        t = median(times[name])
        out[f"{name}_s"], out[f"{name}_slowdown"] = round(t, 4), ratio(t, base)
    return out
