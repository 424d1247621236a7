"""deploy/ on the real kernel: the unit's setpriv line yields exactly the broker's
privileges, and the tracefs drop-in lets the service group (only) read ids
and formats."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import TRACEFS, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "deploy" / "gfxbpf.service"
MOUNT_DROPIN = ROOT / "deploy" / "sys-kernel-tracing.mount.d" / "gfxbpf.conf"
sys.path.insert(0, str(ROOT / "tools"))
from unit_exec import mount_options, setpriv_argv  # noqa: E402

BROKER_CAPS_MASK = (1 << 39) | (1 << 38)  # CAP_BPF | CAP_PERFMON
EVENT = "sched/sched_switch"


def test_setpriv_line_gives_the_broker_state() -> None:
    if shutil.which("setpriv") is None:
        skip_or_fail("setpriv is not installed (Debian package util-linux)")
    # The unit's capabilities and no_new_privs; a stand-in program and user,
    # since the broker and the gfxbpf user need not exist here.
    argv = setpriv_argv(
        SERVICE,
        {
            "User": "nobody",
            "Group": "nogroup",
            "ExecStart": "/bin/grep -E ^(Uid|Groups|Cap|NoNewPrivs) /proc/self/status",
        },
    )
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    status = dict(line.split(":", 1) for line in r.stdout.splitlines())
    status = {k: v.strip() for k, v in status.items()}
    assert status["Uid"].split() == ["65534"] * 4
    assert status["Groups"] == ""
    for key in ("CapPrm", "CapEff", "CapBnd", "CapAmb", "CapInh"):
        assert int(status[key], 16) == BROKER_CAPS_MASK, (key, status[key])
    assert status["NoNewPrivs"] == "1"


def free_id(exists: Callable[[int], object]) -> int:
    n = 4242
    while True:
        try:
            exists(n)
        except KeyError:
            return n
        n += 1


def in_child(uid: int, gid: int, work: Callable[[], str]) -> str:
    """Run work() as uid/gid with no supplementary groups; return its report."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = work()
        except BaseException as e:  # report everything, never return into pytest
            out = f"child error: {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def tracefs_as_deployed() -> Iterator[tuple[int, int]]:
    """tracefs remounted with the drop-in's gid=/mode=; restored afterwards.

    Yields (uid, gid) of a member of the tracefs group: the real gfxbpf user
    when it exists, else free ids standing in for it.
    """
    opts = dict(o.partition("=")[::2] for o in mount_options(MOUNT_DROPIN))
    try:
        gid = grp.getgrnam(opts["gid"]).gr_gid
        uid = pwd.getpwnam(opts["gid"]).pw_uid
    except KeyError:
        gid, uid = free_id(grp.getgrgid), free_id(pwd.getpwuid)
    before = os.stat(TRACEFS)
    old = f"gid={before.st_gid},mode={stat.S_IMODE(before.st_mode):04o}"
    new = f"gid={gid},mode={opts['mode']}"
    r = subprocess.run(["mount", "-o", f"remount,{new}", TRACEFS], capture_output=True, text=True)
    if r.returncode != 0:
        skip_or_fail(f"cannot remount tracefs with {new}: {r.stderr.strip()}")
    try:
        yield uid, gid
    finally:
        subprocess.run(["mount", "-o", f"remount,{old}", TRACEFS], check=True)


def test_tracefs_readable_by_the_group_only(tracefs_as_deployed: tuple[int, int]) -> None:
    uid, gid = tracefs_as_deployed
    event_dir = os.path.join(TRACEFS, "events", EVENT)

    def read_id_and_format() -> str:
        with open(os.path.join(event_dir, "id")) as f:
            event_id = int(f.read())
        with open(os.path.join(event_dir, "format")) as f:
            fmt = f.read()
        try:
            open(os.path.join(event_dir, "enable"), "w").close()
            enable = "writable"
        except PermissionError:
            enable = "denied"
        return f"id={event_id} format={'ID: ' in fmt} enable={enable}"

    with open(os.path.join(event_dir, "id")) as f:
        real_id = int(f.read())
    assert in_child(uid, gid, read_id_and_format) == f"id={real_id} format=True enable=denied"

    def try_read() -> str:
        try:
            open(os.path.join(event_dir, "id")).close()
            return "readable"
        except PermissionError:
            return "denied"

    other_gid = free_id(grp.getgrgid) + 1
    assert in_child(uid + 1, other_gid, try_read) == "denied"
