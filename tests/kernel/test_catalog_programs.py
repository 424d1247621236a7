"""Every catalog program loads through gfxbpf.bpf; those that can attach here
do, and real events the test causes land in their maps with exact counts."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gfxbpf.bpf.loader import load
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import read_object
from tests.conftest import skip_or_fail
from tests.kernel.sysmaps_util import run_unprivileged

CATALOG = load_catalog()
TEST_UID = 54321  # a uid nothing else on the machine runs as
GETPPID = 110


def _counter(m: Map) -> dict:
    """Decoded key -> per-entry count (per-CPU values summed)."""
    out = {}
    for k, v in m.read():
        out[k if not isinstance(k, dict) else tuple(k.values())] = (
            sum(v) if isinstance(v, list) else v
        )
    return out


@pytest.mark.parametrize("entry", CATALOG.programs, ids=lambda e: e.name)
def test_every_catalog_object_loads(entry) -> None:
    # GPU events are absent here: their knobs keep the defaults; load, don't attach.
    spec = ObjectSpec.parse(read_object(entry), entry.name)
    with load(spec) as obj:
        assert obj.programs and all(p.id > 0 for p in obj.programs.values())
        for m in entry.maps:
            assert obj.map(m.name).fileno() >= 0


def test_fence_attaches_to_the_dma_fence_tracepoints() -> None:
    entry = CATALOG.get("fence")
    assert instance.availability(entry) is None
    with instance.start(entry, read_object(entry)) as inst:
        assert len(inst.attachments) == len(entry.attach)


def _in_child_as(uid: int, fn) -> object:
    return run_unprivileged(fn, uid=uid, timeout=60)


def test_syscount_counts_exactly_the_callers_syscalls() -> None:
    entry = CATALOG.get("syscount")
    n = 1234
    with instance.start(entry, read_object(entry), instance.Params(uid=TEST_UID)) as inst:

        def work() -> int:
            for _ in range(n):
                os.getppid()
            return n

        _in_child_as(TEST_UID, work)
        counts = _counter(inst.obj.map("counts"))
        assert counts[GETPPID] == n
        # A process without capabilities, handed the map fd, reads and decodes it.
        fd = inst.obj.map("counts").fileno()
        btf = inst.obj.spec.btf
        m = inst.obj.map("counts")

        def read_as_nobody() -> dict:
            return _counter(Map.from_fd(fd, btf, m.key_type_id, m.value_type_id))

        assert run_unprivileged(read_as_nobody)[GETPPID] == n


def test_syscount_system_scope_sees_other_users() -> None:
    entry = CATALOG.get("syscount")
    with instance.start(entry, read_object(entry)) as inst:
        _in_child_as(TEST_UID + 1, lambda: [os.getppid() for _ in range(50)] and 0)
        assert _counter(inst.obj.map("counts")).get(GETPPID, 0) >= 50


def _exec_true(n: int) -> list[int]:
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/true", ["true"])
            finally:
                os._exit(127)
        os.waitpid(pid, 0)
        pids.append(pid)
    return pids


def test_execsnoop_streams_the_callers_execs() -> None:
    entry = CATALOG.get("execsnoop")
    n = 5
    with instance.start(entry, read_object(entry), instance.Params(uid=TEST_UID)) as inst:
        # This kernel has BTF: the tp_btf build runs (test_btf_catalog.py runs both).
        assert inst.variant == "btf"
        _exec_true(2)  # root's execs must not appear
        pids = _in_child_as(TEST_UID, lambda: _exec_true(n))
        events = inst.obj.map("events")
        btf = inst.obj.spec.btf
        assert btf is not None
        ev_type = btf.find("exec_event")
        assert ev_type is not None

        # Consumed in a process that holds nothing but the ring-buffer fd.
        fd = events.fileno()

        def consume() -> list[dict]:
            out: list[dict] = []
            with RingBuffer(fd) as rb:
                deadline = time.monotonic() + 5
                while len(out) < n and time.monotonic() < deadline:
                    out += [btf.decode(ev_type, r) for r in rb.poll(0.5)]
            return out

        got = run_unprivileged(consume)
        assert len(got) == n
        assert sorted(e["pid"] for e in got) == sorted(pids)
        for e in got:
            assert e["uid"] == TEST_UID and e["comm"] == "true"
            assert e["filename"] in ("/bin/true", "/usr/bin/true")


def test_clonecount_counts_forks_per_command() -> None:
    entry = CATALOG.get("clonecount")
    n = 7
    comm = "gfxclonetest"
    # A copy of bash named like the comm, so its forks (one per external
    # command) are counted under that name. Not a Python child: libraries
    # such as grpc, once imported into pytest, restart their threads after
    # every os.fork(), and each of those clone() calls would count too.
    # ":" last: bash execs a final external command without forking. (dash
    # would not do: it uses vfork(), which is not clone.)
    script = "; ".join(["/bin/true"] * n + [":"])
    with (
        tempfile.TemporaryDirectory() as tmp,
        instance.start(entry, read_object(entry), instance.Params(uid=TEST_UID)) as inst,
    ):
        os.chmod(tmp, 0o755)  # the test uid must reach the shell
        shell = Path(tmp, comm)
        shutil.copy(shutil.which("bash") or "/bin/bash", shell)  # fork() = clone()
        subprocess.run([str(shell), "-c", script], user=TEST_UID, group=TEST_UID, check=True)
        counts = {
            (k["comm"] if isinstance(k, dict) else k): v for k, v in inst.obj.map("counts").read()
        }
        assert counts == {comm: n}


UCALLS_LIB = """
int gfx_work(int x) { return x * 2 + 1; }
int gfx_other(int x) { return x - 1; }
"""
UCALLS_MAIN = """
#include <stdio.h>
#include <stdlib.h>
int gfx_work(int); int gfx_other(int);
int main(int argc, char **argv) {
    int n = atoi(argv[1]), m = atoi(argv[2]), acc = 0; char line[8];
    if (!fgets(line, sizeof line, stdin)) return 1;   /* wait until probes are in */
    for (int i = 0; i < n; i++) acc += gfx_work(i);
    for (int i = 0; i < m; i++) acc += gfx_other(i);
    printf("%d\\n", acc);
    return 0;
}
"""


def _build_ucalls_target(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is not installed")
    (tmp / "lib.c").write_text(UCALLS_LIB)
    (tmp / "main.c").write_text(UCALLS_MAIN)
    lib = tmp / "libgfxwork.so"
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp / "lib.c")], check=True
    )
    exe = tmp / "worker"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-o",
            str(exe),
            str(tmp / "main.c"),
            f"-L{tmp}",
            "-lgfxwork",
            f"-Wl,-rpath,{tmp}",
        ],
        check=True,
    )
    return lib, exe


def test_ucalls_counts_calls_of_chosen_functions(tmp_path: Path) -> None:
    entry = CATALOG.get("ucalls")
    lib, exe = _build_ucalls_target(tmp_path)
    n, m = 321, 45
    proc = subprocess.Popen(
        [str(exe), str(n), str(m)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        params = instance.Params(
            pid=proc.pid, library=str(lib), functions=("gfx_work", "gfx_other")
        )
        with instance.start(entry, read_object(entry), params) as inst:
            out, _ = proc.communicate("go\n", timeout=30)
            assert proc.returncode == 0, out
            calls = _counter(inst.obj.map("calls"))
            assert calls == {0: n, 1: m}
            hist: dict[int, int] = {}
            for k, v in inst.obj.map("latency").read():
                hist[k["function"]] = hist.get(k["function"], 0) + v
            assert hist == {0: n, 1: m}  # every return measured once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
