"""Attacks on gfxclient by other ordinary users (issue 26 items 7 to 10).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); the victim is gfxtest-alice, the attacker gfxtest-mallory (whom no
policy names: the attacks need no grant), each a separate non-root user:

- 7: mallory's processes are named "\\x1b]0;PWNED\\x07…" (by writing their
  comm, and by exec'ing a file so named); alice's dump, watch (also on a real
  terminal: tmux) and stream of system-scope programs must show the names
  escaped, with no raw control character, and --json the exact strings;
- 8: a FIFO mallory planted at /tmp/perf-PID.map for alice's process must
  not hang alice's profile;
- 9: mallory squats $TMPDIR/gfxbpf-<alice's uid>: alice, without
  XDG_RUNTIME_DIR, must still keep her gRPC token (in her home) and never be
  refused a token;
- issue 35 item 10: with no usable home and that directory squatted,
  alice's short runs must not end her running `--via grpc watch`;
- 10: mallory's library carries libz's build-id and other names: alice's
  profiles must name real libz frames with libz's own names afterwards, and
  her symbol cache must hold nothing made from mallory's file;
- issue 35 items 2 and 4: mallory's process runs code from files she
  crafted (tests/hostile_elf.py), one with a 4 GiB FDE, one with an
  .eh_frame past the size cap and no .eh_frame_hdr; root's system profile
  must finish, write its file, and end those stacks in
  "[unwind stopped: bad table in FILE]";
- issue 35 item 9: a process named U+202E + "hs.nigol" (it reads "login.sh")
  shows escaped in stream, dump, watch and a system profile's table and
  flame graph, as control characters do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfxbpf.client.printable import printable
from gfxbpf.client.profiles import fileid
from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.elfsyms import function_ranges
from tests import hostile_elf
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    setpriv_user_argv,
    shared_dir,
    uid_of,
)

TOKENS_PER_USER = 2
# Mallory's process names (comm holds 15 bytes): OSC 0 sets a terminal's
# title, with a C1 CSI after it (UTF-8); OSC 52 writes the clipboard.
TITLE = "\x1b]0;PWNED\x07\u009b"
CLIPBOARD = "\x1b]52;c;SGk=\x07"
# Issue 35 item 9: a right-to-left override makes it read "login.sh".
BIDI = "\u202ehs.nigol"
NAMES = (TITLE, CLIPBOARD, BIDI)
# Bytes a terminal acts on, but the newline: C0, DEL, and C1 in UTF-8.
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
# Characters that hide or reorder what is shown: format characters and separators.
INVISIBLE = ("Cf", "Zl", "Zp")

# Mallory: name this process, then fork and exec a file of that name, for a while.
NAMED_FORKER = r"""
import os, sys, time
name, link, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if not os.path.lexists(link):
    os.symlink("/bin/true", link)
with open("/proc/self/comm", "w") as f:
    f.write(name)
end = time.time() + seconds
while time.time() < end:
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(link, [link])
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
    time.sleep(0.02)  # ~50 a second: plenty, and kind to a shared machine
"""


def broker_policy(request: pytest.FixtureRequest) -> str:
    """The module's broker (the `broker` fixture, tests/kernel/conftest.py)."""
    return policy_for(
        {
            "clonecount": {"users": [ALICE], "scope": "system"},
            "execsnoop": {"users": [ALICE], "scope": "system"},
            "syscount": {"users": [ALICE], "scope": "self"},
            "profile": [
                {"users": [ALICE], "scope": ["self", "system"], "max_frequency": 999},
                # The administrator (issue 35 items 2 and 4): root's system profile.
                {"users": ["root"], "scope": "system", "max_frequency": 999},
            ],
        },
        limits={"tokens_per_user": TOKENS_PER_USER, "map_bytes_per_user": 1 << 30},
    )


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A folder every test user can enter; each user's own folders go inside."""
    d = shared_dir(prefix="gfxbpf-clientattack-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def own_dir(parent: Path, user: str, name: str, mode: int = 0o755) -> Path:
    p = parent / name
    p.mkdir(exist_ok=True)
    os.chown(p, *ensure_user(user))
    os.chmod(p, mode)
    return p


def gfxclient(
    broker: BrokerProcess, *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[bytes]:
    """gfxclient as alice; stdout as bytes (what would reach her terminal)."""
    assert broker.grpc is not None
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--grpc", broker.grpc]
    r = run_as(ALICE, [*argv, *args], env=env, timeout=timeout, text=False)
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    return r


# ------------------------------------------------------------------ 7: terminal escapes


@pytest.fixture(scope="module")
def named_procs(work: Path) -> Iterator[None]:
    """Mallory's processes named NAMES, forking and exec'ing for the module's tests."""
    d = own_dir(work, MALLORY, "mallory-names")
    procs = [
        run_as(
            MALLORY,
            [VENV_PYTHON, "-c", NAMED_FORKER, name, str(d / name), "600"],
            background=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in NAMES
    ]
    try:
        time.sleep(0.5)
        assert all(p.poll() is None for p in procs), "mallory's processes did not start"
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def assert_escaped(out: bytes, names: tuple[str, ...] = NAMES) -> None:
    """No control byte reached the terminal; each name is there, escaped."""
    m = RAW_CONTROL.search(out)
    assert m is None, f"raw control byte {m.group()!r} in: {out[max(0, m.start() - 80) :][:200]!r}"
    text = out.decode("utf-8")
    raw = [ch for ch in text if unicodedata.category(ch) in INVISIBLE]
    assert not raw, f"raw format characters {raw[:5]!r} in: {text[:2000]!r}"
    for name in names:
        assert printable(name) in text, (printable(name), text[:2000])


def test_dump_shows_other_users_process_names_escaped(
    broker: BrokerProcess, named_procs: None
) -> None:
    args = ("dump", "clonecount", "--scope", "system", "--wait", "2")
    r = gfxclient(broker, "--via", "fd", *args)
    assert r.returncode == 0, r.stderr
    assert_escaped(r.stdout)
    # --json: the exact names, in JSON's own escapes.
    r = gfxclient(broker, "--via", "grpc", "--json", *args)
    assert r.returncode == 0, r.stderr
    assert RAW_CONTROL.search(r.stdout.rstrip(b"\n")) is None
    doc = json.loads(r.stdout)
    keys = [json.dumps(e["key"], ensure_ascii=False) for e in doc["maps"]["counts"]["entries"]]
    for name in NAMES:
        assert any(json.dumps(name, ensure_ascii=False)[1:-1] in k for k in keys), name


def test_watch_shows_them_escaped(broker: BrokerProcess, named_procs: None) -> None:
    r = gfxclient(
        broker, "watch", "clonecount", "--scope", "system", "--interval", "1", "--duration", "2.5"
    )
    assert r.returncode == 0, r.stderr
    assert_escaped(r.stdout)


def test_stream_shows_them_escaped_and_json_exact(broker: BrokerProcess, named_procs: None) -> None:
    args = ("stream", "execsnoop", "--scope", "system", "--duration", "3")
    r = gfxclient(broker, "--via", "fd", *args)
    assert r.returncode == 0, r.stderr
    assert_escaped(r.stdout)
    r = gfxclient(broker, "--via", "grpc", "--json", *args)
    assert r.returncode == 0, r.stderr
    assert RAW_CONTROL.search(r.stdout.replace(b"\n", b"")) is None
    assert not [ch for ch in r.stdout.decode() if unicodedata.category(ch) in INVISIBLE]
    comms = {json.loads(line)["event"]["comm"] for line in r.stdout.splitlines()}
    assert set(NAMES) <= comms, sorted(comms)[:20]


SPIN_NAMED = (
    "import sys, time\nopen('/proc/self/comm', 'w').write(sys.argv[1])\n"
    "end = time.time() + 60\nwhile time.time() < end:\n    pass\n"
)


def test_a_system_profile_shows_them_escaped(broker: BrokerProcess, work: Path) -> None:
    """Issue 35 item 9: mallory's busy process named U+202E "hs.nigol" in
    alice's system profile, on her terminal and in the flame graph."""
    spin = run_as(MALLORY, [VENV_PYTHON, "-c", SPIN_NAMED, BIDI], background=True)
    out = own_dir(work, ALICE, "alice-system-profile") / "system.svg"
    try:
        time.sleep(0.3)
        args = ("profile", "--scope", "system", "--duration", "2", "-o", str(out))
        r = gfxclient(broker, *args, timeout=120)
    finally:
        spin.kill()
        spin.wait()
    assert r.returncode == 0, r.stderr
    assert_escaped(r.stdout, ())
    assert b"\\x0a" not in r.stdout and r.stdout.count(b"\n") > 3  # lines stay lines
    svg = out.read_bytes()
    assert_escaped(svg, (BIDI,))


def test_watch_on_a_terminal_keeps_its_title_and_clipboard(
    broker: BrokerProcess, named_procs: None
) -> None:
    """In tmux, which acts on OSC 0 (the pane's title) and, with set-clipboard
    on, OSC 52 (a paste buffer): neither may change."""
    if shutil.which("tmux") is None:
        skip_or_fail("tmux is not installed (apt-get install tmux)")
    assert broker.grpc is not None
    server = f"gfxclient-attack-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    argv = setpriv_user_argv(
        ALICE,
        ["env", "TERM=xterm", VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket]
        + ["watch", "clonecount", "--scope", "system", "--top", "60"],
    )

    def tmux(*args: str) -> str:
        r = subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "200", "-y", "80", "sleep 600")
    try:
        tmux("set-option", "-g", "set-clipboard", "on")
        title = tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()
        tmux("respawn-pane", "-k", "-t", "t", " ".join(_quote(a) for a in argv))
        want = [printable(n) for n in NAMES]
        deadline = time.monotonic() + 60
        screen, now = "", title
        # Until the names show (escaped), or the terminal obeyed them.
        while time.monotonic() < deadline and now == title:
            screen = tmux("capture-pane", "-p", "-t", "t")
            if all(w in screen for w in want):
                break
            time.sleep(0.2)
            now = tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()
        time.sleep(1.5)  # a redraw or two more
        now = tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()
        assert now == title, f"OSC 0 retitled the terminal: {now!r}"
        assert tmux("list-buffers") == "", "OSC 52 wrote tmux's clipboard"
        assert all(w in screen for w in want), screen
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ 8: a FIFO as perf map


BUSY = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"


def test_a_fifo_planted_as_perf_map_does_not_hang_profile(broker: BrokerProcess) -> None:
    busy = run_as(ALICE, [VENV_PYTHON, "-c", BUSY], background=True)
    fifo = Path(f"/tmp/perf-{busy.pid}.map")
    # setpriv execs python: the pid run_as returns is alice's process itself.
    try:
        made = run_as(MALLORY, [VENV_PYTHON, "-c", f"import os; os.mkfifo({str(fifo)!r})"])
        assert made.returncode == 0, made.stderr
        assert fifo.stat().st_uid == uid_of(MALLORY)
        try:
            r = gfxclient(broker, "profile", "--pid", str(busy.pid), "--duration", "2", timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("gfxclient profile hung on the FIFO at " + str(fifo))
        assert r.returncode == 0, r.stderr
        assert b"samples" in r.stdout
    finally:
        busy.kill()
        busy.wait()
        fifo.unlink(missing_ok=True)


# ------------------------------------------------------------------ 9: token directory squat


def test_a_squatted_tmp_token_dir_does_not_lock_alice_out(
    broker: BrokerProcess, work: Path
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=work))  # like /tmp: root's, sticky
    os.chmod(tmp, 0o1777)
    home = own_dir(work, ALICE, "alice-home-tokens", 0o700)
    squat = tmp / f"gfxbpf-{uid_of(ALICE)}"
    r = run_as(MALLORY, ["mkdir", "-m", "700", str(squat)])
    assert r.returncode == 0 and squat.stat().st_uid == uid_of(MALLORY), r.stderr
    alice = uid_of(ALICE)

    def issued() -> int:
        recs = broker.audit_records()
        return sum(1 for x in recs if x.get("op") == "issue_token" and x.get("uid") == alice)

    before = issued()
    # XDG_RUNTIME_DIR is unset (run_as's environment has none).
    env = {"TMPDIR": str(tmp), "HOME": str(home)}
    for _ in range(TOKENS_PER_USER + 2):
        r = gfxclient(broker, "--via", "grpc", "dump", "syscount", env=env)
        assert r.returncode == 0, r.stderr
    assert issued() - before == 1, "the token was not kept: each command issued one"
    assert (home / ".cache" / "gfxbpf" / "tokens" / "tokens.json").is_file()
    # Without any cache (GFXBPF_TOKEN_CACHE=0), a new token replaces the oldest.
    for _ in range(TOKENS_PER_USER + 2):
        r = gfxclient(broker, "--via", "grpc", "dump", "syscount", env={"GFXBPF_TOKEN_CACHE": "0"})
        assert r.returncode == 0, r.stderr


def test_short_runs_without_a_token_cache_leave_a_running_watch_working(
    broker: BrokerProcess, work: Path
) -> None:
    """Issue 35 item 10: alice has no usable home and mallory squats her
    /tmp/gfxbpf-UID, so every run issues a token; five short runs replaced
    the token of her running `--via grpc watch`, which died UNAUTHENTICATED.
    A token whose client holds attachments is no longer replaced."""
    tmp = Path(tempfile.mkdtemp(prefix="tmp-nohome-", dir=work))
    os.chmod(tmp, 0o1777)
    squat = tmp / f"gfxbpf-{uid_of(ALICE)}"
    r = run_as(MALLORY, ["mkdir", "-m", "700", str(squat)])
    assert r.returncode == 0, r.stderr
    env = {"TMPDIR": str(tmp), "HOME": "/nonexistent"}  # no XDG_RUNTIME_DIR either
    assert broker.grpc is not None
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--grpc", broker.grpc]
    watch = run_as(
        ALICE,
        [*argv, "--via", "grpc", "watch", "syscount", "--interval", "1", "--duration", "25"],
        env=env,
        background=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # attached and reading
        assert watch.poll() is None, watch.stderr.read() if watch.stderr else ""
        for _ in range(TOKENS_PER_USER + 3):
            r = gfxclient(broker, "--via", "grpc", "dump", "syscount", env=env)
            assert r.returncode == 0, r.stderr
        _, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    assert "UNAUTHENTICATED" not in err and "Traceback" not in err, err


# ------------------------------------------------------------------ 10: symbol cache poisoning

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
# One function covering 256 KiB of text: every address of a library of
# libz's size falls in it. It spins rdi times.
EVIL_S = """
.text
.globl zz_spin
.type zz_spin, @function
zz_spin:
1:  dec %rdi
    jnz 1b
    ret
    .skip 0x40000, 0xcc
.size zz_spin, .-zz_spin
.section .note.GNU-stack,"",@progbits
"""
SPIN_PY = (
    "import ctypes, sys, time\nf = ctypes.CDLL(sys.argv[1]).zz_spin\n"
    "f.argtypes = [ctypes.c_long]\nend = time.time() + 3\n"
    "while time.time() < end:\n    f(10**7)\n"
)
ZLIB_PY = (
    "import os, time, zlib\nd = os.urandom(1 << 18)\nend = time.time() + 3\n"
    "while time.time() < end:\n    zlib.compress(d, 9)\n"
)


def _frames(folded: Path) -> set[str]:
    out: set[str] = set()
    for line in folded.read_text().splitlines():
        out.update(line.rpartition(" ")[0].split(";"))
    return out


def test_a_library_claiming_libz_build_id_does_not_rename_libz(
    broker: BrokerProcess, work: Path
) -> None:
    if shutil.which("gcc") is None or not os.path.exists(LIBZ):
        skip_or_fail("needs gcc and libz (apt-get install gcc zlib1g)")
    libz = read_info(LIBZ)
    assert libz is not None and libz.build_id
    # Mallory builds it: libz's build-id, her own names, stripped like libz.
    evil_dir = own_dir(work, MALLORY, "mallory-lib")
    (evil_dir / "evil.S").write_text(EVIL_S)
    evil = evil_dir / "libevil.so"
    cc = ["gcc", "-shared", "-nostdlib", "-s", f"-Wl,--build-id=0x{libz.build_id}"]
    r = run_as(MALLORY, [*cc, "-o", str(evil), str(evil_dir / "evil.S")], cwd=str(evil_dir))
    assert r.returncode == 0, r.stderr
    assert read_info(str(evil)).build_id == libz.build_id  # type: ignore[union-attr]
    # Alice's symbol cache lives in her home, as for any user with one.
    home = own_dir(work, ALICE, "alice-home-symbols", 0o700)
    cache = home / ".cache" / "gfxbpf" / "symbols"
    env = {"HOME": str(home)}
    out = own_dir(work, ALICE, "alice-profiles")

    def profile(name: str, *cmd: str) -> set[str]:
        path = out / f"{name}.folded"
        r = gfxclient(broker, "profile", "-o", str(path), "--", *cmd, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return _frames(path)

    python = "/usr/bin/python3"
    first = profile("evil", python, "-c", SPIN_PY, str(evil))
    assert "zz_spin" in first, sorted(first)[:40]
    mallorys = fileid.FileId.of(os.stat(evil)).text()
    cached = os.listdir(cache) if cache.is_dir() else []  # none when no root file was sampled
    assert not any(mallorys in k for k in cached), "mallory's file filled the cache"
    # Real libz now: its frames keep libz's names (or offsets), never mallory's.
    frames = profile("zlib", python, "-c", ZLIB_PY)
    real = {name for _, _, name in function_ranges(LIBZ)}
    assert "zz_spin" not in frames, "libz frames were named from mallory's library"
    assert frames & real or any(f.startswith("[libz.so") for f in frames), sorted(frames)[:40]
    # And the other way round: with libz cached, mallory's library keeps its own names.
    assert "zz_spin" in profile("evil-again", python, "-c", SPIN_PY, str(evil))


# ------------------------------------------------------------------ issue 35: crafted CFI

# Mallory: map a file executable (as the loader would) and spin in its code.
RUN_MAPPED = r"""
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c = ctypes
libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
base = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_EXEC, mmap.MAP_PRIVATE, fd, 0)
assert base not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
spin = ctypes.CFUNCTYPE(None, ctypes.c_long)(base + int(sys.argv[2]))
end = time.time() + 60
while time.time() < end:
    spin(10**7)
"""


def test_crafted_cfi_files_do_not_break_a_system_profile(broker: BrokerProcess, work: Path) -> None:
    d = own_dir(work, MALLORY, "mallory-cfi")
    huge_fde = [(hostile_elf.CODE_OFFSET, 0xFFFF_FFF0, b""), (hostile_elf.CODE_OFFSET + 16, 4, b"")]
    # Past build.MAX_CFI_BYTES (16 MiB): 24-byte FDEs, no .eh_frame_hdr.
    too_big = hostile_elf.many_fdes((17 << 20) // 24)
    files = {"libhuge.so": huge_fde, "libbig.so": too_big}
    procs = []
    for name, fdes in files.items():
        (d / name).write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame(fdes)))
        os.chown(d / name, *ensure_user(MALLORY))
        cmd = [VENV_PYTHON, "-c", RUN_MAPPED, str(d / name), str(hostile_elf.CODE_OFFSET)]
        procs.append(run_as(MALLORY, cmd, background=True))
    admin = Path(tempfile.mkdtemp(prefix="admin-", dir=work))  # root's, 0700
    out = admin / "system.folded"
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "profile"]
    argv += ["--scope", "system", "--duration", "3", "-o", str(out)]
    env = {**os.environ, "XDG_CACHE_HOME": str(admin / "cache")}
    try:
        time.sleep(0.5)
        assert all(p.poll() is None for p in procs), "mallory's processes did not start"
        began = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        took = time.monotonic() - began
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    # Their frames were grouped by the FDEs (the files are stripped): the
    # refused tables leave them named by file offset, and the profile whole.
    frames = _frames(out)
    for name in files:
        assert any(f.startswith(f"[{name}+") for f in frames), (name, sorted(frames)[:40])
    print(f"root's system profile with mallory's crafted files: {took:.1f} s")
    print(r.stdout[-1500:])
    assert took < 60, took
