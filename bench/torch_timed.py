"""The workload of bench/torch_chains.py: bench/torch_cnn.py's training loop
(or, without torch, the stand-in loop of bench/torch_standin.py) with each
training step timed, so that every profiler's samples can be told apart the
same way and the loop's own steps/s read from one place.

    python3 bench/torch_timed.py SECONDS OUT.json [standin]

OUT.json: the process id, each step's CLOCK_MONOTONIC start and end (perf's
samples carry the same clock with -k CLOCK_MONOTONIC: those of the main
thread inside a step are the samples under the step), the bytes of
executable mappings of the process, and the time just before it exits
(os._exit, once the DataLoader's workers are shut down), from which the
time to each profiler's written file is measured.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

spans: list[tuple[float, float]] = []


def timed(step: Callable[..., Any]) -> Callable[..., Any]:
    def timed_step(*args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return step(*args)
        finally:
            spans.append((t0, time.monotonic()))

    return timed_step


def code_bytes() -> int:
    """Bytes of the process's executable file mappings (/proc/self/maps)."""
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and "x" in fields[1] and fields[5].startswith("/"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                total += hi - lo
    return total


def main() -> None:
    seconds, out = float(sys.argv[1]), sys.argv[2]
    if sys.argv[3:] == ["standin"]:
        import torch_standin as loop  # bench/ is the script's folder, so on the path
    else:
        import torch
        import torch_cnn as loop  # type: ignore[no-redef]

        torch.set_num_threads(1)  # as torch_cnn.py's own main
    loop.train_step = timed(loop.train_step)  # type: ignore[assignment]  # looked up per batch
    loop.train(seconds)
    doc = {"pid": os.getpid(), "spans": spans, "code_bytes": code_bytes()}
    sys.stdout.flush()
    sys.stderr.flush()
    with open(out, "w") as f:
        json.dump(doc | {"exit": time.monotonic()}, f)
    os._exit(0)  # the end the profilers' write-out is timed from


if __name__ == "__main__":
    main()
