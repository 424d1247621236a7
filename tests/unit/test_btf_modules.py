"""The modules of bpf/btf/ form layers with no import cycle; facade.py re-exports them."""

from __future__ import annotations

import ast
from pathlib import Path

from gfxbpf.bpf.btf import facade as btf

BPF = Path(__file__).resolve().parents[2] / "bpf"
# Each module may import only the ones before it (btf/facade.py, the facade, imports them all).
LAYERS = [
    "errors",
    "gcpause",
    "btf.kinds",
    "btf.table",
    "btf.parse",
    "btf.encode",
    "btf.decode",
    "btf.mapdefs",
]
ALSO_LOW = {"btf.ext": {"errors", "btf.kinds", "btf.table"}}


def _bpf_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("gfxbpf.bpf."):
                mod = node.module.removeprefix("gfxbpf.bpf.")
                for a in node.names:  # `from gfxbpf.bpf.btf.facade import kinds` imports btf.kinds
                    sub = f"{mod}.{a.name}"
                    names.add(sub if (BPF / f"{sub.replace('.', '/')}.py").exists() else mod)
        elif isinstance(node, ast.Import):
            names.update(
                a.name.removeprefix("gfxbpf.bpf.")
                for a in node.names
                if a.name.startswith("gfxbpf.bpf.")
            )
    return names


def test_btf_modules_import_only_lower_layers() -> None:
    for i, name in enumerate(LAYERS):
        allowed = set(LAYERS[:i])
        assert _bpf_imports(BPF / f"{name.replace('.', '/')}.py") <= allowed, name
    for name, allowed in ALSO_LOW.items():
        assert _bpf_imports(BPF / f"{name.replace('.', '/')}.py") <= allowed, name


def test_btf_reexports_what_callers_import() -> None:
    for name in btf.__all__:
        assert hasattr(btf, name), name
    # broker/service.py, bpf/object.py and the tests import these from gfxbpf.bpf.btf.facade.
    for name in ("KIND_STRUCT", "KIND_DATASEC", "LINKAGE_STATIC", "INT_BOOL", "Datasec", "Var"):
        assert name in btf.__all__
