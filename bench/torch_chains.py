"""18. PyTorch loop (issue 33): `gfxclient profile` as a new user meets it (the
entries `gfxbpf-admin approve profile` and `approve stackcopy` write with no
options but --users, reloaded for this row; no gfxclient option but its output)
against `perf record --call-graph dwarf`, `py-spy record --native` and
`py-spy record`, all at gfxclient's default 99 Hz, on bench/torch_cnn.py's
loop (a small CNN, a DataLoader with 2 workers; bench/torch_timed.py times
each step). perf and py-spy run as root and start the loop through setpriv as
the bench user.

Samples under the training step: gfxclient and py-spy name Python frames, so a
sample with a `train_step` frame; perf names none, so a sample of the loop's
main thread (tid = the loop's pid) whose CLOCK_MONOTONIC time stamp (perf -k)
falls inside a step as the loop timed it. A whole chain reaches the program's
entry: `Py_BytesMain` or `main` with no `[unwind stopped: ...]` or `[user
stack lost]` marker (gfxclient, perf); py-spy --native hides python3's own
frames (main and Py_BytesMain among them), so a whole chain there is one whose
root frame is libc's (the __libc_start_call_main that calls main). py-spy
without --native has no native frames: no share.

Slowdown: the loop's steps/s (first step's start to last step's end) untraced
over its steps/s under each tool in the same round, median over the rounds;
the runs of a round go in a rotating order so that drift falls on all.
Exit → file: from the loop's last act (its time stamp just before os._exit)
to the tool's exit with its file written. Bytes per
sample: perf.data's size over its samples; py-spy's, the bytes its
process_vm_readv calls returned (bpftrace on the syscall's exit, in one more
untimed run of each) over its samples; gfxclient's, a bound from its record
layout (the ring's 8-byte header, struct ustack_rec's header and the default
copy: a copy is shorter only where the stack ends first) not counted here.
Memory of unwind tables per 100 MB of mapped code (the loop's executable file
mappings): gfxclient's compiled tables (its cache, ~/.cache/gfxbpf/unwind,
emptied before the row's untimed first profile), py-spy --native's peak RSS
over py-spy's (its unwinder's tables and symbols), perf record none (perf
script unwinds later: its peak RSS is given apart).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.harness import BENCH_USER, REPO, BenchError, Bpftrace, Stage, log, sh
from bench.python_profile import find_pyspy, parse_folded
from bench.stats import median, ratio
from bench.unwind_profile import reload_policy
from gfxbpf.catalog.stack_copies import DEFAULT_STACK_BYTES
from gfxbpf.client.profiles.copies import HEADER as UREC_HEADER

HZ = 99  # gfxclient's default frequency (client/profiles/engine/request.py)
TOOLS = ("untraced", "gfxclient", "perf_dwarf", "pyspy_native", "pyspy")
STEP = "train_step"
MARKERS = ("[unwind stopped:", "[user stack lost]")
ENTRY = ("Py_BytesMain", "main")
Stacks = list[tuple[list[str], int]]

# --------------------------------------------------------------- pure parts


def function(frame: str) -> str:
    """`train_step (/x/train.py:57)` -> `train_step`: a frame's function."""
    return re.sub(r" \([^()]*:\d+\)$", "", frame)


def under_step(stacks: Stacks) -> Stacks:
    return [(s, n) for s, n in stacks if any(function(f) == STEP for f in s)]


def whole_native(frames: list[str]) -> bool:
    """gfxclient's and perf's frames reach main or Py_BytesMain, none cut."""
    return any(f in ENTRY for f in frames) and not any(f.startswith(MARKERS) for f in frames)


def whole_pyspy_native(frames: list[str]) -> bool:
    """py-spy --native's root frame is libc's start (it hides main itself)."""
    return bool(frames) and frames[0].endswith("(libc.so.6)")


def cut_by(stacks: Stacks, pred: Callable[[list[str]], bool]) -> dict[str, int]:
    """Samples whose chain is not whole, by where it ends: the unwind-stopped
    marker, else the outermost frame named (all rounds together)."""
    out: dict[str, int] = {}
    for frames, n in stacks:
        if pred(frames):
            continue
        marks = [f for f in frames if f.startswith(MARKERS)]
        key = marks[0] if marks else f"ends at {next((f for f in frames if f != '[unknown]'), '?')}"
        out[key] = out.get(key, 0) + n
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:5])


def share(stacks: Stacks, pred: Callable[[list[str]], bool]) -> float | None:
    total = sum(n for _, n in stacks)
    return round(sum(n for s, n in stacks if pred(s)) / total, 4) if total else None


PERF_HEADER = re.compile(r"^\s*\S.*?\s(\d+)/(\d+)\s+(\d+\.\d+):")


def perf_samples(text: str) -> Iterator[tuple[int, int, float, list[str]]]:
    """(pid, tid, time, frames root first) of `perf script -F comm,pid,tid,time,ip,sym`."""
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        m = PERF_HEADER.match(lines[0]) if lines else None
        if m is None:
            continue
        frames = [_perf_symbol(ln) for ln in lines[1:]]
        yield int(m[1]), int(m[2]), float(m[3]), frames[::-1]


def _perf_symbol(line: str) -> str:
    """`\t7f01 conv (/x/lib.so)` -> `conv`: the symbol, without its file if shown."""
    parts = line.split(None, 1)
    return re.sub(r" \([^()]*\)$", "", parts[1].strip()) if len(parts) == 2 else "[unknown]"


def perf_under_step(text: str, pid: int, spans: list[list[float]]) -> tuple[Stacks, int]:
    """(the main thread's samples inside a step, every sample's count)."""
    starts = [s[0] for s in spans]
    out: Stacks = []
    total = 0
    for p, tid, t, frames in perf_samples(text):
        total += 1
        i = bisect.bisect_right(starts, t) - 1
        if p == pid and tid == pid and i >= 0 and t <= spans[i][1]:
            out.append((frames, 1))
    return out, total


def steps_per_s(spans: list[list[float]]) -> float:
    if len(spans) < 2:
        raise BenchError(f"the loop took {len(spans)} step(s): too few to time")
    return len(spans) / (spans[-1][1] - spans[0][0])


# --------------------------------------------------------------- measuring


class PeakRss:
    """A process's peak resident set (VmHWM), read until it exits."""

    def __init__(self, pid: int) -> None:
        self.kib = 0
        self._t = threading.Thread(target=self._poll, args=(pid,), daemon=True)
        self._t.start()

    def _poll(self, pid: int) -> None:
        while True:
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return
            m = re.search(r"VmHWM:\s+(\d+) kB", text)
            if m is None:  # a zombie: its memory is gone
                return
            self.kib = int(m[1])
            time.sleep(0.1)

    def result(self) -> int:
        self._t.join(timeout=5)
        return self.kib


def _wait(p: subprocess.Popen[str], what: str) -> tuple[str, str, float, int]:
    rss = PeakRss(p.pid)
    out, err = p.communicate(timeout=900)
    done = time.monotonic()
    if p.returncode != 0:
        raise BenchError(f"{what} failed ({p.returncode}): {err.strip()[-1500:]}")
    return out, err, done, rss.result()


TORCH = "torch==2.13.0"  # tools/test_deps.sh's, which bench/run's setup leaves out


def ensure_torch(stage: Stage) -> None:
    """torch in the bench's venv: installed from the registry on first use."""
    python = str(stage.venv / "bin/python")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        return
    log(f"torch: installing {TORCH} into {stage.venv}")
    subprocess.run([str(stage.venv / "bin/pip"), "install", "-q", TORCH], check=False)
    sh(["chmod", "-R", "a+rX", str(stage.venv)])  # the bench user runs the loop with it
    r = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"torch is not in {stage.venv} and `pip install {TORCH}` failed: "
                         f"{r.stderr.strip()[-300:]}")  # fmt: skip


class Row:
    """The row's files and commands in the stage's work folder."""

    def __init__(self, stage: Stage, seconds: float, workload: str) -> None:
        self.stage, self.seconds, self.workload = stage, seconds, workload
        self.work = stage.work / "torch"
        self.work.mkdir(exist_ok=True)
        os.chown(self.work, stage.bench_uid, stage.bench_gid)
        for name in ("torch_timed.py", "torch_cnn.py", "torch_standin.py"):
            shutil.copy(REPO / "bench" / name, self.work / name)
            (self.work / name).chmod(0o644)
        self.python = str(stage.venv / "bin/python")
        self.pyspy = find_pyspy(stage)
        if workload == "torch":
            ensure_torch(stage)

    def loop(self, tag: str) -> list[str]:
        extra = ["standin"] if self.workload == "standin" else []
        out = str(self.work / f"{tag}.json")
        return [self.python, str(self.work / "torch_timed.py"), str(self.seconds), out, *extra]

    def timing(self, tag: str, done: float) -> dict[str, Any]:
        doc = json.loads((self.work / f"{tag}.json").read_text())
        return doc | {"rate": steps_per_s(doc["spans"]), "to_file_s": done - doc["exit"]}

    def run(self, tool: str, tag: str) -> dict[str, Any]:
        argv = self.loop(tag)
        if tool == "untraced":
            p = self.stage.as_bench_user(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        elif tool == "gfxclient":
            out = ["--json", "profile", "--format", "folded", "-o", str(self.work / f"{tag}.txt")]
            p = self.stage.gfxclient(*out, "--", *argv,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        else:
            argv = self._root_tool(tool, tag) + self.stage.setpriv(argv)
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out_text, err, done, rss = _wait(p, tool)
        # py-spy's last words (its sample count) are on stdout
        res = self.timing(tag, done) | {"rss_kib": rss, "said": out_text[-400:] + err[-400:]}
        if tool == "gfxclient":
            res["summary"] = json.loads(out_text)
        return res

    def _root_tool(self, tool: str, tag: str) -> list[str]:
        out = str(self.work / f"{tag}.{'data' if tool == 'perf_dwarf' else 'txt'}")
        if tool == "perf_dwarf":
            return ["perf", "record", "-q", "-F", str(HZ), "--call-graph", "dwarf"] + [
                "-k", "CLOCK_MONOTONIC", "-o", out, "--"]  # fmt: skip
        native = ["--native"] if tool == "pyspy_native" else []
        return [self.pyspy, "record", *native, "-r", str(HZ), "-f", "raw", "-o", out, "--"]


def perf_script(data: Path) -> tuple[str, int]:
    """(`perf script` of the data, its peak RSS in KiB)."""
    with open(data.with_suffix(".script"), "w+") as f:
        # --no-inline: inlined frames are found by running addr2line per address,
        # minutes for libtorch; the chain to main is the same without them
        argv = ["perf", "script", "--no-inline", "-i", str(data), "-F", "comm,pid,tid,time,ip,sym"]
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise BenchError(f"perf script of {data} failed ({p.returncode})")
        f.seek(0)
        return f.read(), usage.ru_maxrss


READS = (
    'tracepoint:syscalls:sys_exit_process_vm_readv /comm == "py-spy" && args->ret > 0/ '
    "{ @bytes = sum(args->ret); }"
)


def pyspy_counts(stderr: str) -> tuple[int, int]:
    """(samples, errors) from py-spy record's last words."""
    m = re.search(r"Samples: (\d+) Errors: (\d+)", stderr)
    if m is None:
        raise BenchError(f"py-spy printed no sample count: {stderr[-300:]!r}")
    return int(m[1]), int(m[2])


def pyspy_bytes(row: Row, tool: str) -> dict[str, Any]:
    """One more (untimed) py-spy run with its process_vm_readv bytes counted."""
    trace = Bpftrace(READS, row.work / f"{tool}-reads.out")
    try:
        trace.wait_attached()
        res = row.run(tool, f"{tool}-bytes")
    finally:
        trace.stop()
    m = re.search(r"@bytes: (\d+)", trace.output.read_text())
    samples, _ = pyspy_counts(res["said"])
    return {"bytes_per_sample": round(int(m[1]) / samples) if m and samples else None}


def _default_policy(stage: Stage) -> str:
    admin = str(stage.venv / "bin/gfxbpf-admin")
    return "".join(
        sh([admin, "approve", name, "--users", BENCH_USER]).stdout
        for name in ("profile", "stackcopy")
    )


def _cache_bytes(stage: Stage) -> int:
    d = stage.home / ".cache/gfxbpf/unwind"
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0


def _rounds(row: Row, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Every tool once per round, the order rotated round by round."""
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TOOLS}
    for r in range(rounds):
        order = TOOLS[r % len(TOOLS) :] + TOOLS[: r % len(TOOLS)]
        for tool in order:
            runs[tool].append(row.run(tool, f"{tool}-{r}") | {"tag": f"{tool}-{r}"})
    return runs


def _shares(row: Row, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each tool's share of whole chains under the step, median over rounds."""
    out: dict[str, Any] = {}
    for tool, pred in (("gfxclient", whole_native), ("pyspy_native", whole_pyspy_native),
                       ("pyspy", None)):  # fmt: skip
        step = [under_step(parse_folded((row.work / f"{r['tag']}.txt").read_text().splitlines()))
                for r in runs[tool]]  # fmt: skip
        out[tool] = {
            "samples_under_step": median([sum(n for _, n in s) for s in step]),
            "whole": median([share(s, pred) or 0.0 for s in step]) if pred else None,
            "cut": cut_by([x for s in step for x in s], pred) if pred else None,
        }
    perf: list[tuple[float, int, int, int]] = []
    cut: Stacks = []
    for r in runs["perf_dwarf"]:
        data = row.work / f"{r['tag']}.data"
        text, script_rss = perf_script(data)
        step, total = perf_under_step(text, r["pid"], r["spans"])
        whole = share(step, whole_native) or 0.0
        cut.extend(step)
        perf.append((whole, len(step), data.stat().st_size // max(1, total), script_rss))
    out["perf_dwarf"] = {
        "whole": median([p[0] for p in perf]),
        "samples_under_step": median([p[1] for p in perf]),
        "bytes_per_sample": median([p[2] for p in perf]),
        "script_rss_kib": median([p[3] for p in perf]),
        "cut": cut_by(cut, whole_native),
    }
    return out


def _summarise(runs: dict[str, list[dict[str, Any]]], row: dict[str, Any]) -> None:
    base = median([r["rate"] for r in runs["untraced"]])
    row["untraced_steps_per_s"] = round(base, 2)
    for tool in TOOLS[1:]:
        rate = median([r["rate"] for r in runs[tool]])
        # each round's untraced rate over the tool's in the same round: the
        # machine's load moves both alike, and the median of these is the figure
        each = [u["rate"] / t["rate"] for u, t in zip(runs["untraced"], runs[tool], strict=True)]
        row[tool] |= {
            "steps_per_s": round(rate, 2),
            "slowdown": round(median(each), 3),
            "slowdown_of_medians": ratio(base, rate),
            "to_file_s": round(median([r["to_file_s"] for r in runs[tool]]), 3),
            "rss_kib": median([r["rss_kib"] for r in runs[tool]]),
        }
    row["rounds_steps_per_s"] = {t: [round(r["rate"], 2) for r in rs] for t, rs in runs.items()}


def run(stage: Stage, rounds: int, seconds: float, workload: str) -> dict[str, Any]:
    row = Row(stage, seconds, workload)
    before = (stage.work / "policy.toml").read_text()
    policy = _default_policy(stage)
    shutil.rmtree(stage.home / ".cache/gfxbpf/unwind", ignore_errors=True)
    log(f"torch: {workload} loop, {seconds} s per run, {rounds} round(s) of {len(TOOLS)} runs")
    reload_policy(stage, policy)
    try:
        first = row.run("gfxclient", "first")  # untimed: the tables a second profile finds
        runs = _rounds(row, rounds)
    finally:
        reload_policy(stage, before)
    out: dict[str, Any] = {"workload": workload, "hz": HZ, "seconds": seconds, "policy": policy}
    out |= _shares(row, runs)
    _summarise(runs, out)
    code = median([r["code_bytes"] for rs in runs.values() for r in rs])
    per100 = 100e6 / code
    out["code_mb"] = round(code / 1e6, 1)
    out["gfxclient"] |= {
        "tables_bytes": _cache_bytes(stage),
        "rss_mb": round(out["gfxclient"]["rss_kib"] / 1024, 1),
        "tables_mb_per_100mb": round(_cache_bytes(stage) * per100 / 1e6, 2),
        # ring record header (BPF_RINGBUF_HDR_SZ) + struct ustack_rec's header + the copy
        "record_bytes": 8 + UREC_HEADER.size + DEFAULT_STACK_BYTES,
        "program": first["summary"]["program"],
        "notes": first["summary"]["notes"],
    }
    for tool in ("pyspy_native", "pyspy"):
        counts = [pyspy_counts(r["said"]) for r in runs[tool]]
        out[tool] |= {"samples": median([c[0] for c in counts]),
                      "errors": median([c[1] for c in counts])}  # fmt: skip
        out[tool] |= pyspy_bytes(row, tool)
    spy_extra = out["pyspy_native"]["rss_kib"] - out["pyspy"]["rss_kib"]
    out["pyspy_native"]["tables_mb_per_100mb"] = round(spy_extra * 1024 * per100 / 1e6, 2)
    out["perf_dwarf"]["script_mb_per_100mb"] = round(
        out["perf_dwarf"]["script_rss_kib"] * 1024 * per100 / 1e6, 2
    )
    return out
