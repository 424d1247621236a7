"""bpf/btf/ and bpf/core/ are computations (docs/ARCHITECTURE.md): bytes and
types in, types and patched instructions out. Neither makes a system call
nor probes the kernel (bpf/kernel/ does, and the loader), CO-RE takes BTF,
records and instructions rather than an ObjectSpec, and btf/ never imports
core/ (core/ builds on btf/).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.imports import ROOT, imports, package_of

PURE = ("bpf/btf", "bpf/core")
# What makes or wraps system calls, or knows objects and the running kernel.
FORBIDDEN = (
    "gfxbpf.bpf.syscall",
    "gfxbpf.bpf.object",
    "gfxbpf.bpf.loader",
    "gfxbpf.bpf.maps",
    "gfxbpf.bpf.kernel",
    "gfxbpf.bpf.link",
    "gfxbpf.bpf.externs",
    "gfxbpf.bpf.corerelo",
    "os",
    "ctypes",
    "socket",
    "fcntl",
    "subprocess",
)


def _modules() -> list[Path]:
    return [p for d in PURE for p in sorted((ROOT / d).glob("*.py"))]


def _forbidden(name: str, bans: tuple[str, ...]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in bans)


def problems(source: str, rel: str) -> list[str]:
    """What in one module (its source, its path in the repository) breaks the rule."""
    tree = ast.parse(source)
    bans = FORBIDDEN + (("gfxbpf.bpf.core",) if rel.startswith("bpf/btf/") else ())
    package = package_of(ROOT / rel)
    out = [f"{rel}: imports {n}" for n in imports(tree, package) if _forbidden(n, bans)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                out.append(f"{rel}:{node.lineno}: opens a file")
            elif isinstance(f, ast.Attribute) and f.attr == "mmap":
                out.append(f"{rel}:{node.lineno}: maps a file")
    return out


def test_btf_and_core_make_no_system_call() -> None:
    found = [p for m in _modules() for p in problems(m.read_text(), str(m.relative_to(ROOT)))]
    assert not found, "move these to bpf/kernel/ or the loader:\n" + "\n".join(found)


def test_a_system_call_is_found() -> None:
    """The check sees each way a module under bpf/btf/ could reach the kernel."""
    source = (
        "import os\n"
        "from gfxbpf.bpf import syscall\n"
        "from gfxbpf.bpf.core.relo import CoreError\n"
        "def f():\n"
        "    from gfxbpf.bpf.object import ObjectSpec\n"
        "    return open('/sys/kernel/btf/vmlinux', 'rb'), mmap.mmap(-1, 1)\n"
    )
    rel = "bpf/btf/probe.py"
    found = problems(source, rel)
    assert f"{rel}: imports os" in found
    assert f"{rel}: imports gfxbpf.bpf.syscall" in found
    assert f"{rel}: imports gfxbpf.bpf.core.relo" in found
    assert f"{rel}: imports gfxbpf.bpf.object" in found
    assert f"{rel}:6: opens a file" in found and f"{rel}:6: maps a file" in found
