"""Python frames in gfxclient profile stacks (issue 23's acceptance, kernel half).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); gfxclient runs as gfxtest-alice over the Unix socket and profiles
Debian's /usr/bin/python3 (3.11) with no flags: the BPF program walks the
interpreter's frames (catalog/programs/gfx_python.h) and the client puts
them in place of the evaluation loop's native frames.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gfxbpf.proto import pprof_pb2
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)
from tests.kernel.profiling import profile, share, stacks_of
from tests.shared_python import build_shared_python
from tests.viewers import Speedscope, need_pprof, need_speedscope, pprof, pprof_top

pytestmark = pytest.mark.kernel

PYTHON = "/usr/bin/python3"
# The release the host's python3 runs: 3.11 on Debian 12, 3.13 on Debian 13 (CI's second leg).
HOST_VERSION = subprocess.run(
    [PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
    capture_output=True, text=True, check=True,
).stdout.strip()  # fmt: skip
MAX_HZ = 999
# Debian 13's CPython 3.13 in a chroot (issue 23: "files are found through
# /proc/PID/root, as for a container"): debootstrap from the Debian registry,
# or the tarball tools/debian13.sh caches.
TRIXIE_TARBALL = "/var/cache/gfxbpf/debian13-minbase-python3+ca-certificates+xz-utils+gzip.tgz"
MIRROR = os.environ.get("GFXBPF_DEBIAN_MIRROR", "http://deb.debian.org/debian")

# outer -> middle -> inner, a CPU loop in inner (lines 6-8).
NESTED = """\
import time
def outer():
    middle()
def middle():
    inner()
def inner():
    end = time.process_time() + 2.0
    while time.process_time() < end:
        pass
outer()
"""
INNER_BODY = range(7, 10)
CUT = "[python frames cut at the depth limit]"  # client/profiles/python/records.py

# Two threads, each its own chain; the main thread waits in join().
THREADS = """\
import threading, time
def spin(end):
    x = 0
    while time.monotonic() < end:
        x += 1
def alpha_leaf(end):
    spin(end)
def alpha(end):
    alpha_leaf(end)
def beta_leaf(end):
    spin(end)
def beta(end):
    beta_leaf(end)
end = time.monotonic() + 3.0
ts = [threading.Thread(target=alpha, args=(end,)), threading.Thread(target=beta, args=(end,))]
for t in ts: t.start()
for t in ts: t.join()
"""

# A C function of a test library called through ctypes from two functions.
LIB_C = r"""
volatile unsigned long lib_sink;
__attribute__((noinline)) void fake_launch(unsigned long x) { lib_sink += x; }
"""
CTYPES = """\
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
def caller_a(n):
    for i in range(n):
        lib.fake_launch(i)
def caller_b(n):
    for i in range(n):
        lib.fake_launch(i)
caller_a(1000)
caller_b(3000)
"""


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    if not os.access(PYTHON, os.X_OK):
        skip_or_fail(f"{PYTHON} is not installed")
    d = shared_dir(prefix="gfxbpf-pyframes-")
    os.chown(d, *ensure_user(ALICE))
    for name, text in (("nested.py", NESTED), ("threads.py", THREADS), ("calls.py", CTYPES)):
        (d / name).write_text(text)
        (d / name).chmod(0o644)
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
        raise AssertionError  # unreachable
    (d / "lib.c").write_text(LIB_C)
    subprocess.run(
        [gcc, "-O2", "-shared", "-fPIC", str(d / "lib.c"), "-o", str(d / "liblaunch.so")],
        check=True,
        capture_output=True,
    )
    (d / "liblaunch.so").chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    work: Path = request.getfixturevalue("work")
    lib = {"users": [ALICE], "scope": "self", "libraries": [str(work / "liblaunch.so")]}
    return policy_for(
        {
            "stackcopy": {"users": [ALICE, BOB], "scope": "self", "max_frequency": MAX_HZ},
            "ustackcopy": lib,
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def functions(frames: list[str]) -> list[str]:
    """Python frames' function names ("inner (f.py:7)" -> "inner"), root first."""
    return [f.split(" (", 1)[0] for f in frames if f.endswith(")") and ".py:" in f]


def chain_at(script: str, native: bool = False) -> Callable[[list[str]], bool]:
    """outer, middle, inner last among the Python frames, inner naming script
    and a line of its loop; native: Py_BytesMain on the native path too."""

    def ok(frames: list[str]) -> bool:
        inner = [f for f in frames if f.startswith(f"inner ({script}:")]
        return (
            functions(frames)[-3:] == ["outer", "middle", "inner"]
            and (not native or "Py_BytesMain" in frames)
            and bool(inner)
            and int(inner[-1].rpartition(":")[2][:-1]) in INNER_BODY
        )

    return ok


def _nested_ok(work: Path, frames: list[str]) -> bool:
    """Py_BytesMain on the native path, then outer, middle, inner in order,
    inner naming its file and a line of its body."""
    if "Py_BytesMain" not in frames:
        return False
    after = frames[frames.index("Py_BytesMain") :]
    names = functions(after)
    if names[-3:] != ["outer", "middle", "inner"]:
        return False
    inner = next(f for f in reversed(after) if f.startswith("inner ("))
    where = inner[len("inner (") : -1]
    path, _, line = where.rpartition(":")
    return path == str(work / "nested.py") and line.isdigit() and int(line) in INNER_BODY


def _worst(work: Path, stacks: list[tuple[list[str], int]]) -> list[tuple[int, list[str]]]:
    """The heaviest stacks that miss the chain (for a failure's message)."""
    bad = sorted(((n, s) for s, n in stacks if not _nested_ok(work, s)), reverse=True)
    return [(n, s[-6:]) for n, s in bad[:3]]


def test_outer_middle_inner_on_the_native_path(broker: BrokerProcess, work: Path) -> None:
    out = work / "nested.folded"
    summary = profile(broker, out, "--frequency", "499", "--", PYTHON, str(work / "nested.py"))
    stacks = stacks_of(out)
    got = share(stacks, lambda s: _nested_ok(work, s))
    print(f"outer/middle/inner: {got:.3f} of {sum(n for _, n in stacks)} samples")
    assert got >= 0.9, (got, _worst(work, stacks))
    py = summary["python"]
    assert any(i["version"].startswith(HOST_VERSION) for i in py["interpreters"]), py
    assert list(py["processes_walked"].values()) == [HOST_VERSION], py
    print("walker counters:", py["walker"])
    assert py["walker"]["walked"] >= sum(n for _, n in stacks) * 0.9, py


def test_over_grpc_the_code_objects_come_through_the_broker(
    broker: BrokerProcess, work: Path
) -> None:
    out = work / "nested-grpc.folded"
    profile(broker, out, "--frequency", "499", "--", PYTHON, str(work / "nested.py"), grpc=True)
    stacks = stacks_of(out)
    got = share(stacks, lambda s: _nested_ok(work, s))
    assert got >= 0.9, (got, _worst(work, stacks))


@pytest.fixture(scope="module")
def pyshared(work: Path) -> Path:
    prog = build_shared_python(work)
    if prog is None:
        skip_or_fail("gcc or /usr/bin/python3-config is missing (apt-get install python3-dev)")
        raise AssertionError  # unreachable
    return prog


@pytest.mark.parametrize("how", ["command", "pid"])
def test_a_shared_build_is_walked_through_its_libpython(
    broker: BrokerProcess, work: Path, pyshared: Path, how: str
) -> None:
    # The executable has no _PyRuntime: the walker finds libpython's mapping
    # from a sampled ip (bpf_find_vma) and remembers it for the process.
    out = work / f"shared-{how}.folded"
    argv = [str(pyshared), str(work / "nested.py")]
    if how == "command":
        summary = profile(broker, out, "--frequency", "499", "--", *argv)
    else:
        proc = run_as(ALICE, argv, background=True)
        try:
            summary = profile(broker, out, "--frequency", "499", "--pid", str(proc.pid))
        finally:
            proc.kill()
            proc.wait()
    stacks = stacks_of(out)
    got = share(stacks, lambda s: _nested_ok(work, s))
    print(f"shared build ({how}): {got:.3f} of {sum(n for _, n in stacks)} samples")
    assert got >= 0.9, (got, _worst(work, stacks))
    py = summary["python"]
    assert list(py["processes_walked"].values()) == [HOST_VERSION], py
    assert any("libpython" in i["path"] for i in py["interpreters"]), py


def _chain_at_leaf(chain: list[str]) -> Callable[[list[str]], bool]:
    return lambda frames: functions(frames)[-len(chain) :] == chain


def test_two_threads_each_with_its_own_chain(broker: BrokerProcess, work: Path) -> None:
    out = work / "threads.folded"
    profile(broker, out, "--frequency", "499", "--", PYTHON, str(work / "threads.py"))
    stacks = stacks_of(out)
    alpha = share(stacks, _chain_at_leaf(["alpha", "alpha_leaf", "spin"]))
    beta = share(stacks, _chain_at_leaf(["beta", "beta_leaf", "spin"]))
    print(f"threads: alpha {alpha:.3f}, beta {beta:.3f}")
    assert alpha >= 0.2 and beta >= 0.2, (alpha, beta, stacks[:10])


def _tids_under(msg: pprof_pb2.Profile, function: str) -> dict[int, int]:
    """tid label -> samples of the stacks that hold function."""
    st = msg.string_table
    fids = {f.id for f in msg.function if st[f.name] == function}
    locs = {loc.id for loc in msg.location if any(ln.function_id in fids for ln in loc.line)}
    out: dict[int, int] = {}
    for s in msg.sample:
        if locs & set(s.location_id):
            tid = next(lb.num for lb in s.label if st[lb.key] == "tid")
            out[tid] = out.get(tid, 0) + s.value[0]
    return out


def test_two_threads_in_pprof_and_speedscope_read_by_their_tools(
    broker: BrokerProcess, work: Path
) -> None:
    """Issue 33: Google's pprof names the Python functions, lists threads.py's
    lines and selects each thread by its tid; speedscope shows a profile per thread."""
    need_pprof()
    need_speedscope()
    pb, ss = work / "threads.pb.gz", work / "threads.speedscope.json"
    argv = ("--frequency", "499", "--", PYTHON, str(work / "threads.py"))
    profile(broker, pb, *argv, fmt="pprof")
    rows = pprof_top(pb, "-sample_index=samples")
    print("pprof -top, heaviest:", rows[:6])
    names = [name for _, name in rows]
    assert "" not in names and {"spin", "alpha_leaf", "beta_leaf"} <= set(names), names
    listed = pprof(pb, "-list=^spin$", "-sample_index=samples")
    assert f"spin in {work / 'threads.py'}" in listed and "x += 1" in listed, listed
    msg = pprof_pb2.Profile.FromString(gzip.decompress(pb.read_bytes()))
    alpha, beta = _tids_under(msg, "alpha_leaf"), _tids_under(msg, "beta_leaf")
    assert len(alpha) == 1 and len(beta) == 1 and alpha.keys() != beta.keys(), (alpha, beta)
    (tid,) = alpha
    focused = [name for _, name in pprof_top(pb, f"-tagfocus=tid={tid}")]
    assert "alpha_leaf" in focused and "beta_leaf" not in focused, focused
    profile(broker, ss, *argv, fmt="speedscope")
    with Speedscope(ss) as page:
        shown = page.profile_names()
    print("speedscope profiles:", shown)
    spinners = [n for n in shown if "thread python3 (tid " in n]
    assert len(spinners) >= 2, shown  # the two spinning threads (the main one may show too)


def _ctypes_rows(broker: BrokerProcess, work: Path, python: str = PYTHON) -> dict[str, int]:
    out = work / "calls.folded"
    lib = str(work / "liblaunch.so")
    summary = profile(
        broker, out, "--stacks-at", f"{lib}:fake_launch", "--", python, str(work / "calls.py"), lib
    )
    assert summary["total"] == 4000, summary
    rows: dict[str, int] = {}
    for frames, n in stacks_of(out):
        assert frames[-1] == "fake_launch" and "Py_BytesMain" in frames, frames
        key = ";".join(functions(frames))
        rows[key] = rows.get(key, 0) + n
    return rows


def test_stacks_at_a_c_function_count_exactly_per_python_caller(
    broker: BrokerProcess, work: Path
) -> None:
    rows = _ctypes_rows(broker, work)
    assert rows == {"<module>;caller_a": 1000, "<module>;caller_b": 3000}, rows


def test_stacks_at_through_a_shared_build_count_exactly_per_python_caller(
    broker: BrokerProcess, work: Path, pyshared: Path
) -> None:
    # No sampled ip here: the probe's program finds libpython's code among the
    # top words of the stack (a return address into the interpreter).
    rows = _ctypes_rows(broker, work, str(pyshared))
    assert rows == {"<module>;caller_a": 1000, "<module>;caller_b": 3000}, rows


def _ptrace_scope(value: str | None) -> str | None:
    """Set kernel.yama.ptrace_scope (None: leave it); the old value."""
    path = Path("/proc/sys/kernel/yama/ptrace_scope")
    if not path.exists():
        return None
    old = path.read_text().strip()
    if value is not None:
        path.write_text(value)
    return old


@pytest.fixture
def yama_2() -> Iterator[None]:
    old = _ptrace_scope("2")
    try:
        yield
    finally:
        if old is not None:
            _ptrace_scope(old)


def test_ptrace_scope_2_changes_nothing(broker: BrokerProcess, work: Path, yama_2: None) -> None:
    out = work / "nested-yama.folded"
    profile(broker, out, "--frequency", "499", "--", PYTHON, str(work / "nested.py"))
    stacks = stacks_of(out)
    got = share(stacks, lambda s: _nested_ok(work, s))
    assert got >= 0.9, (got, _worst(work, stacks))
    rows = _ctypes_rows(broker, work)
    assert rows == {"<module>;caller_a": 1000, "<module>;caller_b": 3000}, rows


def test_another_users_python_never_appears(broker: BrokerProcess, work: Path) -> None:
    spin = work / "spin.py"
    spin.write_text("def bob_spin():\n    while True:\n        pass\nbob_spin()\n")
    spin.chmod(0o644)
    bob = run_as(BOB, [PYTHON, str(spin)], background=True)
    alice = run_as(ALICE, [PYTHON, str(work / "nested.py")], background=True)
    try:
        out = work / "all.folded"
        summary = profile(broker, out, "--duration", "2", "--frequency", "499")
    finally:
        for p in (alice, bob):
            p.kill()
            p.wait()
    assert bob.pid not in summary["processes"], summary["processes"]
    assert str(bob.pid) not in summary["python"]["processes_walked"], summary["python"]
    text = out.read_text()
    assert "bob_spin" not in text and "spin.py" not in text
    assert "outer (" in text  # alice's own Python was walked in the same run


def test_a_setuid_copy_of_python_is_never_walked(broker: BrokerProcess, work: Path) -> None:
    copy = work / "python-setuid"
    shutil.copy2(os.path.realpath(PYTHON), copy)
    os.chown(copy, 0, 0)
    copy.chmod(0o4755)
    out = work / "setuid.folded"
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
    argv += ["profile", "--frequency", "499", "--format", "folded", "-o", str(out)]
    r = run_as(ALICE, [*argv, "--", str(copy), str(work / "nested.py")], timeout=300)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    # Before its exec the child is gfxclient's own fork (alice's python3.11,
    # walkable); after it, the setuid program: never one frame of nested.py.
    assert not out.exists() or "nested.py" not in out.read_text(), out.read_text()


@pytest.fixture(scope="module")
def trixie() -> Iterator[Path]:
    """A Debian 13 minbase userland with python3 (3.13)."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        skip_or_fail("debootstrap is not installed (apt-get install debootstrap)")
        raise AssertionError  # unreachable
    root = Path(shared_dir(prefix="gfxbpf-trixie-"))
    argv = [debootstrap, "--variant=minbase", "--include=python3"]
    if os.path.exists(TRIXIE_TARBALL):
        argv.append(f"--unpack-tarball={TRIXIE_TARBALL}")
    r = subprocess.run([*argv, "trixie", str(root), MIRROR], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        skip_or_fail(f"debootstrap trixie failed: {r.stdout[-500:]}{r.stderr[-500:]}")
    (root / "w").mkdir()
    (root / "w" / "nested.py").write_text(NESTED)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_python_3_13_in_a_chroot_by_pid(broker: BrokerProcess, work: Path, trixie: Path) -> None:
    uid, gid = ensure_user(ALICE)
    chroot = [shutil.which("chroot") or "/usr/sbin/chroot", f"--userspec={uid}:{gid}"]
    chroot += [str(trixie), "/usr/bin/python3.13"]
    proc = subprocess.Popen([*chroot, "/w/nested.py"], env={"PATH": "/usr/bin:/bin"})
    try:
        out = work / "py313.folded"
        summary = profile(broker, out, "--frequency", "499", "--pid", str(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert summary["python"]["processes_walked"] == {str(proc.pid): "3.13"}, summary["python"]
    stacks = stacks_of(out)
    got = share(stacks, chain_at("/w/nested.py", native=True))
    print(f"3.13 in a chroot: {got:.3f} of {sum(n for _, n in stacks)} samples")
    assert got >= 0.9, (got, sorted(((n, s[-6:]) for s, n in stacks), reverse=True)[:3])


def test_the_policy_caps_the_python_depth(work: Path) -> None:
    """max_python_frames = 2: inner and middle, then a marker where the cut is."""
    text = policy_for(
        {"stackcopy": {"users": [ALICE], "scope": "self", "max_python_frames": 2}},
        limits={"map_bytes_per_user": 1 << 30},
    )
    with BrokerProcess.start(text) as b:
        out = work / "cut.folded"
        summary = profile(b, out, "--frequency", "499", "--", PYTHON, str(work / "nested.py"))
    stacks = stacks_of(out)

    def cut(frames: list[str]) -> bool:
        i = frames.index(CUT) if CUT in frames else -1
        return i >= 0 and functions(frames[i:])[:2] == ["middle", "inner"]

    assert share(stacks, cut) >= 0.9, sorted(((n, s[-5:]) for s, n in stacks), reverse=True)[:3]
    # Never more Python frames than the cap. (Not "no outer at all": a sample
    # that lands in outer itself, as it calls middle, rightly shows it.)
    deep = [s for s, _ in stacks if len(functions(s)) > 2]
    assert not deep, deep[:3]
    assert summary["python"]["walker"]["truncated"] > 0, summary["python"]
