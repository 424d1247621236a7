"""catalog/toolchains.toml and what `tools/build_bpf.py --check` answers with a
compiler other than the committed objects' (Debian 13's clang 19 next to
Debian 12's clang 14). Another compiler is stood in for here by a wrapper
that reports another version and emits DWARF 4, so other bytes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_catalog import _check, _partial_checkout

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bpf_toolchains as tc  # noqa: E402

needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
OTHER = "Test clang version 99.0.0"


def _other_clang(where: Path) -> Path:
    wrapper = where / "other-clang"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "{OTHER}"; exit 0; fi\n'
        'exec clang -gdwarf-4 "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def test_committed_toolchain_is_recorded_for_every_object() -> None:
    tcs = tc.load(ROOT / "catalog" / "toolchains.toml")
    ref = tc.committed(tcs)
    assert ref is not None and sum(t.committed for t in tcs) == 1
    for obj in (ROOT / "catalog" / "programs").glob("*.bpf.o"):
        key = str(obj.relative_to(ROOT))
        assert key in ref.objects, f"{key}: run python3 tools/build_bpf.py"
    # Debian 13's compiler is recorded too, for the same objects.
    others = [t for t in tcs if not t.committed]
    assert others and all(t.objects.keys() == ref.objects.keys() for t in others)


def test_toolchains_file_round_trips(tmp_path: Path) -> None:
    t = tc.Toolchain(
        "A clang 1", "h" * 64, "Some OS", True, {"x.bpf.o": tc.Built("1" * 64, "2" * 64)}
    )
    u = tc.Toolchain('B "clang" 2', "i" * 64, "Other OS", False, {})
    path = tmp_path / "toolchains.toml"
    path.write_text(tc.dump([u, t]))
    assert tc.load(path) == [t, u]  # the committed one first
    tc.record(path, tc.Toolchain("B clang 3", "j" * 64, "New", True, {}))
    names = [(x.compiler, x.committed) for x in tc.load(path)]
    assert names == [("B clang 3", True), ("A clang 1", False), ('B "clang" 2', False)]


def test_depfile_parsing() -> None:
    text = (
        "out.o: catalog/programs/a.bpf.c catalog/programs/gfxbpf.h \\\n  /usr/include/linux/bpf.h\n"
    )
    assert tc.parse_depfile(text) == [
        "catalog/programs/a.bpf.c",
        "catalog/programs/gfxbpf.h",
        "/usr/include/linux/bpf.h",
    ]


@needs_clang
def test_another_compiler_is_checked_against_its_recorded_hashes(tmp_path: Path) -> None:
    tree = _partial_checkout(tmp_path / "co")
    clang = str(_other_clang(tmp_path))
    r = _check(tree, "--check", "--clang", clang)
    assert r.returncode == 1
    assert f"no sha256 is recorded for {OTHER}" in r.stderr, r.stderr

    r = _check(tree, "--record-toolchain", "--clang", clang)
    assert r.returncode == 0, r.stderr
    r = _check(tree, "--check", "--clang", clang)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"built by {OTHER} match the sha256 recorded for it" in r.stdout
    assert "the committed objects are the build of Debian clang" in r.stdout

    # The committed object itself is still checked, against its own record.
    obj = tree / "catalog" / "programs" / "syscount.bpf.o"
    obj.write_bytes(obj.read_bytes() + b"\0")
    r = _check(tree, "--check", "--clang", clang)
    assert r.returncode == 1
    assert "syscount.bpf.o" in r.stderr and "clonecount.bpf.o" not in r.stderr


@needs_clang
def test_a_source_change_asks_for_every_toolchains_record(tmp_path: Path) -> None:
    # A helper edits a source and rebuilds with the committed compiler only:
    # the check names the object and the one command that records the rest.
    tree = _partial_checkout(tmp_path / "co")
    src = tree / "catalog" / "programs" / "syscount.bpf.c"
    src.write_text(src.read_text() + "\n/* changed */\n")
    r = subprocess.run(
        [sys.executable, str(tree / "tools" / "build_bpf.py")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    r = _check(tree, "--check")
    assert r.returncode == 1
    mismatches = [line for line in r.stderr.splitlines() if "MISMATCH" in line]
    assert mismatches and all("syscount.bpf.o" in line for line in mismatches), r.stderr
    assert "tools/debian13.sh --build-bpf" in r.stderr
