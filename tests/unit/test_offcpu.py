"""Off-CPU profiles without a kernel: the broker's minimum-wait rule (policy
floor, default), offcpu records weighed and named in the client, the flags'
combinations, and the formats' time types. The kernel half is
tests/kernel/test_offcpu.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Caller
from gfxbpf.broker.policy.rules import Policy, PolicyError
from gfxbpf.broker.request.params import check_params
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog import entries as cat
from gfxbpf.catalog.instance import Params, prepare
from gfxbpf.client.cli import profile_cmd
from gfxbpf.client.cli.gfxclient import parse_args
from gfxbpf.client.errors import UsageError
from gfxbpf.client.profiles import copies
from gfxbpf.client.profiles.engine import request as engine_request
from gfxbpf.client.profiles.flamegraph import flamegraph_svg
from gfxbpf.client.profiles.model import Profile
from gfxbpf.client.profiles.pprof import pprof_message
from gfxbpf.proto import gfxbpf_pb2 as pb
from tests.event_stream import Records

SHA = "a" * 64
CALLER = Caller(uid=1000, gid=1000, gids=(1000,), pid=0, transport="grpc")
FUTEX, CLOCK_NANOSLEEP, READ = 202, 230, 0


def _min_block(extra: str, asked: int = 0, name: str = "offcpu") -> int | None:
    policy = Policy.parse(
        f'[[program]]\nname = "{name}"\nsha256 = "{SHA}"\nusers = ["*"]\n{extra}',
        path="policy.toml",
    )
    entry = cat.load_catalog().get(name)
    res = Resolved(b"", SHA, entry, policy.programs[0], "self", "r", name)
    params = pb.AttachParams(min_block_us=asked)
    return check_params(policy, CALLER, res, params).min_block_us


def test_the_minimum_wait_defaults_to_1_ms_and_the_policy_sets_the_floor() -> None:
    assert _min_block("") == 1000
    assert _min_block("", asked=250) == 250  # above the broker's own 100 us floor
    assert _min_block("min_block_us = 5000\n") == 5000  # the default rises to the floor
    assert _min_block("min_block_us = 5000\n", asked=20000) == 20000
    assert _min_block("", name="stackcopy") is None  # no such knob


@pytest.mark.parametrize("extra, asked", [("", 50), ("min_block_us = 5000\n", 4999)])
def test_a_wait_below_the_floor_is_refused(extra: str, asked: int) -> None:
    with pytest.raises(BrokerError) as e:
        _min_block(extra, asked)
    assert e.value.code == pb.ERROR_PERMISSION_DENIED and "below" in str(e.value)


def test_a_program_that_records_no_waits_takes_no_minimum() -> None:
    with pytest.raises(BrokerError) as e:
        _min_block("", asked=1000, name="stackcopy")
    assert e.value.code == pb.ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("bad", ["0", "-1", '"1ms"', "10000001", "true"])
def test_policy_refuses_bad_min_block_us(bad: str) -> None:
    with pytest.raises(PolicyError, match="min_block_us"):
        Policy.parse(
            f'[[program]]\nname = "offcpu"\nsha256 = "{SHA}"\nmin_block_us = {bad}\n',
            path="policy.toml",
        )


def test_the_knob_lands_in_rodata() -> None:
    entry = cat.load_catalog().get("offcpu")
    data = (entry.directory / entry.object).read_bytes()
    spec, _ = prepare(entry, data, Params(uid=1000, min_block_us=2500))
    assert spec.get_variable("min_block_us") == 2500


def test_offcpu_is_offered_in_scope_self_only_with_the_callers_filters() -> None:
    entry = cat.load_catalog().get("offcpu")
    assert entry.scopes == ("self",) and entry.uid_knob and entry.pid_knob
    assert entry.tree_map == "tree" and not entry.map("tree").visible
    assert not entry.map("blocked").visible  # the stashes never reach a client
    assert entry.map("stack_copies").event_type == "ustack_rec"


@pytest.mark.parametrize(
    "flags, nr, frame",
    [
        (copies.FLAG_SYSCALL, FUTEX, "[wait: futex]"),
        (copies.FLAG_SYSCALL, CLOCK_NANOSLEEP, "[wait: clock_nanosleep]"),
        (copies.FLAG_SYSCALL | copies.FLAG_IO, READ, "[wait: read, uninterruptible]"),
        (copies.FLAG_IO, 0, "[wait: page fault, uninterruptible]"),
        (copies.FLAG_RUNNABLE | copies.FLAG_SYSCALL, READ, "[preempted]"),
        (copies.FLAG_SYSCALL, 99999, "[wait: syscall 99999]"),
    ],
)
def test_wait_frames_name_the_system_call_and_the_state(flags: int, nr: int, frame: str) -> None:
    assert copies.wait_frame(flags, nr) == frame


def _rec(tid: int, flags: int, elapsed: int, nr: int = 0, comm: bytes = b"app") -> bytes:
    return copies.HEADER.pack(7, tid, flags, 0, 0, 0, 0, 0, elapsed, nr, 0, comm)


def test_waits_are_weighed_by_their_time_and_counted_per_state() -> None:
    recs = [
        _rec(7, copies.FLAG_SYSCALL, 1_000_000_000, CLOCK_NANOSLEEP),
        _rec(8, copies.FLAG_SYSCALL, 2_000_000_000, FUTEX),
        _rec(7, copies.FLAG_RUNNABLE, 5_000_000),
        _rec(8, copies.FLAG_SYSCALL, 500_000_000, FUTEX),
    ]
    reader = copies.CopyReader(Records(recs), lambda pid, refresh: None, None, waits=True)  # type: ignore[arg-type]
    assert reader.drain() == 4
    got = {s.leaf: s.weight for s in reader.raw_stacks()}
    assert got == {
        "[wait: clock_nanosleep]": 1_000_000_000,
        "[wait: futex]": 2_500_000_000,
        "[preempted]": 5_000_000,
    }
    assert reader.by_state == {
        "sleeping": 3_500_000_000,
        "uninterruptible": 0,
        "preempted": 5_000_000,
    }


def test_a_held_commands_wait_before_its_exec_counts_nowhere() -> None:
    """Process 7 waited for the go as the held child (the profiler's Python),
    then ran as COMMAND: only COMMAND's wait counts, in the stacks, the states
    and the waits begun before the profile."""
    held = copies.FLAG_SYSCALL | copies.FLAG_BEFORE
    recs = [
        _rec(7, held, 40_000_000, READ, comm=b"gfxclient:held\0\0"),
        _rec(7, copies.FLAG_SYSCALL, 1_000_000_000, CLOCK_NANOSLEEP, comm=b"napexec"),
    ]
    reader = copies.CopyReader(Records(recs), lambda pid, refresh: None, None, waits=True)  # type: ignore[arg-type]
    reader.held = (7, b"gfxclient:held")
    assert reader.drain() == 2 and reader.records == 2
    assert [(s.comm, s.weight) for s in reader.raw_stacks()] == [("napexec", 1_000_000_000)]
    assert reader.by_state["sleeping"] == 1_000_000_000 and reader.before == 0


def test_wall_samples_count_the_period_and_keep_threads_apart() -> None:
    recs = [_rec(7, 0, 0), _rec(7, 0, 0), _rec(9, 0, 0)]
    reader = copies.CopyReader(
        Records(recs),
        lambda pid, refresh: None,
        None,
        sample_ns=2_000_000,
        threads=True,  # type: ignore[arg-type]
    )
    reader.drain()
    got = sorted((s.thread, s.weight, s.leaf) for s in reader.raw_stacks())
    assert got == [(7, 4_000_000, None), (9, 2_000_000, None)]


def test_samples_keep_their_thread_id_without_a_thread_frame() -> None:
    recs = [_rec(7, 0, 0), _rec(7, 0, 0), _rec(9, 0, 0)]
    reader = copies.CopyReader(Records(recs), lambda pid, refresh: None, None)  # type: ignore[arg-type]
    reader.drain()
    got = sorted((s.tid, s.thread, s.weight) for s in reader.raw_stacks())
    assert got == [(7, None, 2), (9, None, 1)]


def _req(*argv: str) -> profile_cmd.Request:
    return profile_cmd.parse_request(parse_args(["profile", *argv]))


def test_modes_from_flags() -> None:
    assert _req("--pid", "1").mode == engine_request.CPU and not _req("--pid", "1").timed
    off = _req("--off-cpu", "--min-block", "2.5", "--pid", "1")
    assert off.mode == engine_request.OFF_CPU and off.min_block_us == 2500
    wall = _req("--wall", "--frequency", "499", "--", "./prog")
    assert wall.mode == engine_request.WALL and wall.frequency == 499
    assert wall.min_block_us == engine_request.WALL_MIN_BLOCK_US and not wall.min_block_asked


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--off-cpu", "--wall"], "not both"),
        (["--off-cpu", "--stacks-at", "/a.so:f", "--pid", "1"], "not both"),
        (["--off-cpu", "--frequency", "99"], "every wait"),
        (["--min-block", "3"], "for --off-cpu and --wall"),
        (["--wall", "--scope", "system"], "scope self only"),
    ],
)
def test_bad_combinations_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _req(*argv)


def _timed(kind: str) -> Profile:
    stacks = {("app", "main", "[wait: futex]"): 2_000_000_000, ("app", "main", "spin"): 10**9}
    return Profile(stacks=stacks, unit="nanoseconds", time_kind=kind)


@pytest.mark.parametrize("kind", ["off_cpu", "wall"])
def test_pprof_writes_the_time_kind_in_nanoseconds(kind: str) -> None:
    msg = pprof_message(_timed(kind))
    types = [(msg.string_table[t.type], msg.string_table[t.unit]) for t in msg.sample_type]
    assert types == [(kind, "nanoseconds")]
    assert sorted(s.value[0] for s in msg.sample) == [10**9, 2 * 10**9]


def test_svg_colours_off_cpu_frames_apart(tmp_path: Path) -> None:
    svg = flamegraph_svg(_timed("wall"))
    futex = svg.split("<title>[wait: futex] (", 1)[1].split("</g>", 1)[0]
    spin = svg.split("<title>spin (", 1)[1].split("</g>", 1)[0]
    assert 'fill="#5a96e6"' in futex and "#5a96e6" not in spin
    assert "3 s" in svg.split("<title>main (", 1)[1].split("</g>", 1)[0]


def test_record_layout_matches_the_program() -> None:
    """struct ustack_rec's header: what offcpu fills (elapsed, function) sits where
    the client reads it."""
    rec = _rec(11, copies.FLAG_SYSCALL, 123, FUTEX)
    fields = copies.HEADER.unpack(rec)
    assert fields[1] == 11 and fields[8] == 123 and fields[9] == FUTEX
    assert struct.calcsize("<4I3QQQII16s") == copies.HEADER.size == 80


def test_the_per_thread_slots_are_broker_only_and_sized_for_a_header_or_a_record() -> None:
    """`blocked` (a header per thread) and `copied` (whole records of waits
    outside a system call) are broker-only; the broker charges them to the
    caller's map budget as every map of an instance (broker/instances.py,
    tests/kernel/test_map_budget.py)."""
    from gfxbpf.broker.access import budget
    from gfxbpf.broker.instances import _visible_specs

    entry = cat.load_catalog().get("offcpu")
    spec, _ = prepare(entry, (entry.directory / entry.object).read_bytes(), Params(uid=1000))
    slots = {name: spec.maps[name] for name in ("blocked", "copied")}
    assert slots["blocked"].value_size == copies.HEADER.size  # a header, no stack
    assert slots["copied"].value_size >= copies.HEADER.size + 16384
    nbytes = sum(
        budget.map_bytes(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, 2)
        for m in slots.values()
    )
    assert 64 * 20 * 1024 <= nbytes <= 2 << 20, nbytes
    assert not set(slots) & {m.name for m in _visible_specs(entry, spec)}


def test_the_top_table_shows_time_in_seconds() -> None:
    from gfxbpf.client.profiles.top import format_top

    lines = format_top(_timed("off_cpu"), 5).splitlines()
    assert lines[0].split() == ["SELF", "s", "TOTAL", "s", "FUNCTION"]
    assert lines[1].split() == ["66.7%", "2.000", "66.7%", "2.000", "[wait:", "futex]"]
    assert "3.000" in " ".join(lines)  # main's total: both stacks
