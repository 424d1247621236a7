"""USDT offline: argument syntax, the spec layout usdt.bpf.h reads, note parsing."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gfxbpf.bpf.link import usdt
from gfxbpf.bpf.link.usdt import ARG_CONST, ARG_REG, ARG_REG_DEREF, ArgSpec, UsdtError

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"


@pytest.mark.parametrize(
    "text, spec",
    [
        ("-4@%edi", ArgSpec(0, ARG_REG, 112, True, 32)),
        ("8@%rax", ArgSpec(0, ARG_REG, 80, False, 0)),
        ("1@%sil", ArgSpec(0, ARG_REG, 104, False, 56)),
        ("2@%r9w", ArgSpec(0, ARG_REG, 64, False, 48)),
        ("-8@-16(%rbp)", ArgSpec(2**64 - 16, ARG_REG_DEREF, 32, True, 0)),
        ("4@(%rdx)", ArgSpec(0, ARG_REG_DEREF, 96, False, 32)),
        ("4@0x10(%r15)", ArgSpec(16, ARG_REG_DEREF, 0, False, 32)),
        ("4@$5", ArgSpec(5, ARG_CONST, 0, False, 32)),
        ("-4@$-7", ArgSpec(2**64 - 7, ARG_CONST, 0, True, 32)),
    ],
)
def test_x86_argument_syntax(text: str, spec: ArgSpec) -> None:
    assert usdt.parse_arg(text) == spec


@pytest.mark.parametrize(
    "text, why",
    [
        ("8@8(%rax,%rbx,4)", "unsupported syntax"),
        ("3@%eax", "size 3"),
        ("8@%xmm0", "unknown register"),
        ("%eax", "unsupported syntax"),
    ],
)
def test_bad_arguments(text: str, why: str) -> None:
    with pytest.raises(UsdtError, match=why):
        usdt.parse_arg(text)


def test_spec_layout_matches_usdt_bpf_h() -> None:
    args = [usdt.parse_arg("-4@%edi"), usdt.parse_arg("8@-16(%rbp)")]
    raw = usdt.encode_spec(args, cookie=0x1122)
    assert len(raw) == usdt.SPEC_SIZE == 208
    # args[i]: u64 val_off, u32 arg_type, s16 reg_off, bool arg_signed, s8 arg_bitshift
    assert struct.unpack_from("<QIh?b", raw, 0) == (0, ARG_REG, 112, True, 32)
    assert struct.unpack_from("<QIh?b", raw, 16) == (2**64 - 16, ARG_REG_DEREF, 32, False, 0)
    assert struct.unpack_from("<Qh", raw, 192) == (0x1122, 2)  # usdt_cookie, arg_cnt


def test_notes_of_a_built_program(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None or not Path("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists():
        pytest.skip("needs cc and <sys/sdt.h> (systemtap-sdt-dev)")
    out = tmp_path / "t"
    subprocess.run([cc, "-O1", "-o", str(out), str(SOURCES / "usdt_target.c")], check=True)
    probes = {p.name: p for p in usdt.read_probes(str(out))}
    assert set(probes) == {"tick", "gated"}
    assert {p.provider for p in probes.values()} == {"gfxtest"}
    assert len(usdt.parse_args(probes["tick"].args)) == 2
    data = out.read_bytes()
    for p in probes.values():
        assert data[p.file_offset] == 0x90  # the uprobe offset is the probe's nop
        # Each semaphore: a distinct u16 in the file, 0 until a tracer raises it.
        assert p.semaphore and data[p.semaphore_offset : p.semaphore_offset + 2] == b"\0\0"
    assert probes["tick"].semaphore_offset != probes["gated"].semaphore_offset
