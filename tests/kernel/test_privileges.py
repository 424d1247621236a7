"""The broker's privilege drop on the real kernel.

Each scenario runs in a forked child (the drop is irreversible), which reports
back through a pipe as JSON.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import prctl
import pytest

from gfxbpf.broker import privileges
from gfxbpf.broker.privileges import BROKER_CAPS_MASK, PrivilegeError

NOBODY = 65534
_SYS_BPF = 321  # x86-64
_BPF_MAP_CREATE = 0
_BPF_MAP_TYPE_ARRAY = 2
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2


def run_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                result = fn()
            except BaseException as e:  # report every failure to the parent
                result = {
                    "error": type(e).__name__,
                    "message": str(e),
                    "tb": traceback.format_exc(),
                }
            os.write(w, json.dumps(result).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return json.loads(data)


def status_lines() -> dict[str, str]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in (
                "CapInh",
                "CapPrm",
                "CapEff",
                "CapBnd",
                "CapAmb",
                "NoNewPrivs",
                "Uid",
                "Gid",
                "Groups",
            ):
                out[key] = value.strip()
    return out


def bpf_map_create() -> int:
    """BPF_MAP_CREATE an 1-entry array; return the fd or -errno."""
    attr = ctypes.create_string_buffer(struct.pack("IIII", _BPF_MAP_TYPE_ARRAY, 4, 8, 1), 128)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_BPF, _BPF_MAP_CREATE, attr, 128)
    return fd if fd >= 0 else -ctypes.get_errno()


@pytest.fixture
def root_only_file():
    fd, path = tempfile.mkstemp(prefix="gfxbpf-secret-", dir="/tmp")
    os.write(fd, b"secret")
    os.close(fd)
    os.chmod(path, 0o600)
    yield path
    os.unlink(path)


def _after_drop(report: privileges.PrivilegeReport, secret: str | None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "status": status_lines(),
        "summary": report.summary(),
        "uid": report.uid,
        "switched": report.switched_user,
        "dropped": list(report.dropped),
        "warnings": list(report.warnings),
        "resuid": list(os.getresuid()),
        "resgid": list(os.getresgid()),
        "groups": os.getgroups(),
    }
    if secret is not None:
        try:
            with open(secret, "rb"):
                res["secret"] = "opened"
        except PermissionError as e:
            res["secret"] = errno.errorcode[e.errno]
    fd = bpf_map_create()
    res["map_create"] = "ok" if fd >= 0 else errno.errorcode[-fd]
    if fd >= 0:
        os.close(fd)
    return res


def assert_exact_state(status: dict[str, str]) -> None:
    assert status["CapEff"] == "000000c000000000"
    assert status["CapPrm"] == "000000c000000000"
    assert status["CapBnd"] == "000000c000000000"
    assert status["CapInh"] == "0000000000000000"
    assert status["CapAmb"] == "0000000000000000"
    assert status["NoNewPrivs"] == "1"


def test_root_to_nobody(root_only_file):
    def child() -> dict[str, Any]:
        report = privileges.ensure_broker_privileges("nobody")
        return _after_drop(report, root_only_file)

    res = run_child(child)
    assert "error" not in res, res
    assert_exact_state(res["status"])
    assert res["status"]["Uid"].split() == [str(NOBODY)] * 4
    assert res["resuid"] == [NOBODY] * 3
    assert res["resgid"] == [NOBODY] * 3
    assert res["groups"] == []
    assert res["switched"] is True and res["uid"] == NOBODY
    assert "cap_sys_admin" in res["dropped"] and "cap_bpf" not in res["dropped"]
    assert res["warnings"] == []
    # No CAP_DAC_OVERRIDE any more: a root-only file stays closed.
    assert res["secret"] == "EACCES"
    # CAP_BPF still works (unprivileged_bpf_disabled would refuse uid 65534 otherwise).
    assert res["map_create"] == "ok"
    assert "cap_perfmon,cap_bpf" in res["summary"] and "000000c000000000" in res["summary"]


def test_nobody_without_caps_cannot_create_maps():
    # The control for test_root_to_nobody: the same uid without the caps is refused.
    def child() -> dict[str, Any]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        return {"map_create": bpf_map_create()}

    res = run_child(child)
    assert res["map_create"] in (-errno.EPERM, -errno.EACCES)


def test_preset_service_user_drops_extras():
    # Like systemd AmbientCapabilities= / setpriv: the process starts as the
    # service user with bpf+perfmon in every set, including inheritable and ambient.
    def child() -> dict[str, Any]:
        for cap in range(privileges._cap_last_cap() + 1):
            if cap not in privileges.BROKER_CAPS:
                prctl.capbset_drop(cap)
        prctl.set_keepcaps(True)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        privileges._set_caps(prctl, BROKER_CAPS_MASK, BROKER_CAPS_MASK, BROKER_CAPS_MASK)
        for cap in privileges.BROKER_CAPS:
            privileges._libc_prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap)
        before = status_lines()
        report = privileges.ensure_broker_privileges(None)
        res = _after_drop(report, None)
        res["before"] = before
        return res

    res = run_child(child)
    assert "error" not in res, res
    assert res["before"]["CapAmb"] == "000000c000000000"  # the setup did what it says
    assert res["before"]["CapInh"] == "000000c000000000"
    assert_exact_state(res["status"])
    assert res["switched"] is False and res["uid"] == NOBODY
    assert res["dropped"] == []
    assert res["map_create"] == "ok"


def test_service_user_named_explicitly_is_not_a_switch():
    def child() -> dict[str, Any]:
        for cap in range(privileges._cap_last_cap() + 1):
            if cap not in privileges.BROKER_CAPS:
                prctl.capbset_drop(cap)
        prctl.set_keepcaps(True)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        privileges._set_caps(prctl, BROKER_CAPS_MASK, BROKER_CAPS_MASK, 0)
        return _after_drop(privileges.ensure_broker_privileges("nobody"), None)

    res = run_child(child)
    assert "error" not in res, res
    assert res["switched"] is False
    assert_exact_state(res["status"])


def test_full_bounding_set_without_setpcap_is_refused():
    # A user process has the full bounding set; without CAP_SETPCAP it cannot shrink it.
    def child() -> dict[str, Any]:
        prctl.set_keepcaps(True)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        privileges._set_caps(prctl, BROKER_CAPS_MASK, BROKER_CAPS_MASK, 0)
        try:
            privileges.ensure_broker_privileges(None)
        except PrivilegeError as e:
            return {"refused": str(e), "status": status_lines()}
        return {"refused": None}

    res = run_child(child)
    msg = res["refused"]
    assert msg, res
    assert f"CapBnd is {res['status']['CapBnd']}, not 000000c000000000" in msg
    assert res["status"]["CapBnd"] == status_lines()["CapBnd"]  # the parent's, untouched
    assert "also holds cap_chown" in msg
    assert res["status"]["NoNewPrivs"] == "1"  # what could be done was done
    assert "CAP_SETPCAP" in msg and "CapabilityBoundingSet=CAP_BPF CAP_PERFMON" in msg


def test_no_caps_is_refused_with_fix():
    def child() -> dict[str, Any]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        try:
            privileges.ensure_broker_privileges(None)
        except PrivilegeError as e:
            return {"refused": str(e), "status": status_lines()}
        return {"refused": None}

    res = run_child(child)
    msg = res["refused"]
    assert msg and "needs CAP_BPF and CAP_PERFMON" in msg
    assert "lacks cap_perfmon,cap_bpf" in msg
    assert "--user gfxbpf" in msg and "AmbientCapabilities=CAP_BPF CAP_PERFMON" in msg
    assert res["status"]["CapEff"] == "0000000000000000"  # nothing was changed


def test_unknown_user_and_root_user_refused():
    def child() -> dict[str, Any]:
        out = {}
        for name in ("no-such-user-gfxbpf", "root"):
            try:
                privileges.ensure_broker_privileges(name)
                out[name] = None
            except PrivilegeError as e:
                out[name] = str(e)
        out["status"] = status_lines()
        return out

    res = run_child(child)
    assert "--user no-such-user-gfxbpf: no such user" in res["no-such-user-gfxbpf"]
    assert "is root" in res["root"]
    # Both refusals happen before any change.
    assert res["status"]["CapEff"] != "000000c000000000"


def test_root_without_user_warns():
    def child() -> dict[str, Any]:
        report = privileges.ensure_broker_privileges(None)
        return _after_drop(report, None)

    res = run_child(child)
    assert "error" not in res, res
    assert_exact_state(res["status"])
    assert res["uid"] == 0
    assert any("uid 0" in w for w in res["warnings"])


def test_threads_refused():
    import threading

    def child() -> dict[str, Any]:
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            privileges.ensure_broker_privileges("nobody")
            return {"refused": None}
        except PrivilegeError as e:
            return {"refused": str(e)}
        finally:
            stop.set()
            t.join()

    res = run_child(child)
    assert res["refused"] and "threads are running" in res["refused"]
