"""gfxbpf.bpf loads what libbpf loads: same translated code, same map names.

For every catalog object, each program's xlated instructions (as bpftool dumps
them) are identical whether gfxbpf.bpf or `bpftool prog loadall` loaded it,
map ids aside; and the maps, global-data maps included, carry libbpf's names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from gfxbpf.bpf import sys as bpfsys
from gfxbpf.bpf.catalog import load_catalog, object_path
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import skip_or_fail

CATALOG = load_catalog()
BPFFS = "/sys/fs/bpf"
_MAP_ID = re.compile(r"map\[id:\d+\]")


@pytest.fixture(scope="module")
def bpffs() -> str:
    if shutil.which("bpftool") is None:
        skip_or_fail("bpftool is not installed (apt-get install bpftool)")
    if not os.path.ismount(BPFFS):
        subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], check=True)
    return BPFFS


def _bpftool_json(*args: str) -> object:
    out = subprocess.run(["bpftool", "-j", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def _xlated(prog_id: int) -> list[str]:
    """bpftool's dump of the kernel's translated code, map ids masked."""
    insns = _bpftool_json("prog", "dump", "xlated", "id", str(prog_id))
    assert isinstance(insns, list) and insns, f"empty xlated dump for prog {prog_id}"
    return [_MAP_ID.sub("map[id:*]", i["disasm"]) for i in insns]


def _map_names(prog_id: int) -> set[str]:
    info = _bpftool_json("prog", "show", "id", str(prog_id))
    assert isinstance(info, dict)
    names = set()
    for mid in info.get("map_ids", []):
        m = _bpftool_json("map", "show", "id", str(mid))
        assert isinstance(m, dict)
        names.add(m["name"])
    return names


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_same_code_and_map_names_as_bpftool(entry, bpffs: str) -> None:
    path = object_path(entry)
    pin_dir = tempfile.mkdtemp(prefix=f"gfxtest_{entry.name}_", dir=bpffs)
    os.rmdir(pin_dir)  # bpftool creates it
    spec = ObjectSpec.from_file(path)
    try:
        subprocess.run(
            ["bpftool", "prog", "loadall", path, pin_dir], check=True, capture_output=True
        )
        theirs: dict[str, int] = {}
        for pin in os.listdir(pin_dir):
            info = _bpftool_json("prog", "show", "pinned", os.path.join(pin_dir, pin))
            assert isinstance(info, dict)
            theirs[info["name"]] = info["id"]
        with load(spec) as obj:
            ours = {p.name[:15]: p.id for p in obj.programs.values()}
            assert set(ours) == set(theirs), "programs differ from libbpf's"
            for name, our_id in ours.items():
                assert _xlated(our_id) == _xlated(theirs[name]), f"program {name} differs"
                assert _map_names(our_id) == _map_names(theirs[name]), f"{name}: map names"
            # Every map carries libbpf's name (global data maps: "<obj>.rodata" ...).
            for m in obj.maps.values():
                info = bpfsys.map_info(m.fileno())
                assert info.name == m.name
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)
