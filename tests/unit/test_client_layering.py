"""The layers' import directions (docs/ARCHITECTURE.md, "Layers").

Every module of every layer is parsed, imports inside functions and under
TYPE_CHECKING included, and checked against one table of forbidden
directions. The client gets stricter checks below: only the read side of
gfxbpf.bpf, and no tracefs or capability code at all."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.imports import ROOT, imports, package_of

CLIENT = ROOT / "client"
FILES = sorted(CLIENT.rglob("*.py"))  # client/profiles/ too

# What each layer must never import: other layers by folder name, and
# third-party packages by top-level name. tests/ may import anything.
_LAYERS = ("tomlcheck", "elf", "bpf", "catalog", "proto", "broker", "client", "exporter")
FORBIDDEN: dict[str, frozenset[str]] = {
    # Checking TOML files: the standard library only, below every layer that reads one.
    "tomlcheck": frozenset({*_LAYERS[1:], "bench", "tests", "tools", "grpc", "google", "elftools"}),
    # The one ELF layer: the standard library and pyelftools, below bpf and the client.
    "elf": frozenset({*_LAYERS[2:], "tomlcheck", "bench", "tests", "tools", "grpc", "google"}),
    # The loader knows no policy, no wire format and no catalog; it reads ELF
    # through gfxbpf.elf, never pyelftools itself (one ELF reader).
    "bpf": frozenset(
        {
            *("catalog", "proto", "broker", "client", "exporter", "bench", "tests", "tools"),
            *("grpc", "google", "elftools"),
        }
    ),
    # The catalog runs programs with the library; it knows no policy and no wire.
    "catalog": frozenset(
        {"proto", "broker", "client", "exporter", "bench", "tests", "tools", "grpc", "google"}
        | {"elftools"}
    ),
    # Messages and framing know no daemon and no kernel object.
    "proto": frozenset({*_LAYERS, "bench", "tests", "tools", "elftools"} - {"proto"}),
    # The daemon uses bpf and proto, never the client library.
    "broker": frozenset({"client", "exporter", "bench", "tests", "tools", "elftools"}),
    # The client never holds a capability nor runs broker code.
    "client": frozenset(
        {"broker", "bench", "tests", "tools", "prctl", "exporter", "prometheus_client"}
        | {"elftools"}
    ),
    # The exporter is a client of the broker like gfxclient: the client library
    # (and through it the read side of bpf), never the daemon. The client does
    # not import it back (prometheus-client is an optional extra).
    "exporter": frozenset({"broker", "bench", "tests", "tools", "prctl", "elftools"}),
    # The benchmark measures what a user runs: the client, and bpf for its own
    # programs (and pyelftools as a peer it compares with).
    "bench": frozenset({"broker", "tests", "tools"}),
    # Build scripts run before the package is installed.
    "tools": frozenset({*_LAYERS, "bench", "tests"}),
}


def _layer_of(name: str) -> str:
    """bpf/proto/broker/client for gfxbpf.*, the folder for bench/tests/tools,
    else the top-level package name (stdlib or third-party)."""
    parts = name.split(".")
    if parts[0] == "gfxbpf" and len(parts) > 1:
        return parts[1]
    return parts[0]


def _module_files(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


# gfxbpf.bpf modules a client may use: reading map fds it was handed, consuming
# a ring buffer, decoding BTF (and what those import themselves), and the
# constants (names and numbers, no syscalls: map types, scope names).
# cuda_api, memory_api and function_tables are data (the cuda and memstacks
# programs' function tables): the client names map keys by the table the
# broker attached by.
ALLOWED_BPF = {
    "gfxbpf.bpf.maps",
    "gfxbpf.bpf.ringbuf",
    "gfxbpf.bpf.btf.facade",  # the package: parsing and decoding, no syscalls
    "gfxbpf.bpf.lazy",  # stdlib only: names re-exported on first use
    "gfxbpf.bpf.gcpause",  # stdlib only: the cyclic collector paused while rows are made
    "gfxbpf.bpf.consts",
    "gfxbpf.catalog.cuda_api",
    "gfxbpf.catalog.memory_api",
    "gfxbpf.catalog.function_tables",
    "gfxbpf.catalog.python",  # data only: per-release CPython layouts the decoders follow
    "gfxbpf.catalog.stack_copies",  # data only: the stack-copy programs' size bounds
    "gfxbpf.catalog.cupti_kinds",  # data only: the names of cudakernels' copy kinds
    "gfxbpf.catalog.proctree",  # world-readable /proc files only: the tree gfx_tree.h follows
}
FORBIDDEN_TOP = {"broker", "prctl", "ctypes"}
# Strings that mean tracefs/debugfs access or capability games.
FORBIDDEN_TEXT = (
    "/sys/kernel/tracing",
    "/sys/kernel/debug",
    "tracefs",
    "prctl",
    "capset",
    "capget",
    "setcap",
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_SYS_ADMIN",
)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


# tools/stock_kernels.py's guest program runs only as PID 1 of a qemu guest,
# beside the copy of gfxbpf the tool packs, never from the checkout: it is held
# to bench/'s rules (a program of gfxbpf's that measures it), not tools/'.
GUEST_PROGRAMS = {ROOT / "tools" / "stock_kernels_guest.py": "bench"}
LAYER_FILES = [
    (GUEST_PROGRAMS.get(f, layer), f) for layer in FORBIDDEN for f in _module_files(layer)
]


def test_every_source_folder_is_in_the_table() -> None:
    folders = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/**/*.py")}
    folders -= {"tests", "build"}  # tests may import anything; build/ is setuptools' scratch
    assert {f for f in folders if not f.startswith(".") and not f.endswith(".egg-info")} <= set(
        FORBIDDEN
    )
    for layer in FORBIDDEN:
        assert _module_files(layer), f"no modules under {layer}/"


def test_the_collector_sees_lazy_relative_and_dynamicimports() -> None:
    tree = ast.parse(
        "from . import tracer\n"
        "from ..proto import framing\n"
        "def f():\n"
        "    from gfxbpf.broker import rulebook\n"
        "    importlib.import_module('gfxbpf.client.shell')\n"
        "if TYPE_CHECKING:\n"
        "    import grpc\n"
    )
    got = set(imports(tree, "gfxbpf.bpf"))
    assert {"gfxbpf.bpf.tracer", "gfxbpf.proto.framing", "gfxbpf.broker.rulebook"} <= got
    assert {"gfxbpf.client.shell", "grpc"} <= got
    assert {_layer_of(n) for n in got} == {"bpf", "proto", "broker", "client", "grpc"}


@pytest.mark.parametrize(
    ("layer", "path"), LAYER_FILES, ids=[str(f.relative_to(ROOT)) for _, f in LAYER_FILES]
)
def test_no_forbidden_import_direction(layer: str, path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    bad = sorted({n for n in imports(tree, package_of(path)) if _layer_of(n) in FORBIDDEN[layer]})
    assert not bad, f"{path.relative_to(ROOT)} ({layer}/) imports {bad}"


# Loading a layer must not load a forbidden gfxbpf layer either (what the
# parse above cannot see: an import hidden behind a computed name).
PRODUCT_LAYERS = _LAYERS


@pytest.mark.parametrize("layer", PRODUCT_LAYERS)
def test_importing_a_layer_loads_no_forbidden_layer(layer: str) -> None:
    modules = [
        f"{package_of(f)}.{f.stem}" if f.stem != "__init__" else package_of(f)
        for f in _module_files(layer)
        if f.stem != "__main__"
    ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gfxbpf.'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    bad = [m for m in loaded if _layer_of(m) in FORBIDDEN[layer]]
    assert not bad, f"importing gfxbpf.{layer} loads {bad}"


def test_client_has_modules() -> None:
    names = {str(f.relative_to(CLIENT)) for f in FILES}
    assert {"__init__.py", "broker.py", "cli/gfxclient.py", "cli/display.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CLIENT)))
def test_imports_follow_the_layers(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for name in imports(tree, package_of(path)):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_TOP, f"{path.name} imports {name}"
        assert not name.startswith("gfxbpf.broker"), f"{path.name} imports {name}"
        if name.startswith("gfxbpf.") and top == "gfxbpf":
            layer = name.split(".")[1]
            # gfxbpf.elf only reads files: the symbolizer shares the broker's ELF layer.
            assert layer in ("client", "proto", "bpf", "catalog", "tomlcheck", "elf"), (
                f"{path.name} imports {name}"
            )
            if layer in ("bpf", "catalog"):
                # "from gfxbpf.bpf.btf.facade import Btf" records gfxbpf.bpf.btf.facade and its .Btf
                allowed = any(name == a or name.startswith(a + ".") for a in ALLOWED_BPF)
                assert allowed or name in ("gfxbpf.bpf", "gfxbpf.catalog"), (
                    f"{path.name} imports {name}: the client may use only "
                    f"{sorted(ALLOWED_BPF)} from gfxbpf.bpf"
                )


# syscalls.py is a generated name table (it names the capget/capset syscalls);
# it is checked to be nothing but data below.
CODE_FILES = [f for f in FILES if f.name != "syscalls.py"]


def test_syscall_table_is_only_data() -> None:
    tree = ast.parse((CLIENT / "syscalls.py").read_text())
    assert imports(tree) == ["__future__", "__future__.annotations"]
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert calls == ["SYSCALLS.get"]  # the lookup in syscall_name(), nothing else


@pytest.mark.parametrize("path", CODE_FILES, ids=lambda p: str(p.relative_to(CLIENT)))
def test_no_tracefs_or_capabilities(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstring_nodes(tree)
    texts: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                texts.append(node.value)
        elif isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
    for text in texts:
        for bad in FORBIDDEN_TEXT:
            assert bad.lower() not in text.lower(), (
                f"{path.name} mentions {bad!r} in code: {text!r}"
            )


def test_importing_the_client_loads_no_broker_or_privileged_module() -> None:
    code = (
        "import sys, json\n"
        "import gfxbpf.client, gfxbpf.client.cli.gfxclient\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('gfxbpf', 'prctl')))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    assert "gfxbpf.client.cli.gfxclient" in loaded
    bad = [m for m in loaded if m.startswith(("gfxbpf.broker", "prctl"))]
    assert not bad, bad
    for m in (
        "gfxbpf.bpf.link.tracefs",
        "gfxbpf.bpf.link.attach",
        "gfxbpf.bpf.loader",
        "gfxbpf.catalog.instance",
    ):
        assert m not in loaded, f"the client pulled in {m}"


# The exporter is a client of the library, not of gfxclient's screens: it may
# import the package's API and these library modules, never display,
# cuda_view, cli or the other presentation modules.
EXPORTER_CLIENT_API = {
    "gfxbpf.client",  # Broker, Attachment, ClientMap, EventStream, the errors
    "gfxbpf.client.errors",
    "gfxbpf.client.grpc_config",  # TlsFiles: how to reach a remote broker
    "gfxbpf.client.mapdata",  # a map's decoded snapshot
    "gfxbpf.client.libcuda",  # where a process maps libcuda; cuda key names
    "gfxbpf.client.syscalls",  # the generated system-call name table
    "gfxbpf.client.profiles.demangle",  # C++ names as people read them (CUDA kernels)
    "gfxbpf.client.humanize",  # a uid's login name (the `user` label)
}
EXPORTER_FILES = _module_files("exporter")


def _client_modules_imported(tree: ast.AST, package: str) -> set[str]:
    """The gfxbpf.client modules tree imports (`from gfxbpf.client import x`
    counts as module x where client/x.py exists, else as the package)."""
    out: set[str] = set()
    for name in imports(tree, package):
        if not name.startswith("gfxbpf.client"):
            continue
        rel = name.split(".")[2:]
        while rel and not (
            (CLIENT.joinpath(*rel).with_suffix(".py")).exists() or CLIENT.joinpath(*rel).is_dir()
        ):
            rel = rel[:-1]
        out.add(".".join(["gfxbpf.client", *rel]))
    return out


@pytest.mark.parametrize("path", EXPORTER_FILES, ids=lambda p: p.name)
def test_exporter_uses_only_the_client_library_api(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    bad = sorted(_client_modules_imported(tree, package_of(path)) - EXPORTER_CLIENT_API)
    assert not bad, f"exporter/{path.name} imports client presentation code: {bad}"


def test_the_exporter_check_sees_a_presentation_module() -> None:
    tree = ast.parse(
        "from gfxbpf.client import Broker\n"
        "import gfxbpf.client.cli.cuda_view as view\n"
        "import gfxbpf.client.cli.display\n"
    )
    got = _client_modules_imported(tree, "gfxbpf.exporter")
    assert got == {"gfxbpf.client", "gfxbpf.client.cli.cuda_view", "gfxbpf.client.cli.display"}
