"""A real Prometheus server for tests: Debian's /usr/bin/prometheus on a free port.

    with PrometheusServer.start(["127.0.0.1:9438"], tmp) as prom:
        prom.value('gfxbpf_up')            # the latest sample, None if no series

It gets a temporary configuration (scrape_interval 1 s) and storage
directory, and is asked through its HTTP query API (/api/v1/query).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.procs import stop as stop_process
from tests.conftest import skip_or_fail

PROMETHEUS = "/usr/bin/prometheus"
SCRAPE_SECONDS = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:  # noqa: S310
        return str(r.read().decode())


def get_or_empty(url: str) -> str:
    """http_get, or "" while nothing answers there yet (a server still starting)."""
    try:
        return http_get(url)
    except OSError:
        return ""


def _tls_config(tls: Mapping[str, str] | None) -> str:
    if not tls:
        return ""
    lines = ["    scheme: https", "    tls_config:"]
    lines += [f"      {k}: {json.dumps(v)}" for k, v in tls.items()]
    return "\n".join(lines) + "\n"


class PrometheusServer:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, directory: Path) -> None:
        self.proc = proc
        self.port = port
        self.directory = directory
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def start(
        cls, targets: Sequence[str], tls: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> PrometheusServer:
        """tls: scrape over https with this tls_config (ca_file, cert_file, key_file)."""
        if not shutil.which(PROMETHEUS):
            skip_or_fail("prometheus is not installed (Debian package prometheus)")
        directory = Path(tempfile.mkdtemp(prefix="gfxbpf-prometheus-"))
        config = directory / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_SECONDS}s\n"
            f"  scrape_timeout: {SCRAPE_SECONDS}s\n"
            "scrape_configs:\n"
            "  - job_name: gfxbpf\n" + _tls_config(tls) + "    static_configs:\n"
            f"      - targets: {json.dumps(list(targets))}\n"
        )
        port = free_port()
        log = open(directory / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        server = cls(proc, port, directory)
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                http_get(self.url + "/-/ready", timeout=2)
                return
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return (self.directory / "prometheus.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = json.loads(http_get(url))
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The single series' latest value (None: no series); fails on several."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr}: {len(result)} series: {result}"
        return float(result[0]["value"][1])

    def wait_value(
        self, expr: str, pred: Callable[[float | None], bool], timeout: float = 30.0
    ) -> float | None:
        """Poll until pred(value) holds; the value (the last one seen on timeout)."""
        deadline = time.monotonic() + timeout
        value = self.value(expr)
        while not pred(value) and time.monotonic() < deadline:
            time.sleep(0.25)
            value = self.value(expr)
        return value

    def targets_health(self) -> list[str]:
        reply = json.loads(http_get(self.url + "/api/v1/targets"))
        return [t["health"] for t in reply["data"]["activeTargets"]]

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, 20)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
