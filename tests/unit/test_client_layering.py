"""The client's layering (DESIGN.md): it imports nothing from the broker, only the
read side of gfxbpf.bpf and gfxbpf.proto, and never touches tracefs or capabilities."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "client"
FILES = sorted(CLIENT.glob("*.py"))

# gfxbpf.bpf modules a client may use: reading map fds it was handed, consuming
# a ring buffer, decoding BTF (and what those import themselves).
ALLOWED_BPF = {"gfxbpf.bpf.maps", "gfxbpf.bpf.ringbuf", "gfxbpf.bpf.btf"}
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


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against gfxbpf.client
                base = "gfxbpf.client" + ("." + node.module if node.module else "")
                names.append(base)
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


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_client_has_modules() -> None:
    assert {"__init__.py", "broker.py", "cli.py", "display.py"} <= {f.name for f in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_follow_the_layers(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for name in _imports(tree):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_TOP, f"{path.name} imports {name}"
        assert not name.startswith("gfxbpf.broker"), f"{path.name} imports {name}"
        if name.startswith("gfxbpf.") and top == "gfxbpf":
            layer = name.split(".")[1]
            assert layer in ("client", "proto", "bpf"), f"{path.name} imports {name}"
            if layer == "bpf":
                module = ".".join(name.split(".")[:3])
                # "from gfxbpf.bpf.btf import Btf" records gfxbpf.bpf.btf and gfxbpf.bpf.btf.Btf
                assert module in ALLOWED_BPF or name == "gfxbpf.bpf", (
                    f"{path.name} imports {name}: the client may use only "
                    f"{sorted(ALLOWED_BPF)} from gfxbpf.bpf"
                )


# syscalls.py is a generated name table (it names the capget/capset syscalls);
# it is checked to be nothing but data below.
CODE_FILES = [f for f in FILES if f.name != "syscalls.py"]


def test_syscall_table_is_only_data() -> None:
    tree = ast.parse((CLIENT / "syscalls.py").read_text())
    assert _imports(tree) == ["__future__", "__future__.annotations"]
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert calls == ["SYSCALLS.get"]  # the lookup in syscall_name(), nothing else


@pytest.mark.parametrize("path", CODE_FILES, ids=lambda p: p.name)
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
        "import gfxbpf.client, gfxbpf.client.cli\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('gfxbpf', 'prctl')))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    assert "gfxbpf.client.cli" in loaded
    bad = [m for m in loaded if m.startswith(("gfxbpf.broker", "prctl"))]
    assert not bad, bad
    for m in (
        "gfxbpf.bpf.tracefs",
        "gfxbpf.bpf.attach",
        "gfxbpf.bpf.loader",
        "gfxbpf.bpf.instance",
    ):
        assert m not in loaded, f"the client pulled in {m}"
