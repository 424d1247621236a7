"""The client-side unwinder (issue #22): what compiling unwind tables costs
for the largest library on the machine, first and from the disk cache,
against pyelftools' CFI decoder on the same files; and how many samples per
second the unwinder walks, against `perf script` unwinding the same
workload's perf --call-graph dwarf data (when perf may record here).

No broker: the samples come from bench/unwind_samples.py's SIGPROF sampler
(the registers and 8 KiB of stack, as the BPF program copies them).

    python3 -m bench.unwind_tables [--lib PATH ...] [--pyelftools-all] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.unwind_samples import sample_run
from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.unwind import UnwindTables, unwind
from gfxbpf.client.profiles.unwind.compiled import FileTable
from gfxbpf.client.profiles.unwind.lazy import open_lazy
from gfxbpf.elf.reader import open_elf

LIB_DIRS = ("/usr/lib", "/usr/local/lib")
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
PY_LOOP = "x = 0\nfor i in range(12_000_000):\n    x += i * i % 7\n"


def largest_eh_frame(dirs: tuple[str, ...] = LIB_DIRS) -> tuple[str, int] | None:
    """(path, .eh_frame size) of the shared library with the largest .eh_frame."""
    best: tuple[str, int] | None = None
    for top in dirs:
        for folder, _, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                if ".so" not in name or os.path.islink(path) or os.path.getsize(path) < 1 << 20:
                    continue
                size = _eh_frame_size(path)
                if size and (best is None or size > best[1]):
                    best = (path, size)
    return best


def _eh_frame_size(path: str) -> int:
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError):
        return 0
    try:
        sec = elf.section(".eh_frame")
        return sec.size if sec else 0
    finally:
        os.close(fd)


def table_costs(path: str, cache_dir: str) -> dict[str, Any]:
    """First parse (empty cache), then a fresh process-like load from the cache."""
    first = UnwindTables(cache_dir=cache_dir, lazy=False)
    t0 = time.perf_counter()
    table = first.file_table(path)
    parse_s = time.perf_counter() - t0
    assert isinstance(table, FileTable) and first.parsed == 1, first.problems
    info = read_info(path)
    assert info is not None
    t0 = time.perf_counter()
    quick = open_lazy(path, info.segments)
    lazy_s = time.perf_counter() - t0 if quick is not None else None
    again = UnwindTables(cache_dir=cache_dir)
    t0 = time.perf_counter()
    again.file_table(path)
    cached_s = time.perf_counter() - t0
    assert again.cache_hits == 1
    on_disk = sum(p.stat().st_size for p in Path(cache_dir).iterdir())
    return {
        "path": path,
        "file_mb": round(os.path.getsize(path) / 1e6, 1),
        "eh_frame_mb": round(_eh_frame_size(path) / 1e6, 2),
        "fdes": len(table.func_starts),
        "rows": len(table.starts),
        "rules": len(table.rules),
        "table_mb": round(table.nbytes() / 1e6, 2),
        "cache_file_mb": round(on_disk / 1e6, 2),
        "first_parse_s": round(parse_s, 3),
        # A large file's first profile walks by .eh_frame_hdr from this moment on.
        "lazy_ready_s": round(lazy_s, 3) if lazy_s is not None else None,
        "cached_load_s": round(cached_s, 4),
    }


def pyelftools_decode_s(path: str) -> dict[str, Any]:
    """The peer: pyelftools decoding every FDE's table of the same .eh_frame."""
    from elftools.elf.elffile import ELFFile

    failed = 0
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for entry in ELFFile(f).get_dwarf_info().EH_CFI_entries():
            try:
                if hasattr(entry, "get_decoded"):
                    entry.get_decoded()
            except Exception:  # pyelftools refuses some opcodes glibc uses
                failed += 1
    return {"pyelftools_s": round(time.perf_counter() - t0, 3), "pyelftools_failed_fdes": failed}


def unwind_rate(work: Path, cache_dir: str) -> dict[str, Any]:
    """Samples/s: unwinding python3's samples with tables from the disk cache
    (a second profile), then with every table in memory; plus symbolizing."""
    cap = sample_run(["/usr/bin/python3", "-c", PY_LOOP], work, max_samples=5000)
    UnwindTables(cache_dir=cache_dir)  # tables on disk from a first profile:
    warmup = UnwindTables(cache_dir=cache_dir)
    for s in cap.samples[:50]:
        unwind(s.regs, s.stack, cap.maps, warmup)
    out: dict[str, Any] = {"samples": len(cap.samples)}
    tables = UnwindTables(cache_dir=cache_dir)
    for label in ("from_disk_cache", "in_memory"):
        t0 = time.perf_counter()
        results = [unwind(s.regs, s.stack, cap.maps, tables) for s in cap.samples]
        dt = time.perf_counter() - t0
        out[f"samples_per_s_{label}"] = round(len(results) / dt)
    frames = sum(len(r.frames) for r in results)
    out["mean_depth"] = round(frames / len(results), 1)
    out["complete_share"] = round(sum(r.stop is None for r in results) / len(results), 3)
    sym = Symbolizer(cache_dir=os.path.join(cache_dir, "sym"), unwind_tables=tables)
    sym.add_process(cap.maps.pid, cap.maps)
    raw = [RawStack(0, r.frames, False, 1, "python3", unwind_stop=r.stop) for r in results]
    t0 = time.perf_counter()
    sym.symbolize(raw, "samples")
    out["symbolize_s"] = round(time.perf_counter() - t0, 3)
    return out


def perf_script_rate(work: Path) -> dict[str, Any]:
    """The peer: perf record --call-graph dwarf of the same workload, and the
    samples/s of `perf script` unwinding (and naming) them."""
    if shutil.which("perf") is None:
        return {"perf": "not installed"}
    data = work / "perf.data"
    rec = subprocess.run(["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf,8192",
                          "-o", data, "/usr/bin/python3", "-c", PY_LOOP],
                         capture_output=True, text=True)  # fmt: skip
    if rec.returncode != 0:
        return {"perf": f"perf record failed: {rec.stderr.strip()[-200:]}"}
    t0 = time.perf_counter()
    script = subprocess.run(["perf", "script", "-i", data], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    samples = sum(1 for ln in script.stdout.splitlines() if ln and not ln[0].isspace())
    return {"perf_samples": samples, "perf_script_samples_per_s": round(samples / dt)}


def run(libs: list[str], pyelftools_all: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"libraries": []}
    with tempfile.TemporaryDirectory(prefix="gfxbpf-unwind-bench-") as tmp:
        for i, lib in enumerate(libs):
            row = table_costs(lib, os.path.join(tmp, f"cache{i}"))
            if lib == LIBC or pyelftools_all:
                row.update(pyelftools_decode_s(lib))
                row["ratio_vs_pyelftools"] = round(row["pyelftools_s"] / row["first_parse_s"], 1)
            out["libraries"].append(row)
        work = Path(tmp) / "work"
        work.mkdir()
        out["unwind"] = unwind_rate(work, os.path.join(tmp, "cache-rate"))
        out["unwind"].update(perf_script_rate(work))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.unwind_tables", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--lib", action="append", default=[], help="also measure this library")
    ap.add_argument("--pyelftools-all", action="store_true",
                    help="time pyelftools on every library (minutes on the largest)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    biggest = largest_eh_frame()
    libs = [LIBC] + ([biggest[0]] if biggest else []) + args.lib
    out = run(libs, args.pyelftools_all)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for row in out["libraries"]:
        print(json.dumps(row))
    print(json.dumps(out["unwind"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
