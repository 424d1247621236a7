"""gfxbpf.bpf loads what libbpf loads: same translated code, same map names.

For every catalog object, each program's xlated instructions (as bpftool dumps
them) are identical whether gfxbpf.bpf or `bpftool prog loadall` loaded it,
map ids aside; and the maps, global-data maps included, carry libbpf's names.
The comparison itself lives in bpftool_compare.py (test_corpus.py uses it too).
"""

from __future__ import annotations

import pytest

from gfxbpf.bpf.consts import BPF_TRACE_UPROBE_MULTI
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path
from tests.kernel.bpftool_compare import (
    assert_loads_like_libbpf,
    ensure_bpffs,
    libbpf_loads_usdt_for_uprobe_multi,
)

CATALOG = load_catalog()


@pytest.fixture(scope="module")
def bpffs() -> str:
    return ensure_bpffs()


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_same_code_and_map_names_as_bpftool(entry, bpffs: str) -> None:
    path = object_path(entry)
    spec = ObjectSpec.from_file(path)
    if libbpf_loads_usdt_for_uprobe_multi():  # as bpftool's libbpf loads them (test_usdt.py)
        for prog in spec.programs.values():
            if prog.section.startswith("usdt"):
                prog.expected_attach_type = BPF_TRACE_UPROBE_MULTI
    assert assert_loads_like_libbpf(path, spec, bpffs) > 0
