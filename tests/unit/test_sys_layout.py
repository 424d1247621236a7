"""bpf(2) attr layouts match the kernel ABI (include/uapi/linux/bpf.h, x86-64;
docs/BPF-ABI.md). Offline."""

from __future__ import annotations

import ctypes
import errno

import pytest

from gfxbpf.bpf import sysattr
from gfxbpf.bpf import syscall as bpfsys


def offsets(struct_type: type[ctypes.Structure]) -> dict[str, int]:
    return {name: getattr(struct_type, name).offset for name, *_ in struct_type._fields_}


def test_union_size() -> None:
    assert ctypes.sizeof(sysattr.BpfAttr) == 168 == sysattr.ATTR_SIZE
    # Every command's view starts at offset 0 of the union.
    for name, *_ in sysattr.BpfAttr._fields_:
        assert getattr(sysattr.BpfAttr, name).offset == 0
        assert getattr(sysattr.BpfAttr, name).size <= 168


def test_map_create() -> None:
    o = offsets(sysattr.MapCreateAttr)
    assert o["map_type"] == 0 and o["key_size"] == 4 and o["value_size"] == 8
    assert o["max_entries"] == 12 and o["map_flags"] == 16 and o["inner_map_fd"] == 20
    assert o["numa_node"] == 24 and o["map_name"] == 28 and o["map_ifindex"] == 44
    assert o["btf_fd"] == 48 and o["btf_key_type_id"] == 52 and o["btf_value_type_id"] == 56
    assert o["map_extra"] == 64
    assert sysattr.MapCreateAttr.map_name.size == 16


def test_elem_ops() -> None:
    o = offsets(sysattr.MapElemAttr)
    assert (o["map_fd"], o["key"], o["value"], o["flags"]) == (0, 8, 16, 24)
    assert ctypes.sizeof(sysattr.MapElemAttr) == 32


def test_lookup_batch() -> None:
    o = offsets(sysattr.MapBatchAttr)
    assert (o["in_batch"], o["out_batch"], o["keys"], o["values"]) == (0, 8, 16, 24)
    assert (o["count"], o["map_fd"], o["elem_flags"], o["flags"]) == (32, 36, 40, 48)


def test_prog_load() -> None:
    o = offsets(sysattr.ProgLoadAttr)
    want = {
        "prog_type": 0,
        "insn_cnt": 4,
        "insns": 8,
        "license": 16,
        "log_level": 24,
        "log_size": 28,
        "log_buf": 32,
        "kern_version": 40,
        "prog_flags": 44,
        "prog_name": 48,
        "prog_ifindex": 64,
        "expected_attach_type": 68,
        "prog_btf_fd": 72,
        "func_info_rec_size": 76,
        "func_info": 80,
        "func_info_cnt": 88,
        "line_info_rec_size": 92,
        "line_info": 96,
        "line_info_cnt": 104,
        "attach_btf_id": 108,
        "attach_btf_obj_fd": 112,
        # newer fields of uapi bpf.h:
        "core_relo_cnt": 116,
        "fd_array": 120,
        "core_relos": 128,
        "core_relo_rec_size": 136,
        "log_true_size": 140,
    }
    assert {k: o[k] for k in want} == want


def test_btf_load() -> None:
    o = offsets(sysattr.BtfLoadAttr)
    assert o["btf"] == 0 and o["btf_log_buf"] == 8 and o["btf_size"] == 16
    assert o["btf_log_size"] == 20 and o["btf_log_level"] == 24 and o["btf_log_true_size"] == 28


def test_info_by_fd_and_infos() -> None:
    o = offsets(sysattr.InfoByFdAttr)
    assert (o["bpf_fd"], o["info_len"], o["info"]) == (0, 4, 8)
    p = offsets(sysattr.BpfProgInfo)
    want = {
        "type": 0,
        "id": 4,
        "tag": 8,
        "xlated_prog_len": 20,
        "xlated_prog_insns": 32,
        "nr_map_ids": 52,
        "map_ids": 56,
        "name": 64,
        "btf_id": 128,
        "run_time_ns": 192,
        "run_cnt": 200,
        "recursion_misses": 208,
    }
    assert {k: p[k] for k in want} == want
    assert ctypes.sizeof(sysattr.BpfProgInfo) == 232  # as of uapi 6.1
    m = offsets(sysattr.BpfMapInfo)
    want = {
        "type": 0,
        "id": 4,
        "key_size": 8,
        "value_size": 12,
        "max_entries": 16,
        "map_flags": 20,
        "name": 24,
        "btf_id": 64,
        "btf_key_type_id": 68,
        "btf_value_type_id": 72,
        "map_extra": 80,
    }
    assert {k: m[k] for k in want} == want
    assert ctypes.sizeof(sysattr.BpfMapInfo) == 88


def test_attach_and_misc() -> None:
    o = offsets(sysattr.RawTracepointAttr)
    assert (o["name"], o["prog_fd"]) == (0, 8)
    o = offsets(sysattr.LinkCreateAttr)
    assert (o["prog_fd"], o["target_fd"], o["attach_type"], o["flags"]) == (0, 4, 8, 12)
    assert o["bpf_cookie"] == 16  # link_create.perf_event.bpf_cookie
    assert offsets(sysattr.MapFreezeAttr)["map_fd"] == 0
    assert offsets(sysattr.EnableStatsAttr)["type"] == 0
    o = offsets(sysattr.ProgBindMapAttr)
    assert (o["prog_fd"], o["map_fd"], o["flags"]) == (0, 4, 8)
    o = offsets(sysattr.IterCreateAttr)
    assert (o["link_fd"], o["flags"]) == (0, 4)


def test_command_numbers() -> None:
    assert (bpfsys.BPF_ITER_CREATE, bpfsys.BPF_PROG_BIND_MAP) == (33, 35)
    assert (bpfsys.BPF_MAP_CREATE, bpfsys.BPF_PROG_LOAD, bpfsys.BPF_OBJ_GET_INFO_BY_FD) == (
        0,
        5,
        15,
    )
    assert (bpfsys.BPF_RAW_TRACEPOINT_OPEN, bpfsys.BPF_BTF_LOAD, bpfsys.BPF_MAP_FREEZE) == (
        17,
        18,
        22,
    )
    assert (bpfsys.BPF_MAP_LOOKUP_BATCH, bpfsys.BPF_LINK_CREATE, bpfsys.BPF_ENABLE_STATS) == (
        24,
        28,
        32,
    )
    assert bpfsys.SYS_BPF == 321


def test_object_names() -> None:
    assert bpfsys._obj_name("minimal.bss", "map") == b"minimal.bss"
    assert bpfsys._obj_name("a_very_long_map_name", "map") == b"a_very_long_map"
    for bad in ("has space", "dash-ed", "ünï", "x\0y"):
        with pytest.raises(ValueError, match="letters, digits"):
            bpfsys._obj_name(bad, "map")
    # Checked before any syscall.
    with pytest.raises(ValueError):
        bpfsys.map_create(1, 4, 4, 1, name="no/slash")


def test_cpu_list() -> None:
    assert bpfsys._count_cpu_list("0-3,5,7-8") == 7
    assert bpfsys._count_cpu_list("0\n") == 1
    for bad in ("3-1", "", "a-b"):
        with pytest.raises(ValueError):
            bpfsys._count_cpu_list(bad)


def test_error_text() -> None:
    e = bpfsys.BpfError(errno.EACCES, "BPF_PROG_LOAD", "0: (95) exit\nR0 !read_ok\n")
    assert e.errno == errno.EACCES and e.command == "BPF_PROG_LOAD"
    text = str(e)
    assert "BPF_PROG_LOAD" in text and "EACCES" in text and "R0 !read_ok" in text
    assert isinstance(e, OSError)
    e = bpfsys.BpfError(bpfsys.ENOTSUPP, "BPF_MAP_LOOKUP_BATCH")
    assert "ENOTSUPP" in str(e) and "not supported" in str(e)
    assert "no log" in str(bpfsys.BpfError(errno.EINVAL, "BPF_BTF_LOAD", ""))
