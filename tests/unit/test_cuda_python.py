"""`gfxclient watch cuda --by-python`: ustackcopy rows grouped per innermost
Python function, the table and the --json line (no broker: rows and chains
as the copy reader gives them)."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from bench import cuda_standin as cs
from gfxbpf.catalog import cuda_api
from gfxbpf.client.cli import cuda_python as cp
from gfxbpf.client.cli.gfxclient import build_parser
from gfxbpf.client.errors import BrokerError
from gfxbpf.client.profiles.copies import CALL_KEY, CALL_STATS, NOT_COPIED, ProbeCopyReader
from gfxbpf.client.profiles.engine.live import LiveProfile
from gfxbpf.client.profiles.engine.request import ProfileRequest
from gfxbpf.client.profiles.engine.run import Run
from gfxbpf.client.profiles.engine.snapshots import Maps
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.python import records as py
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.unwind import UnwindTables
from gfxbpf.proto import gfxbpf_pb2 as pb

FUNCS = ["cuLaunchKernel", "cuLaunchKernelEx"]
A = ("<module> (t.py:9)", "caller_a (t.py:3)")
B = ("<module> (t.py:10)", "caller_b (t.py:6)")
B2 = ("<module> (t.py:11)", "caller_b (t.py:6)")  # the same function from elsewhere


def _stack(chain: tuple[str, ...], leaf: str, weight: int) -> RawStack:
    """A row as the engine's live profile gives it: Python runs innermost first."""
    return RawStack(
        pid=100,
        user=(0x1000,),
        kernel=False,
        weight=weight,
        leaf=leaf,
        python=(chain,) if chain else (),
    )


# (root-first chain, launch function, calls, ns) of each row of ustackcopy's calls
ROWS = [
    (A, "cuLaunchKernel", 1000, 2_000_000),
    (B, "cuLaunchKernel", 2000, 2_000_000),
    (B, "cuLaunchKernelEx", 500, 1_000_000),
    (B2, "cuLaunchKernel", 500, 0),  # caller_b from another <module> line
    ((), "cuLaunchKernel", 7, 70_000),  # no Python frame
    ((NOT_COPIED,), "cuLaunchKernel", 3, 0),  # a chain whose copy was not read
]


def _grouped() -> list[cp.Group]:
    calls = [_stack(c, f, n) for c, f, n, _ in ROWS]
    times = [_stack(c, f, ns) for c, f, _, ns in ROWS]
    return cp.group_stacks(calls, times)


def _groups() -> dict[str, cp.Group]:
    return {g.function: g for g in _grouped()}


def test_rows_sum_per_innermost_frame_with_their_chains() -> None:
    groups = _grouped()
    assert [(g.function, g.calls) for g in groups] == [
        ("caller_b (t.py:6)", 3000),
        ("caller_a (t.py:3)", 1000),
        (cp.NO_PYTHON, 7),
        (NOT_COPIED, 3),
    ]
    b = groups[0]
    assert b.by_launch == {"cuLaunchKernel": 2500, "cuLaunchKernelEx": 500}
    assert b.chains == {B: 2500, B2: 500}
    assert b.time_ns == 3_000_000


def test_json_has_counts_and_each_chain_root_first() -> None:
    doc = _groups()["caller_b (t.py:6)"].as_json(12.5)
    assert doc == {
        "pid": 100,
        "function": "caller_b (t.py:6)",
        "launches": 3000,
        "launches_per_s": 12.5,
        "time_ns": 3_000_000,
        "by_launch_function": {"cuLaunchKernel": 2500, "cuLaunchKernelEx": 500},
        "chains": [
            {"chain": list(B), "launches": 2500},
            {"chain": list(B2), "launches": 500},
        ],
    }


def test_table_lines_show_counts_rates_means_and_what_was_left_out() -> None:
    groups = _grouped()
    lines = cp.table_lines(groups, {(100, "caller_a (t.py:3)"): 250.0}, limit=2)
    assert "python function" in lines[0]
    assert lines[1].split() == ["100", "3000", "1.0µs", "caller_b", "(t.py:6)"]
    assert lines[2].split() == ["100", "1000", "250", "2.0µs", "caller_a", "(t.py:3)"]
    assert lines[3] == "  … 2 more functions with 10 launches"
    assert cp.table_lines([], {}, None) == ["  (no launches seen yet)"]


def test_the_row_hash_is_the_chain_hash_of_the_reader() -> None:
    """The reader keys chains by chain_hash, as ustackcopy keys its rows."""
    frames = ((0x7F00, 44, 1 << py.TAG_SHIFT), (0x7F80, 12, py.FRAME_ENTRY))
    h = py.chain_hash(frames)
    assert h & 1 and h == py.chain_hash(frames + ((0, 0, py.FRAME_CUT),))
    assert py.chain_hash(()) == 0


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["watch", "cuda", *argv])


def test_by_python_is_a_watch_flag_and_needs_cuda_and_a_pid() -> None:
    assert _args("--by-python", "--pid", "5").by_python
    with pytest.raises(cp.UsageError, match="needs --pid"):
        cp.attach(None, _args("--by-python"))  # type: ignore[arg-type]
    with pytest.raises(cp.UsageError, match="scope self"):
        cp.attach(None, _args("--by-python", "--pid", "5", "--scope", "system"))  # type: ignore[arg-type]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the stand-in")
def test_launch_functions_are_those_the_library_defines(tmp_path: Path) -> None:
    launches = [cuda_api.FUNCTIONS[i].name for i in cuda_api.by_role("launch")]
    new = cs.build_library(tmp_path / "new")
    assert cp.launch_functions(str(new)) == launches
    old = cs.build_library(tmp_path / "old", old_driver=True)
    assert cp.launch_functions(str(old)) == [n for n in launches if n not in cs.OLD_DRIVER_LACKS]
    with pytest.raises(cp.UsageError, match="defines none"):
        cp.launch_functions(str(tmp_path / "missing.so"))


class _Refusing:
    def attach(self, name: str, **kw: Any) -> Any:
        # as the policy refuses: its rule named (decide() always gives one)
        raise BrokerError(pb.ERROR_PERMISSION_DENIED, f"no rule grants {name}", "default deny")

    def close(self) -> None:
        pass


def _request(pids: list[int]) -> ProfileRequest:
    return ProfileRequest(
        pids=pids, command=[], library="/x/libcuda.so.1", functions=FUNCS, scope="self"
    )


def test_a_refused_grant_names_the_program_and_library_to_ask_for() -> None:
    with pytest.raises(BrokerError) as e:
        cp._open(_Refusing(), _request([os.getpid()]))  # type: ignore[arg-type]
    text = str(e.value)
    assert "needs program ustackcopy on /x/libcuda.so.1" in text
    assert "ask the administrator" in text and "broker: no rule grants" in text
    assert e.value.exit_code == 3


class _Codes:
    """Names frames as the code book does: by code address and instruction."""

    def name(self, tgid: int, frame: py.Frame) -> str:
        return {0xA0: "<module> (t.py:9)", 0xB0: f"caller_a (t.py:{frame[1]})"}[frame[0]]

    def first_line(self, tgid: int, frame: py.Frame) -> int:
        return 1

    def want(self, tgid: int, frames: Any) -> None:
        pass

    def resolve(self, final: bool = False) -> None:
        pass


class _Stream:
    def poll_raw(self, timeout: float = 0.0) -> list[bytes]:
        return []


class _Map:
    def __init__(self, rows: list[tuple[bytes, bytes]]) -> None:
        self.rows = rows

    def raw_items(self) -> list[tuple[bytes, bytes]]:
        return self.rows


class _Att:
    id = 7
    program = "ustackcopy"
    maps = {"calls": None, "lost": None}
    reply = pb.AttachReply()  # since_ns 0: every row

    def __init__(self, rows: list[tuple[bytes, bytes]]) -> None:
        self.calls = _Map(rows)
        # ustackcopy's lost: [0] copies the ring dropped, [1] calls not counted
        u32, u64 = struct.Struct("<I"), struct.Struct("<Q")
        self.lost = _Map([(u32.pack(0), u64.pack(5)), (u32.pack(1), u64.pack(2))])

    def map(self, name: str) -> _Map:
        return {"calls": self.calls, "lost": self.lost}[name]


def _live(att: _Att, chains: dict[tuple[int, int], tuple[py.Frame, ...]]) -> LiveProfile:
    """The engine's live profile over a fake attachment, with the real copy
    reader (no copy read: the rows' chains known by hash, as a copy whose
    native walk failed leaves them)."""
    symbolizer = Symbolizer()
    run = Run(_request([]), att, Maps(symbolizer), None)  # type: ignore[arg-type]
    reader = ProbeCopyReader(_Stream(), lambda _pid, _refresh: None, UnwindTables(), _Codes())  # type: ignore[arg-type]
    reader.chains = chains
    run.copies = reader
    return LiveProfile(_Refusing(), run, symbolizer)  # type: ignore[arg-type]


def test_the_view_names_rows_from_the_readers_chains_root_first() -> None:
    inner_first = ((0xB0, 3, 0), (0xA0, 40, py.FRAME_ENTRY))
    h = py.chain_hash(inner_first)
    rows = [(CALL_KEY.pack(100, 0, 0x1000, h, 0, 1), CALL_STATS.pack(1000, 4_000_000))]
    rows.append((CALL_KEY.pack(100, 1, 0x1000, h + 2, 0, 1), CALL_STATS.pack(4, 8_000)))
    att = _Att(rows)
    att.lost.rows = []
    view = cp.PythonLaunches(_live(att, {(100, h): inner_first}), "/x/libcuda.so.1", FUNCS, 1.0)
    att.lost.rows = _Att([]).lost.rows
    view.sample()
    att.calls.rows[0] = (rows[0][0], CALL_STATS.pack(1500, 6_000_000))
    view.sample()
    doc = view.json_line()
    assert doc["launches"] == 1504 and doc["library"] == "/x/libcuda.so.1"
    assert doc["lost"] == 2 and doc["interval"] > 0  # calls not counted, not copies
    g, uncopied = doc["python_functions"]
    assert g["function"] == "caller_a (t.py:3)" and g["launches"] == 1500
    assert g["chains"] == [{"chain": ["<module> (t.py:9)", "caller_a (t.py:3)"], "launches": 1500}]
    assert g["launches_per_s"] > 0  # 500 launches since the last sample
    assert g["by_launch_function"] == {"cuLaunchKernel": 1500}
    # A chain hash no copy named: its launches counted, under the marker
    assert uncopied["function"] == NOT_COPIED and uncopied["launches"] == 4
    assert uncopied["by_launch_function"] == {"cuLaunchKernelEx": 4}
    text = view.frame(120, None, None)
    assert text[1].startswith("1504 launches by innermost Python function (2 launch functions")
    assert text[-3].split()[-2:] == ["caller_a", "(t.py:3)"]
    assert text[-1] == "note: 2 launches not counted: the broker's table was full"


def test_a_warm_instance_shows_only_the_rows_of_this_attachment() -> None:
    # The broker keeps a ustackcopy instance warm for the same user's next
    # profile: its frozen calls table still holds the earlier profile's rows
    # (another start in the key), and its lost counter its counts.
    inner_first = ((0xB0, 3, 0), (0xA0, 40, py.FRAME_ENTRY))
    h = py.chain_hash(inner_first)
    old = (CALL_KEY.pack(100, 0, 0x1000, h, 0, 1), CALL_STATS.pack(1000, 4_000_000))
    mine = CALL_KEY.pack(100, 0, 0x1000, h, 0, 2)  # the same row, this attachment's
    att = _Att([old, (mine, CALL_STATS.pack(3, 9_000))])  # 3 calls before the client looked
    att.reply = pb.AttachReply(since_ns=2)
    view = cp.PythonLaunches(_live(att, {(100, h): inner_first}), "/x/libcuda.so.1", FUNCS, 1.0)
    att.calls.rows = [old, (mine, CALL_STATS.pack(10, 30_000))]
    u32, u64 = struct.Struct("<I"), struct.Struct("<Q")
    att.lost.rows = [(u32.pack(0), u64.pack(5)), (u32.pack(1), u64.pack(6))]
    view.sample()
    doc = view.json_line()
    assert doc["launches"] == 10 and doc["lost"] == 4
    [g] = doc["python_functions"]
    assert g["launches"] == 10 and g["time_ns"] == 30_000
