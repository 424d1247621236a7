"""The `cuda` program end to end on the libcuda stand-in (CI has no GPU).

The broker runs as gfxbpf with CAP_BPF + CAP_PERFMON only; gfxclient runs
as an ordinary user and finds libcuda in the target's /proc/PID/maps. The
workload (bench/cuda_workload.c) drives the stand-in with bench/cuda_standin.py's
SCRIPT, whose truth (calls per function, bytes per copy direction, live and
peak device memory) the test compares exactly with what gfxclient shows.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import cuda_standin as cs
from tests.kernel.brokerenv import (
    ALICE,
    BASE_ENV,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    Client,
    policy_for,
    run_as,
    setpriv_user_argv,
    shared_dir,
)

pytestmark = pytest.mark.kernel
VIAS = ["fd", "grpc"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    base = shared_dir(prefix="gfxbpf-cuda-")
    out = {
        "new": cs.build_library(base / "new"),
        "old": cs.build_library(base / "old", old_driver=True),
        "exe": cs.build_workload(base / "bin"),
        "base": base,
    }
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    yield out


def broker_policy(request: pytest.FixtureRequest) -> str:
    built: dict[str, Path] = request.getfixturevalue("built")
    libs = [f"{built['base']}/*/libcuda.so.1"]
    return policy_for(
        {
            "cuda": [
                {"users": [ALICE], "scope": "self", "libraries": libs},
                # Bob may not probe synchronization: those are skipped for him.
                {"users": [BOB], "scope": "self", "libraries": libs,
                 "functions": ["cuLaunch*", "cuGraph*", "cuMem*"]},
            ]
        },
    )  # fmt: skip


def _workload(built: dict[str, Path], user: str, which: str = "new") -> cs.Workload:
    return cs.Workload(
        built["exe"], built[which], prefix=setpriv_user_argv(user, []), env=BASE_ENV, cwd="/"
    )


def _client(broker: BrokerProcess, via: str, *args: str) -> list[str]:
    assert broker.grpc is not None
    return [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--grpc",
            broker.grpc, "--via", via, *args]  # fmt: skip


def _watch(broker: BrokerProcess, via: str, user: str, *args: str) -> subprocess.Popen[str]:
    return run_as(
        user,
        _client(broker, via, "watch", "cuda", *args),
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_truth(proc: dict[str, Any], truth: cs.Truth) -> None:
    calls = {name: f.get("calls", 0) for name, f in proc["functions"].items()}
    assert calls == truth.calls
    launches = sum(n for name, n in truth.calls.items() if "Launch" in name)
    assert proc["launches"] == launches
    got_bytes = {d: c["bytes"] for d, c in proc["copies"].items()}
    assert got_bytes == truth.bytes_by_direction
    assert proc["errors"] == truth.errors
    mem = proc["memory"]
    assert (mem["live"], mem["peak"]) == (truth.live, truth.peak)
    assert (mem["allocs"], mem["frees"], mem["untracked"]) == (truth.allocs, truth.frees, 0)
    assert proc["sync_calls"] == truth.sync_calls
    # The stand-in sleeps 1 ms per synchronization: time blocked is at least that.
    assert proc["sync_ns"] >= truth.sync_calls * 1_000_000


@pytest.mark.parametrize("via", VIAS)
def test_watch_cuda_counts_exactly_and_only_my_process(
    broker: BrokerProcess, built: dict[str, Path], via: str
) -> None:
    with _workload(built, ALICE) as mine, _workload(built, BOB) as bobs:
        watch = _watch(broker, via, ALICE, "--pid", str(mine.pid), "--json",
                       "--interval", "1", "--duration", "3")  # fmt: skip
        try:
            assert watch.stdout is not None
            first = json.loads(watch.stdout.readline())  # right after attaching
            replies = mine.run(cs.SCRIPT)
            bobs.run(cs.SCRIPT)  # same library, another user: never counted
            lines = [json.loads(ln) for ln in watch.stdout]
            assert watch.wait(30) == 0, watch.stderr.read() if watch.stderr else ""
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
    assert "absent" not in replies
    assert first["library"] == str(built["new"]) and first["skipped_functions"] == []
    last = lines[-1]
    assert set(last["processes"]) == {str(mine.pid)}
    _assert_truth(last["processes"][str(mine.pid)], cs.truth(cs.SCRIPT))


def test_functions_an_old_driver_lacks_are_skipped_and_listed(
    broker: BrokerProcess, built: dict[str, Path]
) -> None:
    with _workload(built, ALICE, "old") as w:
        watch = _watch(broker, "fd", ALICE, "--pid", str(w.pid), "--json", "--duration", "2")
        try:
            assert watch.stdout is not None
            first = json.loads(watch.stdout.readline())
            w.run(cs.SCRIPT)
            lines = [json.loads(ln) for ln in watch.stdout]
            assert watch.wait(30) == 0
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        text = run_as(ALICE, _client(broker, "fd", "watch", "cuda", "--pid", str(w.pid), "--once"))
    skipped = {s.split(":")[0] for s in first["skipped_functions"]}
    assert skipped == cs.OLD_DRIVER_LACKS
    assert all("not in libcuda.so.1" in s for s in first["skipped_functions"])
    truth = cs.truth(cs.SCRIPT, absent=cs.OLD_DRIVER_LACKS)
    _assert_truth(lines[-1]["processes"][str(w.pid)], truth)
    assert text.returncode == 0, text.stderr
    assert f"not probed ({len(cs.OLD_DRIVER_LACKS)})" in text.stdout
    assert "cuLaunchKernelEx: not in libcuda.so.1" in text.stdout
    records = [r for r in broker.audit_records() if r.get("op") == "attach"]
    assert any(r.get("skipped_functions") == len(cs.OLD_DRIVER_LACKS) for r in records)


@pytest.mark.parametrize("via", VIAS)
def test_another_users_process_is_refused(
    broker: BrokerProcess, built: dict[str, Path], via: str
) -> None:
    with _workload(built, ALICE) as alices:
        # gfxclient cannot read her maps...
        r = run_as(BOB, _client(broker, via, "watch", "cuda", "--pid", str(alices.pid), "--once"))
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "is not yours" in r.stderr
        # ... and naming the library does not get past the broker's pid check.
        r = run_as(BOB, _client(broker, via, "watch", "cuda", "--pid", str(alices.pid),
                                "--library", str(built["new"]), "--once"))  # fmt: skip
        assert r.returncode == 3, r.stderr  # EXIT_DENIED
        assert "Traceback" not in r.stderr


def test_a_process_without_libcuda_gets_a_clear_message(broker: BrokerProcess) -> None:
    sleeper = run_as(ALICE, ["sleep", "30"], background=True)
    try:
        r = run_as(ALICE, _client(broker, "fd", "watch", "cuda", "--pid", str(sleeper.pid)))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"process {sleeper.pid} has no libcuda mapped" in r.stderr
    assert "--library" in r.stderr


def test_the_wrong_library_names_what_is_missing(
    broker: BrokerProcess, built: dict[str, Path], tmp_path: Path
) -> None:
    # A library the policy allows but that defines none of the table's functions.
    other = built["base"] / "empty" / "libcuda.so.1"
    other.parent.mkdir(exist_ok=True)
    src = tmp_path / "e.c"
    src.write_text("int not_cuda(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(other), str(src)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(other.parent)], check=True)
    with _workload(built, ALICE) as w:
        r = run_as(ALICE, _client(broker, "fd", "watch", "cuda", "--pid", str(w.pid),
                                  "--library", str(other), "--once"))  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "has nothing to probe" in r.stderr and "cuLaunchKernel: not in" in r.stderr


def test_functions_the_policy_leaves_out_are_skipped_and_listed(
    broker: BrokerProcess, built: dict[str, Path]
) -> None:
    with _workload(built, BOB) as w:
        r = run_as(BOB, _client(broker, "fd", "watch", "cuda", "--pid", str(w.pid), "--json",
                                "--once"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    syncs = {f.name for f in cs.cuda_api.FUNCTIONS if f.role == "sync"}
    assert {s.split(":")[0] for s in doc["skipped_functions"]} == syncs
    assert all("not allowed by the policy" in s for s in doc["skipped_functions"])


def test_maps_are_read_only_and_hold_no_kernel_address_nor_device_pointer(
    broker: BrokerProcess, built: dict[str, Path]
) -> None:
    alice = Client(broker, ALICE)
    try:
        with _workload(built, ALICE) as w:
            att = alice.ok("attach", name="cuda", scope="self", pid=w.pid,
                           library=str(built["new"]))  # fmt: skip
            w.run(cs.SCRIPT)
            visible = {"calls", "time_ns", "bytes", "errors", "latency", "memory"}
            assert set(att["maps"]) == visible  # entries and dptr_size stay in the broker
            assert alice.ok("write_fd", id=att["id"], map="memory")["errno"] == "EPERM"
            scan = alice.ok("scan", id=att["id"])
            assert scan["found"] == {} and scan["bytes"] > 0
            # The stand-in's device pointers start at 0x700000000000 (cuda_standin.c).
            for name in visible:
                for k, v in alice.ok("read_fd", id=att["id"], map=name)["entries"].items():
                    for blob in (bytes.fromhex(k), bytes.fromhex(v)):
                        words = [int.from_bytes(blob[i : i + 8], "little")
                                 for i in range(0, len(blob) - 7, 4)]  # fmt: skip
                        assert not any(0x7000_0000_0000 <= x < 0x7001_0000_0000 for x in words)
    finally:
        alice.close()


def test_info_and_dump_say_what_cuda_needs(broker: BrokerProcess, built: dict[str, Path]) -> None:
    info = run_as(ALICE, _client(broker, "fd", "info", "cuda"))
    assert info.returncode == 0, info.stderr
    assert "libcuda.so.1" in info.stdout and "NVIDIA" in info.stdout
    with _workload(built, ALICE) as w:
        dump = run_as(ALICE, _client(broker, "fd", "dump", "cuda", "--pid", str(w.pid),
                                     "--wait", "2"), background=True, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)  # fmt: skip
        while dump.poll() is None:  # launches until the dump has read its snapshot
            w.run(cs.SCRIPT[:1])
        out, err = dump.communicate()
    assert dump.returncode == 0, err
    assert "function=cuLaunchKernel" in out  # keys named from the table
    assert "@latency[cuLaunchKernel]:" in out


def test_later_attaches_reuse_the_symbol_index(
    broker: BrokerProcess, built: dict[str, Path]
) -> None:
    with _workload(built, ALICE) as w:
        for _ in range(2):
            r = run_as(ALICE, _client(broker, "fd", "watch", "cuda", "--pid", str(w.pid),
                                      "--once", "--interval", "0.1"))  # fmt: skip
            assert r.returncode == 0, r.stderr
    records = [
        r
        for r in broker.audit_records()
        if r.get("op") == "attach" and r.get("program") == "cuda" and r.get("result") == "ok"
    ]
    said = [r["symbols"] for r in records]
    assert said[-2:] == ["cached", "cached"]
    # Each library file of this module was indexed once, however often it was attached.
    assert said.count("parsed") <= 2 < len(said)


def test_watch_cuda_of_a_launcher_counts_its_child_exactly(
    broker: BrokerProcess, built: dict[str, Path]
) -> None:
    """--pid of a launcher (a shell) whose child maps libcuda: gfxclient finds
    the library in the child and the kernel follows the launcher's tree."""
    from gfxbpf.client.family import descendants

    launcher = setpriv_user_argv(ALICE, ["sh", "-c", '"$0" "$@"; true'])  # forks the workload
    with cs.Workload(built["exe"], built["new"], prefix=launcher, env=BASE_ENV, cwd="/") as sh:
        (child,) = descendants([sh.pid])
        watch = _watch(broker, "fd", ALICE, "--pid", str(sh.pid), "--json",
                       "--interval", "1", "--duration", "3")  # fmt: skip
        try:
            assert watch.stdout is not None
            first = json.loads(watch.stdout.readline())
            sh.run(cs.SCRIPT)
            lines = [json.loads(ln) for ln in watch.stdout]
            assert watch.wait(30) == 0, watch.stderr.read() if watch.stderr else ""
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
    assert first["library"] == str(built["new"])
    last = lines[-1]
    assert set(last["processes"]) == {str(child)}
    _assert_truth(last["processes"][str(child)], cs.truth(cs.SCRIPT))
