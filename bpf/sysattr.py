"""The bpf(2) attr layouts syscall.py fills: one ctypes Structure per
command, each a member of the BpfAttr union, and the info structs the
kernel fills. Layouts: include/uapi/linux/bpf.h, x86-64 (docs/BPF-ABI.md);
tests/unit/test_sys_layout.py checks their offsets and sizes."""

from __future__ import annotations

import ctypes

from gfxbpf.bpf.consts import BPF_OBJ_NAME_LEN

ATTR_SIZE = 168  # sizeof(union bpf_attr) on current kernels

u32 = ctypes.c_uint32
u64 = ctypes.c_uint64


class MapCreateAttr(ctypes.Structure):
    _fields_ = [
        ("map_type", u32),
        ("key_size", u32),
        ("value_size", u32),
        ("max_entries", u32),
        ("map_flags", u32),
        ("inner_map_fd", u32),
        ("numa_node", u32),
        ("map_name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("map_ifindex", u32),
        ("btf_fd", u32),
        ("btf_key_type_id", u32),
        ("btf_value_type_id", u32),
        ("btf_vmlinux_value_type_id", u32),
        ("map_extra", u64),
    ]


class MapElemAttr(ctypes.Structure):
    """LOOKUP/UPDATE/DELETE_ELEM and GET_NEXT_KEY (value doubles as next_key)."""

    _fields_ = [
        ("map_fd", u32),
        ("_pad", u32),
        ("key", u64),
        ("value", u64),
        ("flags", u64),
    ]


class MapBatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", u64),
        ("out_batch", u64),
        ("keys", u64),
        ("values", u64),
        ("count", u32),
        ("map_fd", u32),
        ("elem_flags", u64),
        ("flags", u64),
    ]


class ProgLoadAttr(ctypes.Structure):
    _fields_ = [
        ("prog_type", u32),
        ("insn_cnt", u32),
        ("insns", u64),
        ("license", u64),
        ("log_level", u32),
        ("log_size", u32),
        ("log_buf", u64),
        ("kern_version", u32),
        ("prog_flags", u32),
        ("prog_name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("prog_ifindex", u32),
        ("expected_attach_type", u32),
        ("prog_btf_fd", u32),
        ("func_info_rec_size", u32),
        ("func_info", u64),
        ("func_info_cnt", u32),
        ("line_info_rec_size", u32),
        ("line_info", u64),
        ("line_info_cnt", u32),
        ("attach_btf_id", u32),
        ("attach_btf_obj_fd", u32),  # also attach_prog_fd
        ("core_relo_cnt", u32),
        ("fd_array", u64),
        ("core_relos", u64),
        ("core_relo_rec_size", u32),
        ("log_true_size", u32),  # written back by the kernel (>= 6.4)
    ]


class BtfLoadAttr(ctypes.Structure):
    _fields_ = [
        ("btf", u64),
        ("btf_log_buf", u64),
        ("btf_size", u32),
        ("btf_log_size", u32),
        ("btf_log_level", u32),
        ("btf_log_true_size", u32),  # written back by the kernel (>= 6.4)
    ]


class InfoByFdAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", u32), ("info_len", u32), ("info", u64)]


class RawTracepointAttr(ctypes.Structure):
    _fields_ = [("name", u64), ("prog_fd", u32)]


class LinkCreateAttr(ctypes.Structure):
    _fields_ = [
        ("prog_fd", u32),
        ("target_fd", u32),
        ("attach_type", u32),
        ("flags", u32),
        ("bpf_cookie", u64),  # link_create.perf_event.bpf_cookie
    ]


class LinkCreateUprobeMultiAttr(ctypes.Structure):
    """link_create with the uprobe_multi member of its union (offset 16)."""

    _fields_ = [
        ("prog_fd", u32),
        ("target_fd", u32),
        ("attach_type", u32),
        ("flags", u32),
        ("path", u64),
        ("offsets", u64),
        ("ref_ctr_offsets", u64),
        ("cookies", u64),
        ("cnt", u32),
        ("um_flags", u32),
        ("pid", u32),
    ]


class MapFreezeAttr(ctypes.Structure):
    _fields_ = [("map_fd", u32)]


class EnableStatsAttr(ctypes.Structure):
    _fields_ = [("type", u32)]


class ObjIdAttr(ctypes.Structure):
    """GET_NEXT_ID (start_id, next_id) and GET_FD_BY_ID (the id, open_flags) views."""

    _fields_ = [("id", u32), ("next_id", u32), ("open_flags", u32)]


class BpfBtfInfo(ctypes.Structure):
    _fields_ = [
        ("btf", u64),
        ("btf_size", u32),
        ("id", u32),
        ("name", u64),
        ("name_len", u32),
        ("kernel_btf", u32),
    ]


class IterCreateAttr(ctypes.Structure):
    _fields_ = [("link_fd", u32), ("flags", u32)]


class ProgBindMapAttr(ctypes.Structure):
    _fields_ = [("prog_fd", u32), ("map_fd", u32), ("flags", u32)]


class BpfAttr(ctypes.Union):
    _fields_ = [
        ("map_create", MapCreateAttr),
        ("elem", MapElemAttr),
        ("batch", MapBatchAttr),
        ("prog_load", ProgLoadAttr),
        ("link_create_uprobe_multi", LinkCreateUprobeMultiAttr),
        ("btf_load", BtfLoadAttr),
        ("info", InfoByFdAttr),
        ("raw_tracepoint", RawTracepointAttr),
        ("link_create", LinkCreateAttr),
        ("map_freeze", MapFreezeAttr),
        ("enable_stats", EnableStatsAttr),
        ("iter_create", IterCreateAttr),
        ("obj_id", ObjIdAttr),
        ("prog_bind_map", ProgBindMapAttr),
        ("raw", ctypes.c_ubyte * ATTR_SIZE),
    ]


class BpfProgInfo(ctypes.Structure):
    _fields_ = [
        ("type", u32),
        ("id", u32),
        ("tag", ctypes.c_ubyte * 8),
        ("jited_prog_len", u32),
        ("xlated_prog_len", u32),
        ("jited_prog_insns", u64),
        ("xlated_prog_insns", u64),
        ("load_time", u64),
        ("created_by_uid", u32),
        ("nr_map_ids", u32),
        ("map_ids", u64),
        ("name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("ifindex", u32),
        ("gpl_compatible", u32),  # bit 0
        ("netns_dev", u64),
        ("netns_ino", u64),
        ("nr_jited_ksyms", u32),
        ("nr_jited_func_lens", u32),
        ("jited_ksyms", u64),
        ("jited_func_lens", u64),
        ("btf_id", u32),
        ("func_info_rec_size", u32),
        ("func_info", u64),
        ("nr_func_info", u32),
        ("nr_line_info", u32),
        ("line_info", u64),
        ("jited_line_info", u64),
        ("nr_jited_line_info", u32),
        ("line_info_rec_size", u32),
        ("jited_line_info_rec_size", u32),
        ("nr_prog_tags", u32),
        ("prog_tags", u64),
        ("run_time_ns", u64),
        ("run_cnt", u64),
        ("recursion_misses", u64),
        ("verified_insns", u32),
        ("attach_btf_obj_id", u32),
        ("attach_btf_id", u32),
    ]


class BpfMapInfo(ctypes.Structure):
    _fields_ = [
        ("type", u32),
        ("id", u32),
        ("key_size", u32),
        ("value_size", u32),
        ("max_entries", u32),
        ("map_flags", u32),
        ("name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("ifindex", u32),
        ("btf_vmlinux_value_type_id", u32),
        ("netns_dev", u64),
        ("netns_ino", u64),
        ("btf_id", u32),
        ("btf_key_type_id", u32),
        ("btf_value_type_id", u32),
        ("_pad", u32),
        ("map_extra", u64),
    ]
