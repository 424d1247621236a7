"""No import cycles among product modules (docs/ARCHITECTURE.md, "Layers").

Imports inside functions and under TYPE_CHECKING count: a cycle held
together by a deferred import is still a cycle in the design.
"""

from __future__ import annotations

from tests.imports import cycles, module_graph, module_of, product_files


def _sources() -> dict[str, tuple[str, bool]]:
    return {module_of(f): (f.read_text(), f.stem == "__init__") for f in product_files()}


def test_no_import_cycle_among_product_modules() -> None:
    found = cycles(module_graph(_sources()))
    assert not found, "import cycles (break them with a callback or a protocol):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_checker_sees_deferred_and_type_checking_cycles() -> None:
    sources = {
        "gfxbpf.x": ("", True),
        "gfxbpf.x.a": ("from gfxbpf.x import b\n", False),
        "gfxbpf.x.b": ("def f():\n    from . import c\n", False),
        "gfxbpf.x.c": ("if TYPE_CHECKING:\n    from gfxbpf.x.a import A\n", False),
        "gfxbpf.x.d": ("from gfxbpf.x import a\n", False),
    }
    assert cycles(module_graph(sources)) == [["gfxbpf.x.a", "gfxbpf.x.b", "gfxbpf.x.c"]]


def test_a_package_is_not_a_dependency_of_the_submodules_it_names() -> None:
    sources = {
        "gfxbpf.p": ("from gfxbpf.p import m\n", True),
        "gfxbpf.p.m": ("from gfxbpf.p import n\n", False),
        "gfxbpf.p.n": ("", False),
    }
    assert module_graph(sources)["gfxbpf.p.m"] == {"gfxbpf.p.n"}
    assert cycles(module_graph(sources)) == []
