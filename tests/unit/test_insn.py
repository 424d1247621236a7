"""Instruction decoder, analyzer, disassembler and the helper table."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gfxbpf.bpf import asm as insn
from gfxbpf.bpf import helpers
from gfxbpf.bpf.asm import Insn
from tests.conftest import compile_bpf, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "tools" / "gen_helpers.py"


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_helpers", GEN)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def call(helper_id: int) -> Insn:
    return Insn(insn.CODE_CALL, 0, 0, 0, helper_id)


EXIT = Insn(insn.CODE_EXIT)
MOV_R0_0 = Insn(insn.BPF_ALU64 | insn.BPF_MOV | insn.BPF_K, 0, 0, 0, 0)


# --- encoding ---------------------------------------------------------------


def test_field_layout() -> None:
    # 0xbf = mov r2, r1: dst is the low nibble of byte 1, src the high one.
    (i,) = insn.decode(bytes.fromhex("bf12 fcff feffffff"))
    assert (i.code, i.dst, i.src, i.off, i.imm) == (0xBF, 2, 1, -4, -2)
    assert i.to_bytes() == bytes.fromhex("bf12fcfffeffffff")


def test_roundtrip_random_bytes() -> None:
    rng = random.Random(1234)
    data = bytes(rng.randrange(256) for _ in range(8 * 500))
    insns = insn.decode(data)
    assert len(insns) == 500
    assert insn.encode(insns) == data
    assert insn.decode(insn.encode(insns)) == insns


def test_encode_accepts_unsigned_imm_and_rejects_out_of_range() -> None:
    assert Insn(0x18, imm=0xFFFFFFFF).to_bytes() == Insn(0x18, imm=-1).to_bytes()
    for bad in (Insn(0x100), Insn(0, dst=16), Insn(0, src=-1), Insn(0, off=0x8000)):
        with pytest.raises(ValueError, match="outside"):
            bad.to_bytes()
    with pytest.raises(ValueError):
        Insn(0, imm=1 << 32).to_bytes()


def test_truncated_input_raises() -> None:
    good = insn.encode([MOV_R0_0, EXIT])
    for data in (good[:-1], good + b"\x00" * 3, b"\x95"):
        with pytest.raises(ValueError, match="not a multiple of 8"):
            insn.decode(data)
        with pytest.raises(ValueError, match="not a multiple of 8"):
            insn.analyze(data)
        with pytest.raises(ValueError, match="not a multiple of 8"):
            insn.disasm(data)
    assert insn.decode(b"") == []
    assert insn.analyze(b"").insn_count == 0


def test_predicates() -> None:
    pair = insn.ld_imm64(1, 5)
    assert insn.is_ld_imm64(pair[0]) and not insn.is_ld_imm64(pair[1])
    assert call(14).is_call() and call(14).is_helper_call() and insn.is_call(call(14))
    pseudo = Insn(insn.CODE_CALL, 0, insn.BPF_PSEUDO_CALL, 0, 2)
    kfunc = Insn(insn.CODE_CALL, 0, insn.BPF_PSEUDO_KFUNC_CALL, 0, 777)
    assert pseudo.is_pseudo_call() and not pseudo.is_helper_call()
    assert kfunc.is_kfunc_call() and not kfunc.is_pseudo_call()
    assert insn.is_exit(EXIT) and not EXIT.is_call()


# --- analyze ----------------------------------------------------------------


def test_analyze_hand_built_program() -> None:
    prog = [
        call(14),  # 0
        *insn.ld_imm64(1, 7, insn.BPF_PSEUDO_MAP_FD),  # 1-2: map fd 7
        *insn.ld_imm64(2, (16 << 32) | 9, insn.BPF_PSEUDO_MAP_VALUE),  # 3-4: fd 9, +16
        *insn.ld_imm64(3, 0x1122334455667788),  # 5-6: plain constant
        # 7: high half 0x85 in slot 8 must not be read as a call
        *insn.ld_imm64(4, 0x85_0000_0085),
        Insn(insn.CODE_CALL, 0, insn.BPF_PSEUDO_CALL, 0, 3),  # 9 -> 13
        Insn(insn.CODE_CALL, 0, insn.BPF_PSEUDO_KFUNC_CALL, 0, 54321),  # 10
        call(130),  # 11
        call(14),  # 12 (again)
        MOV_R0_0,  # 13: subprogram
        Insn(insn.CODE_CALL, 0, insn.BPF_PSEUDO_CALL, 0, -14),  # 14 -> 1
        call(99999),  # 15
        EXIT,  # 16
    ]
    facts = insn.analyze(insn.encode(prog))
    assert facts.insn_count == 17
    assert facts.helper_calls == [
        (0, 14, "get_current_pid_tgid"),
        (11, 130, "ringbuf_output"),
        (12, 14, "get_current_pid_tgid"),
        (15, 99999, "helper#99999"),
    ]
    assert facts.helpers == ["get_current_pid_tgid", "helper#99999", "ringbuf_output"]
    assert facts.kfunc_calls == [(10, 54321)]
    assert facts.subprog_calls == [(9, 13), (14, 1)]
    assert facts.ld_imm64 == [
        (1, 1, 7),
        (3, 2, (16 << 32) | 9),
        (5, 0, 0x1122334455667788),
        (7, 0, 0x85_0000_0085),
    ]


def test_analyze_negative_imm64_is_unsigned() -> None:
    facts = insn.analyze(insn.encode([*insn.ld_imm64(0, -1), EXIT]))
    assert facts.ld_imm64 == [(0, 0, 0xFFFF_FFFF_FFFF_FFFF)]


def test_analyze_rejects_broken_ld_imm64() -> None:
    lone = insn.encode([MOV_R0_0, insn.ld_imm64(1, 5)[0]])
    with pytest.raises(ValueError, match="ld_imm64 at instruction 1 .*second half"):
        insn.analyze(lone)
    # The second slot must be a bare immediate (code 0), or the kernel refuses.
    bad_second = insn.encode([insn.ld_imm64(1, 5)[0], call(6), EXIT])
    with pytest.raises(ValueError, match="ld_imm64 at instruction 0"):
        insn.analyze(bad_second)
    # The disassembler still shows such input instead of failing.
    lines = insn.disasm(bad_second)
    assert lines[0].startswith("unknown opcode 0x18")
    assert lines[1:] == ["call 6 <trace_printk>", "exit"]


# --- disassembler -----------------------------------------------------------

KNOWN = [
    ("79 11 10 00 00000000", "r1 = *(u64 *)(r1 + 16)"),
    ("61 a2 f4 ff 00000000", "r2 = *(u32 *)(r10 - 12)"),
    ("7b 0a f8 ff 00000000", "*(u64 *)(r10 - 8) = r0"),
    ("62 0a fc ff 2a000000", "*(u32 *)(r10 - 4) = 42"),
    ("85 00 00 00 0e000000", "call 14 <get_current_pid_tgid>"),
    ("85 10 00 00 ffffffff", "call pc-1 <insn 0>"),
    ("85 20 00 00 39300000", "call kfunc btf_id:12345"),
    ("15 01 03 00 00000000", "if r1 == 0x0 goto +3"),
    ("5d 21 19 00 00000000", "if r1 != r2 goto +25"),
    ("a6 03 fe ff 10000000", "if w3 < 0x10 goto -2"),
    ("05 00 05 00 00000000", "goto +5"),
    ("95 00 00 00 00000000", "exit"),
    ("bf 12 00 00 00000000", "r2 = r1"),
    ("b4 01 00 00 01000000", "w1 = 1"),
    ("07 02 00 00 f4ffffff", "r2 += -12"),
    ("c7 01 00 00 18000000", "r1 s>>= 24"),
    ("87 03 00 00 00000000", "r3 = -r3"),
    ("dc 01 00 00 20000000", "r1 = be32 r1"),
    ("d4 01 00 00 10000000", "r1 = le16 r1"),
    ("db 10 00 00 00000000", "lock *(u64 *)(r0 + 0) += r1"),
    ("db 24 00 00 01000000", "r2 = atomic_fetch_add((u64 *)(r4 + 0), r2)"),
    ("c3 45 08 00 a0000000", "lock *(u32 *)(r5 + 8) ^= w4"),
    ("db 24 00 00 e1000000", "r2 = xchg_64(r4 + 0, r2)"),
    ("db 24 00 00 f1000000", "r0 = cmpxchg_64(r4 + 0, r0, r2)"),
    # cpu v4: decoded where the meaning is unambiguous
    ("bf 21 08 00 00000000", "r1 = (s8)r2"),
    ("3f 21 01 00 00000000", "r1 s/= r2"),
    ("d7 01 00 00 40000000", "r1 = bswap64 r1"),
    ("91 21 02 00 00000000", "r1 = *(s8 *)(r2 + 2)"),
    ("06 00 00 00 64000000", "gotol +100"),
]


@pytest.mark.parametrize(("hexbytes", "text"), KNOWN)
def test_disasm_known(hexbytes: str, text: str) -> None:
    assert insn.disasm(bytes.fromhex(hexbytes)) == [text]


def test_disasm_ld_imm64_and_unknown() -> None:
    data = insn.encode(
        [
            *insn.ld_imm64(0, 0),
            *insn.ld_imm64(1, 5, insn.BPF_PSEUDO_MAP_FD),
            *insn.ld_imm64(2, (8 << 32) | 5, insn.BPF_PSEUDO_MAP_VALUE),
            *insn.ld_imm64(3, -2),
            Insn(0xFF, 1, 2, 3, 4),  # no such opcode
            Insn(insn.BPF_ALU64 | insn.BPF_MOV | insn.BPF_X, 1, 2, 5, 0),  # bad movsx width
            EXIT,
        ]
    )
    assert insn.disasm_indexed(data) == [
        (0, "r0 = 0 ll"),
        (2, "r1 = map[fd:5] ll"),
        (4, "r2 = map[fd:5]+8 ll"),
        (6, "r3 = -2 ll"),
        (8, "unknown opcode 0xff (dst=r1 src=r2 off=3 imm=4)"),
        (9, "unknown opcode 0xbf (dst=r1 src=r2 off=5 imm=0)"),
        (10, "exit"),
    ]


def test_disasm_never_crashes_on_random_input() -> None:
    rng = random.Random(99)
    data = bytes(rng.randrange(256) for _ in range(8 * 2000))
    lines = insn.disasm(data)
    assert 1000 <= len(lines) <= 2000 and all(isinstance(s, str) and s for s in lines)


# --- helper table -------------------------------------------------------------


def test_helper_table_known_ids() -> None:
    expected = {
        1: "map_lookup_elem",
        6: "trace_printk",
        14: "get_current_pid_tgid",
        36: "probe_write_user",
        58: "override_return",
        109: "send_signal",
        117: "send_signal_thread",
        130: "ringbuf_output",
    }
    for hid, name in expected.items():
        assert helpers.HELPERS[hid] == name
        assert helpers.helper_name(hid) == name
        assert helpers.helper_id(name) == hid
        assert helpers.helper_id("bpf_" + name) == hid
    assert helpers.helper_name(4242) == "helper#4242"
    assert helpers.helper_id("no_such_helper") is None
    # dense from 1 to the highest id: no holes means no parse slipped
    assert set(helpers.HELPERS) == set(range(max(helpers.HELPERS) + 1))
    assert max(helpers.HELPERS) >= 211


def test_generator_parses_both_uapi_styles_and_libbpf() -> None:
    gen = _gen_module()
    old = (
        "/* FN(bogus) in a comment */\n"
        "#define __BPF_FUNC_MAPPER(FN)\t\\\n\tFN(unspec),\t\\\n"
        "\tFN(map_lookup_elem),\t\\\n\tFN(map_update_elem),\t\\\n\t/* */\n"
    )
    new = (
        "#define ___BPF_FUNC_MAPPER(FN, ctx...)\t\\\n"
        "\tFN(unspec, 0, ##ctx)\t\\\n\tFN(map_lookup_elem, 1, ##ctx)\t\\\n"
        "\tFN(cgrp_storage_delete, 211, ##ctx)\t\\\n"
        "\t/* This helper list is effectively frozen.\t\\\n\t */\n\n"
        "#define __BPF_FUNC_MAPPER_APPLY(name, value, FN) FN(name),\n"
        "#define __BPF_FUNC_MAPPER(FN) ___BPF_FUNC_MAPPER(__BPF_FUNC_MAPPER_APPLY, FN)\n"
    )
    assert gen.parse_uapi(old) == {0: "unspec", 1: "map_lookup_elem", 2: "map_update_elem"}
    assert gen.parse_uapi(new) == {0: "unspec", 1: "map_lookup_elem", 211: "cgrp_storage_delete"}
    libbpf = (
        "/* static long (*bpf_fake)(void) = (void *) 3; */\n"
        "static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *) 1;\n"
        "static long (* const bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size,\n"
        "\t\t__u64 flags) = (void *) 130;\n"
    )
    assert gen.parse_libbpf(libbpf) == {1: "map_lookup_elem", 130: "ringbuf_output"}
    merged = gen.merge(gen.parse_uapi(old), gen.parse_libbpf(libbpf))
    assert merged == {
        0: "unspec",
        1: "map_lookup_elem",
        2: "map_update_elem",
        130: "ringbuf_output",
    }
    with pytest.raises(gen.GenError, match="disagree on helper id 1"):
        gen.merge({1: "map_lookup_elem"}, {1: "something_else"})
    with pytest.raises(gen.GenError, match="two ids"):
        gen.merge({1: "map_lookup_elem"}, {2: "map_lookup_elem"})
    with pytest.raises(gen.GenError, match="no __BPF_FUNC_MAPPER"):
        gen.parse_uapi("int x;\n")


def test_helpers_py_matches_headers(tmp_path: Path) -> None:
    gen = _gen_module()
    for path in (gen.DEFAULT_UAPI, gen.DEFAULT_LIBBPF):
        if not os.path.exists(path):
            skip_or_fail(f"{path} missing (install linux-libc-dev and libbpf-dev)")
    out = tmp_path / "helpers.py"
    r = subprocess.run(
        [sys.executable, str(GEN), "-o", str(out)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    committed = (ROOT / "bpf" / "helpers.py").read_text()
    assert out.read_text() == committed, (
        "bpf/helpers.py is out of date with the headers: run python3 tools/gen_helpers.py"
    )
    assert "GENERATED FILE" in committed and "python3 tools/gen_helpers.py" in committed


# --- a real clang-built object ---------------------------------------------------

PROG_SRC = r"""
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096);
} events SEC(".maps");

SEC("tracepoint/syscalls/sys_enter_getpid")
int on_getpid(void *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    bpf_ringbuf_output(&events, &id, sizeof(id), 0);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
"""


def test_clang_built_program(tmp_path: Path) -> None:
    from elftools.elf.elffile import ELFFile

    obj = compile_bpf(PROG_SRC, tmp_path, "tiny")
    with obj.open("rb") as f:
        sec = ELFFile(f).get_section_by_name("tracepoint/syscalls/sys_enter_getpid")
        assert sec is not None
        data = sec.data()
    facts = insn.analyze(data)
    assert facts.insn_count == len(data) // 8
    assert facts.helpers == ["get_current_pid_tgid", "ringbuf_output"]
    assert [h[1] for h in facts.helper_calls] == [14, 130]
    assert facts.kfunc_calls == [] and facts.subprog_calls == []
    # &events is an ld_imm64 (src 0 until the loader patches in the map fd)
    assert len(facts.ld_imm64) == 1
    lines = insn.disasm(data)
    assert "call 14 <get_current_pid_tgid>" in lines
    assert "call 130 <ringbuf_output>" in lines
    assert lines[-1] == "exit"
    assert not [line for line in lines if line.startswith("unknown")]
