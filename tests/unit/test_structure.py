"""The product's folders stay rooms (docs/ARCHITECTURE.md, "Layers"): no
folder holds more than MAX_MODULES modules directly, no module is longer
than MAX_LINES (and the modules every request goes through, fewer: BOUNDS),
and no module or package is named like a standard-library module (`sys`,
`profile`, ...)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from tests.imports import PRODUCT_FOLDERS, ROOT, package_of

MAX_MODULES = 20
MAX_LINES = 700
# A module that grew back before: the broker's operations (issue 36; what
# they share lives in broker/bookkeeping.py). profile_cmd.py: test_profile_engine.py.
BOUNDS = {"broker/service.py": 450}
GENERATED = ("_pb2.py", "_pb2_grpc.py")


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


def test_every_product_package_is_installed() -> None:
    """pyproject.toml lists the packages one by one: a new subpackage left out
    works in an editable install and is missing from a real one."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {package_of(d / "__init__.py") for d in _folders() if (d / "__init__.py").exists()}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_longer_than_seven_hundred_lines() -> None:
    long = {
        str(f.relative_to(ROOT)): n
        for d in _folders()
        for f in d.glob("*.py")
        if not f.name.endswith(GENERATED) and (n := _lines(f)) > MAX_LINES
    }
    assert not long, f"split these modules by what they hold: {long}"


def test_the_bounded_modules_keep_their_bounds() -> None:
    over = {rel: _lines(ROOT / rel) for rel, most in BOUNDS.items() if _lines(ROOT / rel) > most}
    assert not over, f"over their bound {BOUNDS}: {over}"
