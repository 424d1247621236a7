"""`python -m gfxbpf.bpf inspect` shows CO-RE relocations and how they resolve (no kernel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "core"
OBJ = str(DATA / "core_kinds.bpf.o")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gfxbpf.bpf", *args], capture_output=True, text=True, timeout=60
    )


def test_json_has_kind_access_and_resolution() -> None:
    r = run("inspect", "--json", "--target-btf", str(DATA / "target_old.bpf.o"), OBJ)
    assert r.returncode == 0, r.stderr
    core = json.loads(r.stdout)["core"]
    assert core["target"].endswith("target_old.bpf.o")
    by = {(x["program"], x["kind"], x["local"]): x for x in core["relocations"]}
    pid = by[("fields", "byte_off", "struct task_struct.pid")]
    assert pid["access"] == "0:1" and pid["local_value"] == 8 and pid["value"] == 0
    assert pid["target"] == "struct task_struct.pid" and pid["target_btf"] == "vmlinux"
    old = by[("fields", "byte_off", "struct task_struct___old.state")]
    assert old["value"] == 8  # the flavour resolves in the old layout
    missing = by[("fields", "byte_off", "struct task_struct.missing")]
    assert "missing" in missing["poisoned"]
    amb = by[("ambiguous", "byte_off", "struct amb.x")]
    assert amb["value"] == 0 and "error" not in amb


def test_text_names_poison_and_ambiguity() -> None:
    r = run("inspect", "--target-btf", str(DATA / "target_new.bpf.o"), OBJ)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "CO-RE relocations, resolved against" in out
    assert "fields insn 2: byte_off struct task_struct.pid (0:1) -> vmlinux[" in out
    assert "poisoned: field struct task_struct___old.state is in none of the candidates" in out
    assert "ambiguous insn 0: byte_off struct amb.x (0:0) -> error: ambiguous" in out


def test_unreadable_target_is_reported_not_raised(tmp_path: Path) -> None:
    bad = tmp_path / "bad.btf"
    bad.write_bytes(b"not btf at all")
    r = run("inspect", "--json", "--target-btf", str(bad), OBJ)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    core = json.loads(r.stdout)["core"]
    assert core["target"] is None and "not BTF" in core["error"]


def test_objects_without_core_have_no_core_section() -> None:
    r = run("inspect", "--json", str(DATA / "target_new.bpf.o"))
    assert r.returncode == 0, r.stderr
    assert "core" not in json.loads(r.stdout)
