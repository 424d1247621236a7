"""12. Python profiles: `gfxclient profile` (Python frames walked in the kernel)
against py-spy (reads the process from outside, as root) on one CPython script.

The workload is Debian's python3 running outer -> middle -> inner, a CPU loop,
a fixed number of rounds; it times itself and prints the monotonic time it
ended, so the time from the end of sampling to a written flame graph is
measured the same way for both tools (the tool's exit minus the workload's
end). Rows: the share of samples that hold the whole Python chain
outer;middle;inner in order, of all samples and of those taken while the
script ran (a frame of loop.py on the stack: gfxclient samples the process
from exec, so its interpreter's start-up and shutdown, which py-spy does not
see, count among all samples), the workload's slowdown at 99 Hz (py-spy's
default blocking mode, and --nonblocking), and the time to a flame graph.
gfxclient runs the script as `-- COMMAND` as the bench user; py-spy runs it
through setpriv as the bench user, as root (it needs ptrace rights).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.harness import BenchError, Stage, log, workload_timing
from bench.stats import median, ratio

PYTHON = "/usr/bin/python3"
CHAIN = ("outer", "middle", "inner")
HZ = 99
SCRIPT = """\
import json, sys, time

def inner(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def middle(n):
    return inner(n)

def outer(n):
    return middle(n)

t0 = time.monotonic()
for _ in range(int(sys.argv[1])):
    outer(20000)
end = time.monotonic()
print(json.dumps({"elapsed": end - t0, "end": end}), flush=True)
"""


def frame_name(frame: str) -> str:
    """`inner (loop.py:5)` -> `inner`: the function, without file and line."""
    return frame.split(" (", 1)[0].strip()


def parse_folded(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """Folded stacks (`a;b;c COUNT`, root first) as (frames, count) pairs."""
    out: list[tuple[list[str], int]] = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            out.append((stack.split(";"), int(count)))
    return out


def is_python(frame: str) -> bool:
    """`inner (loop.py:5)`: a Python frame (native ones have no ` (file:line)`)."""
    return frame.endswith(")") and " (" in frame and ":" in frame.rsplit(" (", 1)[1]


def holds_chain(frames: list[str], chain: tuple[str, ...] = CHAIN) -> bool:
    """Whether the stack's Python frames hold the chain's functions next to
    each other, in order (before 3.11 a C frame of the evaluation loop sits
    between each two Python calls: `outer;_PyEval_Vector;middle`)."""
    names = [frame_name(f) for f in frames if is_python(f)]
    n = len(chain)
    return any(tuple(names[i : i + n]) == chain for i in range(len(names) - n + 1))


def chain_share(stacks: list[tuple[list[str], int]], chain: tuple[str, ...] = CHAIN) -> float:
    """Share of samples whose stack holds the whole chain (0.0 with no sample)."""
    total = sum(c for _, c in stacks)
    full = sum(c for frames, c in stacks if holds_chain(frames, chain))
    return full / total if total else 0.0


def in_script(frames: list[str], script: str = "loop.py") -> bool:
    """Whether a frame of the script is on the stack (py-spy names the file
    by its base name, gfxclient by its path)."""
    return any(f"{script}:" in f for f in frames)


def script_share(stacks: list[tuple[list[str], int]], chain: tuple[str, ...] = CHAIN) -> float:
    """chain_share of the samples taken while the script ran (in_script)."""
    return chain_share([(f, c) for f, c in stacks if in_script(f)], chain)


def untraced(stage: Stage, script: Path, rounds: int) -> float:
    p = stage.as_bench_user([PYTHON, str(script), str(rounds)], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=900)
    return workload_timing(out)["elapsed"]


def under_gfxclient(stage: Stage, script: Path, rounds: int, out: Path) -> dict[str, Any]:
    """The workload's timing, the tool's exit time, and gfxclient's JSON summary."""
    args = ["--json", "profile", "--frequency", str(HZ), "--format", "folded", "-o", str(out)]
    p = stage.gfxclient(
        *args, "--", PYTHON, str(script), str(rounds), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    text, err = p.communicate(timeout=900)
    done = time.monotonic()
    if p.returncode != 0:
        raise BenchError(f"gfxclient profile failed ({p.returncode}): {err.strip()[-1000:]}")
    res = workload_timing(text)
    summary = json.loads(text[text.index("\n{") + 1 :])
    return {**res, "exit": done, "summary": summary}


def under_pyspy(
    stage: Stage, pyspy: str, script: Path, rounds: int, out: Path, blocking: bool
) -> dict[str, Any]:
    argv = [pyspy, "record", "-r", str(HZ), "-f", "raw", "-o", str(out)]
    argv += [] if blocking else ["--nonblocking"]
    argv += ["--", *stage.setpriv([PYTHON, str(script), str(rounds)])]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    done = time.monotonic()
    if r.returncode != 0:
        raise BenchError(f"py-spy record failed ({r.returncode}): {r.stderr[-1000:]}")
    return {**workload_timing(r.stdout), "exit": done}


def find_pyspy(stage: Stage) -> str:
    """py-spy from the bench venv (installed from PyPI on first use), else PATH."""
    local = stage.venv / "bin/py-spy"
    if not local.exists():
        subprocess.run([str(stage.venv / "bin/pip"), "install", "-q", "py-spy"], check=False)
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise BenchError("py-spy is not installed and `pip install py-spy` failed")
    return found


def _prepare(stage: Stage, seconds: float) -> tuple[Path, int, Path]:
    work = stage.work / "python"
    work.mkdir(exist_ok=True)
    os.chown(work, stage.bench_uid, stage.bench_gid)
    script = work / "loop.py"
    script.write_text(SCRIPT)
    script.chmod(0o644)
    one = untraced(stage, script, 10) / 10
    return script, max(10, round(seconds / max(one, 1e-6))), work


def _share(path: Path, share: Callable[..., float] = chain_share) -> float:
    return round(share(parse_folded(path.read_text().splitlines())), 4)


def _outside(path: Path) -> int:
    return sum(c for f, c in parse_folded(path.read_text().splitlines()) if not in_script(f))


def _cut(path: Path) -> tuple[int, int, str]:
    mine = [(f, c) for f, c in parse_folded(path.read_text().splitlines()) if in_script(f)]
    cut = sorted(((c, f) for f, c in mine if not holds_chain(f)), reverse=True)
    top = ";".join(frame_name(f) for f in cut[0][1][-3:]) if cut else ""
    return sum(c for c, _ in cut), sum(c for _, c in mine), top


def run(stage: Stage, rounds: int, seconds: float) -> dict[str, Any]:
    pyspy = find_pyspy(stage)
    script, n, work = _prepare(stage, seconds)
    log(f"python: outer/middle/inner x {n} rounds (~{seconds} s untraced), {HZ} Hz")
    base = median([untraced(stage, script, n) for _ in range(rounds)])
    gfx, spy, spy_nb = [], [], []
    for i in range(rounds):
        gfx.append(under_gfxclient(stage, script, n, work / f"gfx-{i}.folded"))
        spy.append(under_pyspy(stage, pyspy, script, n, work / f"spy-{i}.txt", True))
        spy_nb.append(under_pyspy(stage, pyspy, script, n, work / f"spynb-{i}.txt", False))
    return {
        "python": PYTHON,
        "hz": HZ,
        "untraced_s": round(base, 4),
        "gfxbpf_chain_share": median([_share(work / f"gfx-{i}.folded") for i in range(rounds)]),
        "pyspy_chain_share": median([_share(work / f"spy-{i}.txt") for i in range(rounds)]),
        "pyspy_nonblocking_chain_share": median(
            [_share(work / f"spynb-{i}.txt") for i in range(rounds)]
        ),
        "gfxbpf_script_share": median(
            [_share(work / f"gfx-{i}.folded", script_share) for i in range(rounds)]
        ),
        "pyspy_script_share": median(
            [_share(work / f"spy-{i}.txt", script_share) for i in range(rounds)]
        ),
        "gfxbpf_slowdown": ratio(median([r["elapsed"] for r in gfx]), base),
        "pyspy_slowdown": ratio(median([r["elapsed"] for r in spy]), base),
        "pyspy_nonblocking_slowdown": ratio(median([r["elapsed"] for r in spy_nb]), base),
        "gfxbpf_to_flamegraph_s": round(median([r["exit"] - r["end"] for r in gfx]), 3),
        "pyspy_to_flamegraph_s": round(median([r["exit"] - r["end"] for r in spy]), 3),
        "gfxbpf_samples": median([r["summary"].get("total", 0) for r in gfx]),
        # Samples with no frame of the script (the interpreter's start-up and
        # shutdown, which gfxclient samples from exec), per round.
        "gfxbpf_outside_script": [_outside(work / f"gfx-{i}.folded") for i in range(rounds)],
        # Samples in the script without the whole chain, per round: (count, of samples
        # in the script, the innermost frames of the commonest such stack).
        "gfxbpf_cut_in_script": [_cut(work / f"gfx-{i}.folded") for i in range(rounds)],
        "pyspy_cut_in_script": [_cut(work / f"spy-{i}.txt") for i in range(rounds)],
        "interpreters": gfx[-1]["summary"].get("interpreters"),
    }
