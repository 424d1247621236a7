"""Small statistics for bench figures (no NumPy: the venv does not have it)."""

from __future__ import annotations

import statistics


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def percentile(xs: list[float], p: float) -> float:
    """The p-th percentile (0..100), linear between closest ranks."""
    s = sorted(xs)
    if not s:
        raise ValueError("no samples")
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ratio(ours: float, peer: float) -> float | None:
    """ours / peer, None when the peer figure is 0."""
    return round(ours / peer, 3) if peer else None
