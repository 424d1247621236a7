"""How much the stack scan past code without CFI (client/profiles/unwind/scan.py)
adds on a real program: its samples (bench/unwind_samples.py: SIGPROF, the
interrupted registers and an 8 KiB stack copy) unwound with and without the
scan, and the share of samples whose stack holds a given frame by name.

    python -m bench.unwind_scan_share FRAME [--period-us N] [--max N] [--stack-bytes N] -- ARGV...
    e.g. FRAME=Py_BytesMain -- /opt/torchenv/bin/python bench/torch_train.py 10
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.unwind_samples import Capture, sample_run
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.unwind import UnwindResult, UnwindTables, unwind, walk


def _unwound(cap: Capture, cache: Path, scan: bool) -> list[UnwindResult]:
    tables = UnwindTables(cache_dir=str(cache))
    saved = walk.scan_caller
    if not scan:
        walk.scan_caller = lambda *args: None  # type: ignore[assignment]
    try:
        return [unwind(s.regs, s.stack, cap.maps, tables) for s in cap.samples]
    finally:
        walk.scan_caller = saved


def _holding(frame: str, cap: Capture, results: list[UnwindResult], cache: Path) -> int:
    """Samples whose named stack holds frame."""
    sym = Symbolizer(cache_dir=str(cache / "sym"))
    sym.add_process(cap.maps.pid, cap.maps)
    raws = [RawStack(cap.maps.pid, r.frames, False, 1, "p", unwind_stop=r.stop) for r in results]
    stacks = sym.symbolize(raws, "samples").stacks
    return sum(w for names, w in stacks.items() if frame in names)


def report(frame: str, cap: Capture, folder: Path) -> None:
    total = len(cap.samples)
    print(f"{total} samples")
    for scan in (False, True):
        began = time.perf_counter()
        results = _unwound(cap, folder / "cache", scan)
        took = time.perf_counter() - began
        reach = _holding(frame, cap, results, folder / "cache")
        stops = Counter(str(r.stop) for r in results)
        scanned = sum(r.scanned > 0 for r in results)
        print(
            f"scan {'on ' if scan else 'off'}: {reach * 100 / total:.1f}% hold {frame}, "
            f"{scanned * 100 / total:.1f}% scanned, unwound in {took:.1f} s, stops "
            + ", ".join(f"{k} {v * 100 / total:.1f}%" for k, v in stops.most_common())
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frame")
    ap.add_argument("--period-us", type=int, default=10_000)
    ap.add_argument("--max", type=int, default=3000)
    ap.add_argument("--stack-bytes", type=int, default=8192, help="the copy (BPF's cap: 8192)")
    ap.add_argument("argv", nargs="+")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cap = sample_run(
            args.argv,
            Path(tmp),
            period_us=args.period_us,
            max_samples=args.max,
            stack_bytes=args.stack_bytes,
        )
        report(args.frame, cap, Path(tmp))


if __name__ == "__main__":
    main()
