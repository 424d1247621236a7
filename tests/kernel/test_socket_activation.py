"""Socket activation as gfxbpf.socket + gfxbpf.service do it, without systemd as pid 1.

systemd-socket-activate (from the systemd package) stands in for the socket
unit: it listens on the control socket, and on the first connection execs
the unit's ExecStart line with the socket as fd 3 (LISTEN_FDS, LISTEN_PID,
LISTEN_FDNAMES). The first client connects before any broker runs and must
still be served; the broker must use fd 3, never bind --socket, and leave
the socket file (the socket unit's) in place when it stops.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
from pathlib import Path

from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BROKER_CAPS_MASK,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
    uid_of,
)

GFXCLIENT = str(Path(VENV_PYTHON).parent / "gfxclient")


def test_first_client_activates_the_broker_which_serves_on_fd_3(tmp_path: Path) -> None:
    if shutil.which("systemd-socket-activate") is None:
        skip_or_fail("systemd-socket-activate is not installed (Debian package systemd)")
    policy = policy_for({"syscount": {"users": [ALICE], "scope": "self"}})
    broker = BrokerProcess.start(policy, tmp_path, grpc=False, socket_activated=True)
    try:
        mode = stat.S_IMODE(os.stat(broker.socket).st_mode)
        assert mode == 0o666  # SocketMode= of deploy/gfxbpf.socket
        # Nothing has connected yet: no broker runs, only the socket's holder.
        assert broker.cmdline()[0] == "systemd-socket-activate"
        assert not broker.audit_records()

        listed = run_as(ALICE, [GFXCLIENT, "--socket", broker.socket, "--json", "list"])
        assert listed.returncode == 0, listed.stderr + broker.stderr()
        assert [p["name"] for p in json.loads(listed.stdout)["programs"]] == ["syscount"]
        broker.wait_ready()

        # The connection made the holder exec the unit's line, in the same pid.
        assert any(a.endswith("gfxbpf-broker") for a in broker.cmdline())
        status = broker.status()
        assert status["Uid"].split()[0] == str(uid_of("gfxbpf"))
        for key in ("CapEff", "CapPrm", "CapBnd"):
            assert int(status[key], 16) == BROKER_CAPS_MASK, key
        assert status["NoNewPrivs"] == "1"
        listen = [r for r in broker.audit_records() if r.get("op") == "listen"]
        assert len(listen) == 1 and listen[0]["socket"] == "systemd", listen
        assert not (Path(broker.socket).parent / "not-used.sock").exists()
        served = [r for r in broker.audit_records() if r.get("uid") == uid_of(ALICE)]
        assert served and all(r["result"] == "ok" for r in served), served

        # A later session on the same inherited socket: real data.
        watch = run_as(
            ALICE,
            [GFXCLIENT, "--socket", broker.socket, "--json", "watch", "syscount"]
            + ["--once", "--interval", "0.2"],
        )
        assert watch.returncode == 0, watch.stderr
        snapshot = json.loads(watch.stdout.splitlines()[-1])
        assert snapshot["program"] == "syscount" and snapshot["maps"]

        broker.proc.send_signal(signal.SIGTERM)  # systemctl stop gfxbpf.service
        assert broker.proc.wait(15) == 0, broker.stderr()
        # The socket is the socket unit's: the broker leaves it for the next start.
        assert stat.S_ISSOCK(os.stat(broker.socket).st_mode)
    finally:
        broker.stop()
