"""C++ and Rust symbol names as people read them, by binutils' c++filt.

Names are demangled in one batch per profile, only those that reach it (a
library's table can hold a hundred thousand; a profile names a few hundred).
Without c++filt the names stay mangled: still correct, only harder to read.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

__all__ = ["demangle", "is_mangled"]

_TIMEOUT_S = 30


def is_mangled(name: str) -> bool:
    # Itanium C++ ABI (and Rust's legacy scheme) start with _Z, Rust v0 with _R.
    return name.startswith(("_Z", "_R")) and "\n" not in name


def demangle(names: Iterable[str]) -> dict[str, str]:
    """mangled name -> readable name, for those of names that c++filt knows."""
    todo = sorted({n for n in names if is_mangled(n)})
    tool = shutil.which("c++filt")
    if not todo or tool is None:
        return {}
    try:
        r = subprocess.run(
            [tool],
            input="\n".join(todo) + "\n",
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = r.stdout.split("\n")
    if r.returncode != 0 or len(out) < len(todo):
        return {}
    return {m: d for m, d in zip(todo, out, strict=False) if d and d != m}
