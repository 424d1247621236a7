"""The product's folders stay rooms (docs/ARCHITECTURE.md, "Layers"): no
folder holds more than MAX_MODULES modules directly, and no module or
package is named like a standard-library module (`sys`, `profile`, ...)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.imports import PRODUCT_FOLDERS, ROOT

MAX_MODULES = 20


def _folders() -> list[Path]:
    out = []
    for top in PRODUCT_FOLDERS:
        out.append(ROOT / top)
        out.extend(
            p for p in sorted((ROOT / top).rglob("*")) if p.is_dir() and p.name != "__pycache__"
        )
    return out


def test_no_folder_holds_more_than_twenty_modules() -> None:
    crowded = {
        str(d.relative_to(ROOT)): n
        for d in _folders()
        if (n := len(list(d.glob("*.py")))) > MAX_MODULES
    }
    assert not crowded, f"split these folders into subpackages: {crowded}"


def test_no_module_is_named_like_the_standard_library() -> None:
    clashes = []
    for d in _folders():
        if (d / "__init__.py").exists() and d.name in sys.stdlib_module_names:
            clashes.append(str(d.relative_to(ROOT)))
        clashes.extend(
            str(f.relative_to(ROOT)) for f in d.glob("*.py") if f.stem in sys.stdlib_module_names
        )
    assert not clashes, f"rename these (they read like the standard library's): {clashes}"
