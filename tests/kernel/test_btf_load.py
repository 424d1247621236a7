"""The kernel accepts BTF that btf.py fixed up and re-encoded (and refuses it unfixed)."""

from __future__ import annotations

import os

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.facade import Btf, BtfExt, parse_btf_maps
from tests.conftest import compile_bpf
from tests.unit.test_btf import OBJ_SOURCE


@pytest.fixture(scope="module")
def elf_obj(tmp_path_factory: pytest.TempPathFactory):
    from elftools.elf.elffile import ELFFile

    obj = compile_bpf(OBJ_SOURCE, tmp_path_factory.mktemp("btfload"))
    f = open(obj, "rb")  # ELFFile reads lazily: keep it open
    yield ELFFile(f)
    f.close()


def test_fixed_btf_loads(elf_obj) -> None:
    raw = elf_obj.get_section_by_name(".BTF").data()
    btf = Btf.parse(raw)
    # As clang leaves it (DATASEC sizes 0), the kernel refuses it.
    with pytest.raises(bpfsys.BpfError):
        fd = bpfsys.btf_load(btf.to_bytes())
        os.close(fd)
    sizes = {s.name: s.data_size for s in elf_obj.iter_sections() if s.name}
    symbols = {
        s.name: s["st_value"]
        for s in elf_obj.get_section_by_name(".symtab").iter_symbols()
        if s["st_info"]["type"] == "STT_OBJECT"
    }
    btf.fixup_datasecs(sizes, symbols)
    btf.set_func_linkage("on_switch", 0)
    fd = bpfsys.btf_load(btf.to_bytes())
    try:
        assert fd >= 0
    finally:
        os.close(fd)
    assert {m.name for m in parse_btf_maps(btf)} == {"counts", "rb", "events"}
    ext = BtfExt.parse(elf_obj.get_section_by_name(".BTF.ext").data(), btf)
    assert ext.func_info["tracepoint/sched/sched_switch"]
