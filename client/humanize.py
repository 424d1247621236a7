"""Numbers for people: bytes, durations and counts with three significant
digits and a unit (the watch's tables, the profiles' notes), and a uid's
login name."""

from __future__ import annotations

import functools
import math
import pwd

BINARY = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _sig3(x: float) -> str:
    """x with three significant digits (x >= 0), no exponent."""
    if x == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:.{digits}f}"
    # Rounding can carry into a new digit (999.6 -> "1000"); keep three significant.
    if digits and len(text.replace(".", "").lstrip("0")) > 3:
        text = f"{x:.{digits - 1}f}"
    return text


def humanize_bytes(n: float) -> str:
    """1023 -> '1023 B', 1536 -> '1.50 KiB', 3 << 20 -> '3.00 MiB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1023.5:
        return f"{sign}{int(round(n))} B"
    value, i = float(n), -1
    while value >= 1024 and i + 1 < len(BINARY):
        value /= 1024
        i += 1
    text = _sig3(value)
    if float(text) >= 1024 and i + 1 < len(BINARY):  # 1023.9 KiB rounds to 1.00 MiB
        value /= 1024
        i += 1
        text = _sig3(value)
    return f"{sign}{text} {BINARY[i]}"


def humanize_ns(n: float) -> str:
    """Durations: 999 -> '999 ns', 1500 -> '1.50 µs', 2.5e6 -> '2.50 ms', 3e9 -> '3.00 s'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 999.5:
        return f"{sign}{int(round(n))} ns"
    for unit, scale in (("µs", 1e3), ("ms", 1e6), ("s", 1e9)):
        value = n / scale
        text = _sig3(value)
        if float(text) < 1000 or unit == "s":
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable")


def humanize_count(n: float) -> str:
    """Integers with thousands separators; fractions with one decimal."""
    if isinstance(n, float) and not n.is_integer():
        return f"{n:,.1f}"
    return f"{int(n):,}"


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The uid's login name; the number where the host has none for it
    (cached: an LDAP lookup is not repeated per row or per scrape)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)
