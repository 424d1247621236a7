"""python -m gfxbpf.bpf inspect: output and errors (no kernel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

CATALOG = load_catalog()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gfxbpf.bpf", *args], capture_output=True, text=True, timeout=60
    )


def test_inspect_json_lists_programs_maps_knobs_helpers() -> None:
    r = run("inspect", "--json", str(object_path(CATALOG.get("execsnoop"))))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    prog = d["programs"]["process_exec"]
    assert prog["type"] == "tracepoint" and prog["target"] == "sched/sched_process_exec"
    assert "ringbuf_reserve" in prog["helpers"] and prog["subprograms"] == ["fill_event"]
    assert d["maps"]["events"]["type"] == "ringbuf"
    assert d["maps"][".rodata"]["kernel_name"] == "execsnoo.rodata"
    assert d["maps"][".rodata"]["variables"]["target_uid"]["value"] == 0xFFFFFFFF


def test_inspect_text_and_disasm() -> None:
    r = run("inspect", "--disasm", str(object_path(CATALOG.get("syscount"))))
    assert r.returncode == 0, r.stderr
    assert "sys_enter  raw_tracepoint" in r.stdout
    assert "exit" in r.stdout and "counts (counts)  percpu_array" in r.stdout


def test_bad_objects_give_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.o"
    bad.write_bytes(object_path(CATALOG.get("syscount")).read_bytes()[:300])
    for target in (str(bad), str(tmp_path / "missing.o")):
        r = run("inspect", target)
        assert r.returncode == 1
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = run("frobnicate")
    assert r.returncode == 64
