"""bench/run --quick's stand-in for bench/torch_cnn.py where torch is not
installed (CI's Debian 13 leg: GFXBPF_NO_TORCH=1): the same train() ->
train_step() shape in pure Python, so that the row's four profilers, its
parsing and its table run in the smoke without the 850 MB of torch."""

from __future__ import annotations

import time


def train_step(n: int) -> int:
    return sum(i * i for i in range(n))


def train(seconds: float) -> int:
    steps, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        train_step(20000)
        steps += 1
    return steps
