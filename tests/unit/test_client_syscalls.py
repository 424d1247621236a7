"""client/syscalls.py: generated from asm/unistd_64.h, and must not drift from it.

Each Debian release's header knows a different set of syscalls (Debian 13's
know newer ones), so the committed table is the union over releases: it must
agree with the host's header on every syscall both know, and what the header
adds is reported (run tools/gen_syscalls.py to merge it), not failed."""

from __future__ import annotations

import importlib.util
import os
import warnings
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


def test_committed_table_agrees_with_the_header() -> None:
    if not os.path.exists(HEADER):
        skip_or_fail(f"{HEADER} is missing (install linux-libc-dev)")
    gen = _gen()
    header = gen.read_header(HEADER)  # type: ignore[attr-defined]
    shared = SYSCALLS.keys() & header.keys()
    differ = {nr: (SYSCALLS[nr], header[nr]) for nr in shared if SYSCALLS[nr] != header[nr]}
    assert not differ, f"table vs {HEADER}: {differ}"
    assert len(shared) > 300  # the tables overlap: the same ABI, not two unrelated files
    added = sorted(header.keys() - SYSCALLS.keys())
    if added:
        names = ", ".join(f"{nr} {header[nr]}" for nr in added)
        warnings.warn(
            f"{HEADER} knows syscalls client/syscalls.py lacks ({names}): "
            "run python3 tools/gen_syscalls.py to add them",
            stacklevel=1,
        )


def test_committed_file_is_the_generators_output() -> None:
    gen = _gen()
    committed = (ROOT / "client" / "syscalls.py").read_text()
    table = gen.parse_table(committed)  # type: ignore[attr-defined]
    assert table == SYSCALLS
    rendered = gen.render(table)  # type: ignore[attr-defined]
    assert committed == rendered, "client/syscalls.py was edited by hand: run tools/gen_syscalls.py"


def test_merge_keeps_newer_syscalls_and_refuses_renames() -> None:
    gen = _gen()
    merged = gen.merge({0: "read", 451: "cachestat"}, {0: "read", 1: "write"})  # type: ignore[attr-defined]
    assert merged == {0: "read", 1: "write", 451: "cachestat"}
    with pytest.raises(gen.GenError, match="syscall 0 is read"):  # type: ignore[attr-defined]
        gen.merge({0: "read"}, {0: "write"})  # type: ignore[attr-defined]


def test_older_header_checks_against_the_merged_table(tmp_path: Path) -> None:
    # A header that lacks the newest syscalls (an older release's) leaves the
    # committed table as it is: --check passes, nothing is dropped.
    out = tmp_path / "syscalls.py"
    out.write_text((ROOT / "client" / "syscalls.py").read_text())
    newest = max(SYSCALLS)
    older = "".join(f"#define __NR_{n} {nr}\n" for nr, n in SYSCALLS.items() if nr != newest)
    (tmp_path / "unistd_64.h").write_text(older)
    gen = _gen()
    assert gen.main(["--header", str(tmp_path / "unistd_64.h"), "-o", str(out), "--check"]) == 0  # type: ignore[attr-defined]
