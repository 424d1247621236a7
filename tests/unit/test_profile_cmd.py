"""gfxclient profile without a broker: the map layouts into RawStacks, and the
flag combinations it refuses before connecting."""

from __future__ import annotations

import errno
import os
import struct
import time

import pytest

from gfxbpf.client.cli import profile_cmd
from gfxbpf.client.cli.gfxclient import main, parse_args
from gfxbpf.client.errors import EXIT_USAGE, ProtocolError, UsageError
from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.engine.child import Child
from gfxbpf.client.profiles.engine.naming import processes_seen
from gfxbpf.client.profiles.engine.run import running


def _stack(*addrs: int) -> bytes:
    return struct.pack("<127Q", *addrs, *([0] * (127 - len(addrs))))


def _sample(tgid: int, sid: int, kernel: int, comm: bytes) -> bytes:
    return profile_read.SAMPLE_KEY.pack(tgid, sid, kernel, comm)


STACKS = profile_read.stack_table(
    [(struct.pack("<I", 7), _stack(0x401000, 0x401100, 0x7F0000001000))]
)


def test_stack_table_drops_the_padding() -> None:
    assert STACKS == {7: (0x401000, 0x401100, 0x7F0000001000)}


def test_profile_stacks_keep_lost_and_kernel_samples() -> None:
    counts = [
        (_sample(10, 7, 0, b"prog\0"), struct.pack("<Q", 5)),
        (_sample(10, 7, 1, b"prog\0"), struct.pack("<Q", 2)),
        (_sample(11, -errno.EFAULT, 1, b"kworker/0:1\0"), struct.pack("<Q", 3)),
        (_sample(12, -errno.EEXIST, 0, b"other\0"), struct.pack("<Q", 1)),
    ]
    raw = {(r.pid, r.kernel): r for r in profile_read.profile_stacks(counts, STACKS)}
    assert raw[(10, False)].user == STACKS[7] and raw[(10, False)].weight == 5
    assert raw[(10, True)].kernel and raw[(10, True)].comm == "prog"
    assert raw[(11, True)].user == () and "kernel thread" in str(raw[(11, True)].user_error)
    assert "collision" in str(raw[(12, False)].user_error)
    assert sum(r.weight for r in raw.values()) == 11  # nothing dropped
    only = profile_read.profile_stacks(counts, STACKS, pids=[11])
    assert [r.pid for r in only] == [11]


def test_a_stack_id_missing_from_the_table_is_lost_not_an_error() -> None:
    counts = [(_sample(10, 99, 0, b"p\0"), struct.pack("<Q", 1))]
    (r,) = profile_read.profile_stacks(counts, STACKS)
    assert r.user == () and r.user_error == "stack not in the table when read"


def test_call_stacks_put_the_caller_back_and_weigh_by_calls_or_time() -> None:
    key = profile_read.CALL_KEY.pack(10, 7, 1, 0, 0x400500)
    value = profile_read.CALL_STATS.pack(42, 9000)
    (r,) = profile_read.call_stacks([(key, value)], STACKS, ["a", "cuLaunchKernel"])
    # The stack's first entry is the probed function itself: the caller replaces it.
    assert r.user == (0x400500, 0x401100, 0x7F0000001000)
    assert r.leaf == "cuLaunchKernel" and r.weight == 42 and not r.kernel
    (t,) = profile_read.call_stacks([(key, value)], STACKS, ["a", "b"], weight="time")
    assert t.weight == 9000


def test_a_layout_of_another_size_is_refused() -> None:
    with pytest.raises(ProtocolError, match="update gfxclient"):
        profile_read.profile_stacks([(b"\0" * 24, struct.pack("<Q", 1))], STACKS)


def test_lost_count() -> None:
    assert profile_read.lost_count([(b"\0" * 4, struct.pack("<Q", 6))]) == 6


def _req(*argv: str) -> profile_cmd.Request:
    return profile_cmd.parse_request(parse_args(["profile", *argv]))


def test_request_from_flags() -> None:
    r = _req("-o", "x.svg", "--", "./prog", "--flag")
    assert r.command == ["./prog", "--flag"] and r.fmt == "svg" and r.output == "x.svg"
    assert _req("--pid", "5", "--pid", "5", "--pid", "6").pids == [5, 6]
    assert _req("-o", "p.pb.gz").fmt == "pprof"
    assert _req("--format", "folded").output == "profile.folded"
    assert _req("--pid", "1").output is None  # no file unless asked: the table only
    s = _req("--stacks-at", "/lib/x.so:f", "--stacks-at", "/lib/x.so:g", "--pid", "3")
    assert s.probes and s.library == "/lib/x.so" and s.functions == ["f", "g"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pid", "3", "--", "./prog"], "not both"),
        (["--stacks-at", "/lib/x.so"], "LIBRARY:FUNCTION"),
        (["--stacks-at", "/a.so:f", "--stacks-at", "/b.so:g", "--pid", "1"], "one library"),
        (["--stacks-at", "/a.so:f"], "one process"),
        (["--stacks-at", "/a.so:f", "--pid", "1", "--frequency", "99"], "for sampling"),
        (["--weight", "time", "--pid", "1"], "for --stacks-at"),
        (["--"], "nothing after --"),
    ],
)
def test_bad_combinations_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _req(*argv)


def test_cli_reports_a_usage_error_without_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--socket", "/nonexistent", "profile", "--pid", "1", "--", "x"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not both" in err and "Traceback" not in err


def test_frequency_must_be_a_positive_integer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--frequency", "0"]) == EXIT_USAGE
    assert "not a frequency" in capsys.readouterr().err


def test_a_child_whose_attach_failed_never_runs_the_command(tmp_path: object) -> None:
    marker = f"/tmp/gfxbpf-unit-{os.getpid()}-ran"
    child = Child(["/bin/sh", "-c", f"touch {marker}"])
    child.abandon()
    assert child.status == 127 and not os.path.exists(marker)


def test_a_released_child_runs_and_a_missing_command_is_a_usage_error() -> None:
    child = Child(["/bin/sh", "-c", "exit 3"])
    child.release()
    assert child.wait() == 3
    missing = Child(["/nonexistent/prog"])
    with pytest.raises(UsageError, match="cannot run '/nonexistent/prog'"):
        missing.release()


def test_a_zombie_is_not_running() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = 200
        while running(pid) and deadline:  # exits at once, unreaped
            deadline -= 1
            time.sleep(0.01)
        assert not running(pid)
        assert os.path.exists(f"/proc/{pid}")  # still there, as a zombie
    finally:
        os.waitpid(pid, 0)
    assert running(os.getpid())


def test_stack_ids_of_both_layouts() -> None:
    counts = [
        (_sample(1, 7, 0, b"p\0"), b""),
        (_sample(1, -errno.EFAULT, 1, b"p\0"), b""),
        (_sample(2, 9, 0, b"q\0"), b""),
    ]
    assert profile_read.stack_ids(counts) == {7, 9}
    calls = [(profile_read.CALL_KEY.pack(1, 4, 0, 0, 0x1000), b"")]
    assert profile_read.stack_ids(calls, probes=True) == {4}


def test_processes_seen_sum_per_process_heaviest_first() -> None:
    from gfxbpf.client.profiles import RawStack

    raw = [
        RawStack(pid=10, user=(), kernel=False, weight=3, comm="sh"),
        RawStack(pid=11, user=(), kernel=False, weight=40, comm="prog"),
        RawStack(pid=11, user=(), kernel=True, weight=5, comm="prog"),
        RawStack(pid=12, user=(), kernel=False, weight=7),  # a probe's row: no comm
    ]
    seen = processes_seen(raw, {12: "worker"})
    assert seen == [(11, "prog", 45), (12, "worker", 7), (10, "sh", 3)]
    # Another thread's name (autograd's) never hides the process's own.
    autograd = RawStack(pid=11, user=(), kernel=False, weight=1, comm="pt_autograd_0", tid=13)
    main = RawStack(pid=11, user=(), kernel=False, weight=1, comm="python3", tid=11)
    for rows in ([main, autograd], [autograd, main]):
        assert processes_seen(rows) == [(11, "python3", 2)]


def test_no_children_flag_and_its_default() -> None:
    args = parse_args(["profile", "--", "sh", "-c", "./prog; true"])
    assert profile_cmd.parse_request(args).children
    args = parse_args(["profile", "--no-children", "--pid", "7"])
    assert not profile_cmd.parse_request(args).children


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("x.svg", "svg"),
        ("x.collapsed", "folded"),
        ("X.FOLDED", "folded"),
        ("x.txt", "folded"),
        ("x.pb.gz", "pprof"),
        ("x.pprof", "pprof"),
        ("x.speedscope.json", "speedscope"),
        ("x.json", "speedscope"),
    ],
)
def test_the_format_follows_the_file_name(name: str, fmt: str) -> None:
    assert _req("-o", name).fmt == fmt


@pytest.mark.parametrize("name", ["x.html", "x.foo", "profile", "x.svg.bak"])
def test_a_name_that_names_no_format_is_refused_not_written_as_svg(name: str) -> None:
    """Issue 33 item 5: -o x.html and -o x.collapsed silently wrote an SVG."""
    with pytest.raises(UsageError) as e:
        _req("-o", name)
    text = str(e.value)
    assert repr(name) in text and "--format folded|pprof|speedscope|svg" in text
    for ending in (".svg", ".folded", ".collapsed", ".pb.gz", ".speedscope.json"):
        assert ending in text
    assert ("HTML" in text) == name.endswith(".html")
    # An explicit --format writes any name.
    assert _req("--format", "svg", "-o", name).fmt == "svg"


def test_the_cli_refuses_an_unknown_ending_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--socket", "/nonexistent", "profile", "-o", "x.html", "--pid", "1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "cannot tell the format of 'x.html'" in err and "Traceback" not in err


@pytest.mark.parametrize("gpu", [[], ["--gpu"]])
def test_an_output_that_cannot_be_written_is_refused_before_profiling(
    gpu: list[str], tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """-o in a missing folder was found out after the profile (a long training
    run's profile lost at its end): now before connecting, for --gpu too."""
    missing = os.path.join(tmp_path, "no-such-folder", "x.svg")
    for path, why in ((missing, "No such file or directory"), (str(tmp_path), "it is a folder")):
        argv = ["--socket", "/nonexistent", "profile", *gpu, "--pid", "1", "-o", path]
        if path == str(tmp_path):
            argv += ["--format", "svg"]
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"-o: cannot write {path}: {why}" in err and "nothing is lost" in err, err
        assert "Traceback" not in err and "connect" not in err
    assert os.listdir(tmp_path) == [], "the check leaves no file behind"
    _req("-o", os.path.join(tmp_path, "ok.svg"))
    assert os.listdir(tmp_path) == []
