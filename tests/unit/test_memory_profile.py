"""`gfxclient profile --memory` offline: the flags, the memory table and its
cookies, memstacks' rows as stacks, the knob the broker writes, and the
sample types of the files (the kernel half: tests/kernel/test_memory_profile.py)."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.request.params import MAX_SAMPLE_BYTES, _check_sample_bytes
from gfxbpf.catalog import entries as cat
from gfxbpf.catalog import memory_api
from gfxbpf.catalog.function_tables import ROLES, cookie
from gfxbpf.catalog.instance import Params, prepare
from gfxbpf.client.cli import profile_cmd
from gfxbpf.client.cli.gfxclient import parse_args
from gfxbpf.client.errors import UsageError
from gfxbpf.client.profiles.engine import request as engine_request
from gfxbpf.client.profiles.memory import library, stacks
from gfxbpf.client.profiles.model import Profile
from gfxbpf.client.profiles.pprof import pprof_message
from gfxbpf.client.profiles.speedscope import speedscope_document


def _req(*argv: str) -> profile_cmd.Request:
    return profile_cmd.parse_request(parse_args(["profile", *argv]))


def test_memory_flags_make_a_memory_request() -> None:
    r = _req("--memory", "--", "./prog")
    assert r.mode == engine_request.MEMORY and not r.live and not r.cuda and not r.timed
    assert r.weight == "bytes" and r.functions == [f.name for f in memory_api.FUNCTIONS]
    live = _req("--memory-live", "--cuda", "--sample-bytes", "65536", "--pid", "7")
    assert live.live and live.cuda and live.sample_bytes == 65536 and live.pids == [7]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--memory", "--off-cpu", "--pid", "1"], "--off-cpu"),
        (["--memory", "--stacks-at", "/l.so:f", "--pid", "1"], "--stacks-at"),
        (["--memory", "--frequency", "99", "--pid", "1"], "--frequency"),
        (["--memory", "--pid", "1", "--pid", "2"], "one process"),
        (["--memory", "--scope", "system", "--pid", "1"], "scope self"),
        (["--cuda", "--pid", "1"], "--cuda goes with --memory"),
        (["--sample-bytes", "4096", "--pid", "1"], "--sample-bytes goes with"),
    ],
)
def test_memory_conflicts_are_refused_before_connecting(argv: list[str], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        _req(*argv)


@pytest.mark.parametrize("text", ["0", "-1", "x", str(MAX_SAMPLE_BYTES + 1)])
def test_sample_bytes_must_be_a_byte_count(text: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["profile", "--memory", "--sample-bytes", text, "--pid", "1"])


def test_table_cookies_carry_role_argument_and_space() -> None:
    i = [f.name for f in memory_api.FUNCTIONS].index("cuMemCreate")
    fn = memory_api.FUNCTIONS[i]
    c = cookie(i, fn)
    assert (c & 0xFF, c >> 8 & 0xFF, c >> 16 & 0xFF, c >> 24) == (i, ROLES["alloc"], 1, 2)
    assert memory_api.is_device(i) and not memory_api.is_device(0)
    assert "cuMemMap" not in {f.name for f in memory_api.FUNCTIONS}  # cuMemCreate counts it
    assert set(memory_api.allocators(device=False)) >= {"malloc", "calloc", "mmap"}
    assert cat.function_table("memory") is memory_api.FUNCTIONS


def test_the_sampling_knob_lands_in_rodata_and_the_broker_bounds_it() -> None:
    entry = cat.load_catalog().get("memstacks")
    assert entry.scopes == ("self",) and not entry.map("blocks").visible
    spec, _ = prepare(entry, (entry.directory / entry.object).read_bytes(),
                      Params(uid=1000, sample_bytes=524288))  # fmt: skip
    assert spec.get_variable("sample_bytes") == 524288
    res: Any = SimpleNamespace(entry=entry)
    assert _check_sample_bytes(res, 0) is None and _check_sample_bytes(res, 4096) == 4096
    with pytest.raises(BrokerError, match="above"):
        _check_sample_bytes(res, MAX_SAMPLE_BYTES + 1)
    offcpu: Any = SimpleNamespace(entry=cat.load_catalog().get("offcpu"))
    with pytest.raises(BrokerError, match="takes no sample_bytes"):
        _check_sample_bytes(offcpu, 4096)


class _Reader:
    """The ProbeCopyReader calls memory_stacks makes."""

    def __init__(self) -> None:
        self.python = SimpleNamespace(resolve=lambda final: None)
        self.rows: list[tuple[Any, str, int]] = []

    def row_stack(self, row: Any, leaf: str, weight: int) -> Any:
        self.rows.append((row, leaf, weight))
        return weight


def _row(function: int, allocs: int, nbytes: int, live: int) -> tuple[bytes, bytes]:
    key = stacks.MEM_KEY.pack(42, function, 0x401000 + function, 0, 0x5EED | function)
    return key, stacks.MEM_ROW.pack(allocs, nbytes, live, allocs - 1, 0)


def test_rows_weigh_bytes_allocated_or_still_held() -> None:
    rows = [_row(0, 1000, 10**8, 10**8), _row(1, 3000, 3 * 10**8, 0)]
    reader: Any = _Reader()
    assert stacks.memory_stacks(reader, rows, live=False) == [10**8, 3 * 10**8]
    assert [leaf for _, leaf, _ in reader.rows] == ["malloc", "calloc"]
    # the row the copies name: with its path hash, as ustackcopy's rows
    assert [row[4] for row, _, _ in reader.rows] == [0x5EED, 0x5EED | 1]
    reader = _Reader()
    assert stacks.memory_stacks(reader, rows, live=True) == [10**8]  # nothing held: no stack
    assert stacks.totals(rows) == {
        "allocations": 4000, "bytes": 4 * 10**8, "live_bytes": 10**8, "frees": 3998,
        "untracked": 0,
    }  # fmt: skip


def test_a_row_of_another_size_is_an_error_not_a_guess() -> None:
    from gfxbpf.client.errors import ProtocolError

    with pytest.raises(ProtocolError, match="sites"):
        reader: Any = _Reader()
        stacks.memory_stacks(reader, [(b"\0" * 24, struct.pack("<QQ", 1, 2))], live=False)


@pytest.mark.parametrize(
    ("path", "libc"),
    [
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", True),
        ("/lib64/libc-2.31.so", True),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", False),
        ("/usr/lib/x86_64-linux-gnu/libcap.so.2", False),
        ("/opt/x/libc.so.6.bak", False),
    ],
)
def test_the_c_library_is_found_by_its_name(path: str, libc: bool) -> None:
    assert library.is_libc(path) is libc


def test_files_say_bytes_with_go_heap_sample_types() -> None:
    prof = Profile(stacks={("main", "keep", "malloc"): 10**8}, unit="bytes")
    msg = pprof_message(prof)
    types = [(prof_string(msg, t.type), prof_string(msg, t.unit)) for t in msg.sample_type]
    assert types == [("alloc_space", "bytes")]
    prof.space_kind = "inuse_space"
    msg = pprof_message(prof)
    assert [prof_string(msg, t.type) for t in msg.sample_type] == ["inuse_space"]
    assert speedscope_document(prof)["profiles"][0]["unit"] == "bytes"


def prof_string(msg: Any, i: int) -> str:
    return str(msg.string_table[i])


def test_an_empty_memory_profile_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    profile_cmd._say_empty(_req("--memory-live", "--pid", "1"))
    assert "no bytes were held at the end" in capsys.readouterr().err
    profile_cmd._say_empty(_req("--memory", "--cuda", "--pid", "1"))
    assert "nothing through its libcuda" in capsys.readouterr().err


def test_device_notes_say_what_the_caching_allocator_does() -> None:
    notes = stacks.notes("/x/libcuda.so.1", live=True, cuda=True, sample_bytes=4096)
    assert "still held" in notes[0] and any("caching allocator" in n for n in notes)
    assert any("sampled" in n for n in notes)
    assert not any("caching" in n for n in stacks.notes("/libc.so.6", live=False, cuda=False))
    held = stacks.notes("/libc.so.6", live=True, cuda=False, untracked=5)
    assert any("5 allocations were left out" in n for n in held)
