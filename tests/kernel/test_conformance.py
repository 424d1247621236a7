"""gfxbpf.bpf loads what libbpf loads: same translated code, same map names.

For every catalog object, each program's xlated instructions (as bpftool dumps
them) are identical whether gfxbpf.bpf or `bpftool prog loadall` loaded it,
map ids aside; and the maps, global-data maps included, carry libbpf's names.
"""

from __future__ import annotations

import shutil

import pytest

from gfxbpf.bpf import sys as bpfsys
from gfxbpf.bpf.catalog import load_catalog, object_path
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from tests.kernel.bpftool_ref import libbpf_load, map_names, need_bpffs, xlated

CATALOG = load_catalog()


@pytest.fixture(scope="module")
def bpffs() -> str:
    return need_bpffs()


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_same_code_and_map_names_as_bpftool(entry, bpffs: str) -> None:
    path = object_path(entry)
    spec = ObjectSpec.from_file(path)
    pin_dir, theirs = libbpf_load(path, prefix=f"gfxtest_{entry.name}_")
    try:
        with load(spec) as obj:
            ours = {p.name[:15]: p.id for p in obj.programs.values()}
            assert set(ours) == set(theirs), "programs differ from libbpf's"
            for name, our_id in ours.items():
                assert xlated(our_id) == xlated(theirs[name]), f"program {name} differs"
                assert map_names(our_id) == map_names(theirs[name]), f"{name}: map names"
            # Every map carries libbpf's name (global data maps: "<obj>.rodata" ...).
            for m in obj.maps.values():
                info = bpfsys.map_info(m.fileno())
                assert info.name == m.name
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)
