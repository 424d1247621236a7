"""7. The cuda program on a large libcuda stand-in: attach cost and probe cost.

No GPU here: bench/cuda_standin.py builds a libcuda.so.1 with the driver API
names plus thousands of filler functions and tens of MiB of data (NVIDIA's
is ~96 MB), run by cuda_workload as the bench user.

- Attach: `gfxclient watch cuda --pid P --once` as the bench user, the
  broker's own elapsed_ms from its audit log. The first attach to a file
  indexes its symbols (each copy of the library is a new inode, so a cold
  index); later ones reuse the cached index. Beside it, the index parse
  alone in this process, and pyelftools walking the same .dynsym (how
  symbols were found before the index) as the peer.
- Launch cost: ns per cuLaunchKernel call of the stand-in (which does
  nothing) untraced and with the cuda program's entry and return probes
  attached; rounds interleaved, medians. The difference is what the probes
  add to every launch (two uprobe traps and the BPF programs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench import cuda_standin as cs
from bench.harness import BenchError, Stage, log
from bench.stats import median, ratio
from gfxbpf.bpf import symbols

LIB_GLOB = "cuda/*/libcuda.so.1"  # under the stage's work directory (the policy's libraries)


def _build(stage: Stage, fillers: int, pad_mib: int, files: int) -> tuple[list[Path], Path]:
    base = stage.work / "cuda"
    log(f"cuda: building the stand-in ({fillers} filler functions, {pad_mib} MiB of data)")
    first = cs.build_library(base / "lib0", fillers=fillers, pad_mib=pad_mib)
    libs = [first]
    for i in range(1, files):
        d = base / f"lib{i}"
        d.mkdir()
        libs.append(Path(shutil.copy2(first, d / cs.LIBNAME)))  # a new inode: a cold index
    exe = cs.build_workload(base / "bin")
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    return libs, exe


def _workload(stage: Stage, exe: Path, lib: Path) -> cs.Workload:
    return cs.Workload(
        exe,
        lib,
        user=stage.bench_uid,
        group=stage.bench_gid,
        extra_groups=[],
        env=stage.client_env(),
        cwd=stage.work,
    )


def _attach_ms(stage: Stage, pid: int, symbols_said: str) -> float:
    """The broker's elapsed_ms of one `watch cuda --once` attach, whose audit
    record must say the symbol index was symbols_said ("parsed" or "cached")."""
    seen = len(stage.audit())
    stage.timed_gfxclient("--json", "watch", "cuda", "--pid", str(pid), "--once",
                          "--interval", "0.05")  # fmt: skip
    recs = [
        r
        for r in stage.audit()[seen:]
        if r.get("op") == "attach" and r.get("program") == "cuda" and r.get("result") == "ok"
    ]
    if len(recs) != 1:
        raise BenchError(f"expected one cuda attach record, found {len(recs)}")
    if recs[0].get("symbols") != symbols_said:
        raise BenchError(f"the attach's symbol index was {recs[0].get('symbols')!r}, "
                         f"expected {symbols_said!r}")  # fmt: skip
    return float(recs[0]["elapsed_ms"])


def _index_ms(lib: Path) -> tuple[float, float, int]:
    """(ms to index lib's symbols, ms pyelftools takes to walk its .dynsym, symbols)."""
    from elftools.elf.elffile import ELFFile  # only for the comparison

    symbols.cache_clear()
    t0 = time.perf_counter()
    idx = symbols.index_for(lib)
    ours = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    with open(lib, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        n = sum(1 for s in dynsym.iter_symbols() if s.name and idx.has(s.name))
    peer = (time.perf_counter() - t0) * 1000
    symbols.cache_clear()
    return ours, peer, n


class _Watch:
    """A `gfxclient watch cuda --json` held open; its lines read by a thread."""

    def __init__(self, stage: Stage, pid: int) -> None:
        self.pid = pid
        self.proc = stage.gfxclient("--json", "watch", "cuda", "--pid", str(pid), "--interval",
                                    "0.25", "--duration", "600",
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        self.last: dict[str, Any] = {}
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self.ready.wait(60):
            self.stop()
            raise BenchError("gfxclient watch cuda printed nothing within 60 s")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)
            self.ready.set()

    def launches(self) -> int:
        p = self.last.get("processes", {}).get(str(self.pid), {})
        return int(p.get("launches", 0))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def _launch_cost(stage: Stage, w: cs.Workload, calls: int, rounds: int) -> dict[str, Any]:
    untraced: list[float] = []
    traced: list[float] = []
    per_line = 5
    for i in range(rounds):
        log(f"cuda: launch cost round {i + 1}/{rounds}")
        untraced += w.bench("cuLaunchKernel", calls, per_line)
        watch = _Watch(stage, w.pid)
        try:
            traced += w.bench("cuLaunchKernel", calls, per_line)
            deadline = time.monotonic() + 10
            while watch.launches() < calls * per_line and time.monotonic() < deadline:
                time.sleep(0.05)
            seen = watch.launches()
        finally:
            watch.stop()
        if seen != calls * per_line:
            raise BenchError(f"the probes counted {seen} of {calls * per_line} launches")
    u, t = median(untraced), median(traced)
    return {
        "untraced_ns": round(u, 1),
        "traced_ns": round(t, 1),
        "added_ns": round(t - u, 1),
        "calls_per_sample": calls,
        "samples": len(traced),
    }


def run(
    stage: Stage, fillers: int, pad_mib: int, files: int, attaches: int, calls: int, rounds: int
) -> dict[str, Any]:
    libs, exe = _build(stage, fillers, pad_mib, files)
    index_ms, peer_ms, nsyms = _index_ms(libs[0])
    first: list[float] = []
    second: list[float] = []
    for n, lib in enumerate(libs):
        log(f"cuda: attaches to copy {n + 1}/{len(libs)} of the stand-in")
        with _workload(stage, exe, lib) as w:
            first.append(_attach_ms(stage, w.pid, "parsed"))
            second += [_attach_ms(stage, w.pid, "cached") for _ in range(attaches)]
    with _workload(stage, exe, libs[0]) as w:
        cost = _launch_cost(stage, w, calls, rounds)
    return {
        "library_bytes": libs[0].stat().st_size,
        "dynsym_functions": nsyms,
        "index_ms": round(index_ms, 2),
        "pyelftools_dynsym_ms": round(peer_ms, 2),
        "ratio_index": ratio(index_ms, peer_ms),
        "first_attach_ms": round(median(first), 2),
        "second_attach_ms": round(median(second), 2),
        "second_attach_max_ms": round(max(second), 2),
        "first_attaches": len(first),
        "second_attaches": len(second),
        "launch": cost,
    }
