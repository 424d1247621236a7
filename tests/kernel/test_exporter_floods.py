"""The exporter's /metrics listener under a header flood (issue #26, finding 6).

The broker runs as deployed (brokerenv), the exporter from its unit's
ExecStart as its own unprivileged user, listening on plain HTTP on
loopback. gfxtest-mallory, an ordinary local user, opens FLOOD_CONNECTIONS
connections and sends each a request line and then header lines of 60 KB
(each within the standard library's own line limit), never the blank line
that ends them, reconnecting whenever the exporter hangs up, for
FLOOD_SECONDS. Before the fix the exporter kept every line of every
connection (~6 MB each; 30 -> 391 MB in the review, past the unit's
MemoryMax=256M). Now: its peak RSS (VmHWM) grows by less than
RSS_GROWTH_MB, and a scrape during the flood is served.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.procs import stop as stop_process
from tests.kernel.brokerenv import (
    BROKER_USER,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
    wait_until,
)
from tests.kernel.promenv import free_port, http_get
from tests.kernel.test_exporter import EXPORTER_USER, start_exporter

pytestmark = pytest.mark.kernel

FLOOD_CONNECTIONS = 60
FLOOD_SECONDS = 8.0
RSS_GROWTH_MB = 48

# Mallory: argv port, connections, seconds. Header lines of 60 KB, 20 per
# connection per second, never the end of the headers; prints what happened.
FLOOD = """
import json, socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
line = b"X-Flood: " + b"a" * 60000 + b"\\r\\n"

def count(errors, what):
    errors[what] = errors.get(what, 0) + 1

def opened():
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n")
    s.settimeout(0.05)
    return s

conns, sent, reopened, errors = [], 0, 0, {}
t0 = time.monotonic()
for _ in range(n):
    conns.append(opened())
opening = time.monotonic() - t0
print(json.dumps({"open": n}), flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for i, s in enumerate(conns):
        try:
            s.sendall(line)
            sent += len(line)
        except OSError as e:  # hung up on (or our send is stuck): start again
            count(errors, type(e).__name__)
            s.close()
            try:
                conns[i] = opened()
                reopened += 1
            except OSError as e:
                count(errors, "reopen " + type(e).__name__)
    time.sleep(0.05)
report = {"sent_mb": sent >> 20, "reopened": reopened, "errors": errors}
print(json.dumps({**report, "opening_s": round(opening, 2)}), flush=True)
"""


@dataclass
class Exporter:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def kb(self, key: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.proc.pid}/status")

    def scrape(self, timeout: float = 5.0) -> str:
        return http_get(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout)


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    ensure_user(EXPORTER_USER)
    base = shared_dir(None, prefix="gfxbpf-exporter-flood-")
    run = base / "run"
    run.mkdir()
    os.chown(run, *ensure_user(BROKER_USER))
    os.chmod(run, 0o755)
    sock = str(run / "control.sock")
    policy = policy_for({"syscount": {"users": [EXPORTER_USER], "scope": "self"}})
    broker = BrokerProcess.start(policy, base, grpc=False, overrides={"--socket": sock})
    proc = None
    try:
        port = free_port()
        config = base / "exporter.toml"
        config.write_text(
            f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{sock}"\nvia = "fd"\n'
            '[[program]]\nname = "syscount"\nscope = "self"\n'
        )
        os.chmod(config, 0o644)
        proc = start_exporter(config, base / "exporter.log")
        e = Exporter(proc, port, base / "exporter.log")
        assert wait_until(lambda: _serving(e), 30), e.log.read_text()
        yield e
    finally:
        if proc is not None:
            stop_process(proc, timeout=10)
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


def _serving(e: Exporter) -> bool:
    try:
        return "gfxbpf_up 1.0" in e.scrape()
    except OSError:
        return False


def test_endless_header_lines_do_not_grow_the_exporter(exporter: Exporter) -> None:
    script = exporter.log.parent / "flood.py"
    script.write_text(FLOOD)
    os.chmod(script, 0o644)
    before_kb = exporter.kb("VmRSS")
    flood = run_as(
        MALLORY,
        [VENV_PYTHON, str(script), str(exporter.port), str(FLOOD_CONNECTIONS), str(FLOOD_SECONDS)],
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        assert json.loads(flood.stdout.readline()) == {"open": FLOOD_CONNECTIONS}
        time.sleep(FLOOD_SECONDS / 2)
        t0 = time.monotonic()
        text = exporter.scrape(timeout=5.0)  # during the flood
        scrape_s = time.monotonic() - t0
        out, err = flood.communicate(timeout=FLOOD_SECONDS + 60)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait(10)
    assert flood.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    print(f"flood {report}, scrape {scrape_s:.2f} s", file=sys.stderr)
    assert report["sent_mb"] >= 100, report  # the flood did send what it says
    assert "gfxbpf_up 1.0" in text
    grew_mb = (exporter.kb("VmHWM") - before_kb) / 1024
    print(f"exporter peak RSS grew by {grew_mb:.1f} MB", file=sys.stderr)
    assert grew_mb < RSS_GROWTH_MB, f"peak RSS grew by {grew_mb:.0f} MB ({report})"
    assert exporter.proc.poll() is None
    assert "gfxbpf_up 1.0" in exporter.scrape()
