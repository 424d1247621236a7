"""Every module a docstring, a comment or a doc names exists.

A module reference is a word ending in `.py`, `.bpf.c` or `.h`, with or
without the folders before it (`tables.py`, `unwind/tables.py`,
`catalog/programs/gfx_tree.h`), in the docstrings and comments of the
product's modules and in README.md and docs/*.md. It exists when a file of
the repository has that name, or ends with that path. Not references: a
placeholder (a name in capitals, `NAME.bpf.c`, or after `*`), and the files
of other projects listed in OTHER_PROJECTS (kernel and libc headers, the
user's own scripts in examples).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

from tests.imports import PRODUCT_FOLDERS, ROOT

REFERENCE = re.compile(r"(?<![\w./*-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_][\w-]*\.(?:py|bpf\.c|h))\b")
# Other projects' files: system headers by their include path, the kernel's
# sources, PyTorch's modules, CUDA's header, and the scripts a user profiles
# in the examples (pyframes.py: the Python program of docs/gpu-hosts.md's check).
OTHER_PREFIXES = ("linux/", "asm/", "sys/", "bpf/bpf_", "include/", "drivers/", "torch/")
OTHER_PROJECTS = {"bpf_helper_defs.h", "cuda.h", "vmlinux.h", "train.py", "s.py", "pyframes.py"}


# Outside a git checkout (CI's Debian 13 userland gets the files without .git
# and has no git), every file below ROOT but these folders counts.
_NOT_SOURCES = {".git", "build", "dist", "__pycache__", "node_modules", ".gpu", ".whl"}


def _repository_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.split()
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _NOT_SOURCES and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
        return files


def _is_placeholder(ref: str) -> bool:
    stem = ref.rsplit("/", 1)[-1].split(".", 1)[0]
    return stem.isupper()


def _exists(ref: str, files: list[str], names: set[str]) -> bool:
    if "/" not in ref:
        return ref in names
    return any(f == ref or f.endswith("/" + ref) for f in files)


def _python_text(path: Path) -> list[str]:
    """The docstrings and comments of one module."""
    source = path.read_text()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append(tok.string)
    return out


def _texts() -> list[tuple[str, str]]:
    out = []
    for top in PRODUCT_FOLDERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            out.extend((str(path.relative_to(ROOT)), t) for t in _python_text(path))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out.append((str(path.relative_to(ROOT)), path.read_text()))
    return out


def missing_references(texts: list[tuple[str, str]], files: list[str]) -> set[str]:
    """'where: name' for each module name in texts that no file has."""
    names = {f.rsplit("/", 1)[-1] for f in files}
    missing = set()
    for where, text in texts:
        for ref in REFERENCE.findall(text):
            if ref in OTHER_PROJECTS or ref.startswith(OTHER_PREFIXES) or _is_placeholder(ref):
                continue
            if not _exists(ref, files, names):
                missing.add(f"{where}: {ref}")
    return missing


def test_every_named_module_exists() -> None:
    missing = missing_references(_texts(), _repository_files())
    assert not missing, "these name modules that do not exist:\n" + "\n".join(sorted(missing))


def test_a_stale_name_is_found() -> None:
    files = ["bpf/btf/facade.py", "client/profiles/unwind/tables.py", "catalog/programs/gfx_tree.h"]
    texts = [
        ("a.py", "Built by facade.py (btf/facade.py); read by unwind/tables.py, gfx_tree.h."),
        ("b.py", "The old btf/blob.py, core_apply.py and gfx_ring.h."),
        ("c.md", "See catalog/programs/NAME.bpf.c, *_cmd.py, linux/bpf.h and train.py."),
    ]
    assert missing_references(texts, files) == {
        "b.py: btf/blob.py",
        "b.py: core_apply.py",
        "b.py: gfx_ring.h",
    }
