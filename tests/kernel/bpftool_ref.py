"""libbpf as the reference loader, through bpftool: load an object with
`bpftool prog loadall` and read back what the kernel holds (program ids,
translated code, map names), for the tests that compare gfxbpf.bpf's loads
with libbpf's (test_conformance.py, test_core_conformance.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import skip_or_fail

BPFFS = "/sys/fs/bpf"
_MAP_ID = re.compile(r"map\[id:\d+\]")


def need_bpffs() -> str:
    """bpftool installed and the BPF filesystem mounted (mounting it if not)."""
    if shutil.which("bpftool") is None:
        skip_or_fail("bpftool is not installed (apt-get install bpftool)")
    if not os.path.ismount(BPFFS):
        subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], check=True)
    return BPFFS


def bpftool_json(*args: str) -> object:
    out = subprocess.run(["bpftool", "-j", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def xlated(prog_id: int) -> list[str]:
    """bpftool's dump of the kernel's translated code, map ids masked."""
    insns = bpftool_json("prog", "dump", "xlated", "id", str(prog_id))
    assert isinstance(insns, list) and insns, f"empty xlated dump for prog {prog_id}"
    return [_MAP_ID.sub("map[id:*]", i["disasm"]) for i in insns]


def map_names(prog_id: int) -> set[str]:
    """The names of the maps program prog_id uses."""
    info = bpftool_json("prog", "show", "id", str(prog_id))
    assert isinstance(info, dict)
    names = set()
    for mid in info.get("map_ids", []):
        m = bpftool_json("map", "show", "id", str(mid))
        assert isinstance(m, dict)
        names.add(m["name"])
    return names


def libbpf_load(path: str | Path, prefix: str) -> tuple[str, dict[str, int]]:
    """Load every program of the object with libbpf (bpftool), pinned under a
    new folder of the BPF filesystem: (that folder, which the caller removes;
    the programs' ids by name)."""
    pin_dir = tempfile.mkdtemp(prefix=prefix, dir=need_bpffs())
    os.rmdir(pin_dir)  # bpftool creates it
    try:
        subprocess.run(["bpftool", "prog", "loadall", str(path), pin_dir], check=True,
                       capture_output=True)  # fmt: skip
        ids: dict[str, int] = {}
        for pin in os.listdir(pin_dir):
            info = bpftool_json("prog", "show", "pinned", os.path.join(pin_dir, pin))
            assert isinstance(info, dict)
            ids[info["name"]] = info["id"]
    except BaseException:
        shutil.rmtree(pin_dir, ignore_errors=True)
        raise
    return pin_dir, ids
