"""The import graph of the product, read from the sources with the AST.

One collector for the layering test and the import-cycle test: every import
a module names, inside functions and under TYPE_CHECKING included, with
relative imports resolved against the module's package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Folder -> the package its modules are imported as (pyproject's package-dir);
# tools/ are scripts, run from a bare checkout.
PACKAGES = {
    "tomlcheck": "gfxbpf.tomlcheck",
    "elf": "gfxbpf.elf",
    "bpf": "gfxbpf.bpf",
    "catalog": "gfxbpf.catalog",
    "proto": "gfxbpf.proto",
    "broker": "gfxbpf.broker",
    "client": "gfxbpf.client",
    "exporter": "gfxbpf.exporter",
    "bench": "bench",
    "tools": "tools",
}
PRODUCT_FOLDERS = ("tomlcheck", "elf", "bpf", "catalog", "proto", "broker", "client", "exporter")


def package_of(path: Path) -> str:
    """The package a module file belongs to: gfxbpf.catalog.programs for catalog/programs/x.py."""
    rel = path.relative_to(ROOT)
    return ".".join([PACKAGES[rel.parts[0]], *rel.parts[1:-1]])


def module_of(path: Path) -> str:
    """The dotted name of a module file (a package for __init__.py)."""
    package = package_of(path)
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def imports(tree: ast.AST, package: str = "gfxbpf.client") -> list[str]:
    """Every module name tree imports, anywhere in it, relative ones resolved
    against package (the package of the module that tree is). For
    `from M import a` both M and M.a are listed (a may be a submodule)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                full = base + ("." + node.module if node.module else "")
                names.append(full)
                names.extend(f"{full}.{a.name}" for a in node.names)
            elif node.module is not None:
                names.append(node.module)
                names.extend(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call):
            # importlib.import_module("...") / __import__("...") with a literal
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if fname in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.append(arg.value)
    return names


def product_files(folders: Iterable[str] = PRODUCT_FOLDERS) -> list[Path]:
    return sorted(f for folder in folders for f in (ROOT / folder).rglob("*.py"))


def module_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports.

    sources: module name -> (its source text, whether it is a package).
    `from pkg import name` depends on pkg.name when that is a module, else
    on pkg itself, so a package's __init__ is an edge only where it is used.
    """
    graph: dict[str, set[str]] = {}
    for name, (text, is_package) in sources.items():
        package = name if is_package else name.rpartition(".")[0]
        deps: set[str] = set()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                # Resolve each imported name on its own: M.a if a module, else M.
                base = imports(ast.Module(body=[node], type_ignores=[]), package)[0]
                for a in node.names:
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {_known(d, sources) for d in deps} - {name, ""}
    return graph


def _known(name: str, sources: dict[str, tuple[str, bool]]) -> str:
    """The longest prefix of name that is a module of sources ("" if none)."""
    while name and name not in sources:
        name = name.rpartition(".")[0]
    return name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
