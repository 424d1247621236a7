"""client/syscalls.py: generated from asm/unistd_64.h, and must not drift from it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from gfxbpf.client.syscalls import SYSCALLS, syscall_name
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
HEADER = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"


def _gen() -> object:
    spec = importlib.util.spec_from_file_location(
        "gen_syscalls", ROOT / "tools" / "gen_syscalls.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_well_known_numbers() -> None:
    assert syscall_name(0) == "read"
    assert syscall_name(1) == "write"
    assert syscall_name(39) == "getpid"
    assert syscall_name(59) == "execve"
    assert syscall_name(110) == "getppid"
    assert syscall_name(321) == "bpf"
    assert syscall_name(0xFFFFFFFF) == "invalid"
    assert syscall_name(100000) == "syscall_100000"
    assert len(SYSCALLS) > 300


def test_parser_on_a_snippet() -> None:
    gen = _gen()
    table = gen.parse_header("#define __NR_read 0\n#define __NR_write 1\n#define X 3\n")  # type: ignore[attr-defined]
    assert table == {0: "read", 1: "write"}
    with pytest.raises(gen.GenError):  # type: ignore[attr-defined]
        gen.parse_header("nothing here")  # type: ignore[attr-defined]
    with pytest.raises(gen.GenError):  # type: ignore[attr-defined]
        gen.parse_header("#define __NR_a 1\n#define __NR_b 1\n")  # type: ignore[attr-defined]


def test_committed_table_matches_the_header() -> None:
    if not os.path.exists(HEADER):
        skip_or_fail(f"{HEADER} is missing (install linux-libc-dev)")
    gen = _gen()
    expected = gen.generate(HEADER)  # type: ignore[attr-defined]
    committed = (ROOT / "client" / "syscalls.py").read_text()
    assert committed == expected, "client/syscalls.py is stale: run python3 tools/gen_syscalls.py"
