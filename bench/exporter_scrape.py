"""7. gfxbpf-exporter: scrape latency and RSS with the whole catalog attached.

The exporter runs as the bench user with every catalog program it can use
without parameters, scope system (ucalls needs a pid and is left out);
programs this host cannot run are reported unattached, as the exporter
reports them. The workload first forks under `comms` new command names, so
clonecount's map holds that many keys, and the series limit is raised above
that, so a scrape carries every series. Latency is the wall time of a whole
HTTP GET of /metrics from this process; RSS is the exporter's VmRSS.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import Any

from bench.harness import BenchError, Stage, cpu_seconds, log, rss_kib
from bench.procs import stop as stop_process
from bench.stats import median, percentile
from gfxbpf.catalog.entries import load_catalog

PORT = 19438


def attachable_programs() -> list[str]:
    """Catalog programs that take no required parameter and may run host-wide."""
    return [
        p.name
        for p in load_catalog()
        if "system" in p.scopes and not any(q.required for q in p.parameters)
    ]


def _config(stage: Stage, programs: list[str], limit: int) -> str:
    lines = [
        f'listen = "127.0.0.1:{PORT}"',
        f"max_series_per_metric = {limit}",
        "[broker]",
        f'socket = "{stage.socket_path}"',
    ]
    for name in programs:
        lines += ["[[program]]", f'name = "{name}"', 'scope = "system"']
    return "\n".join(lines) + "\n"


def _get(url: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - a local URL
        body = r.read().decode()
    return time.perf_counter() - t0, body


def _wait_up(url: str, proc: subprocess.Popen[str], log_path: Any) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"gfxbpf-exporter exited:\n{log_path.read_text()}")
        try:
            body = _get(url)[1]
            if "gfxbpf_up 1.0" in body:
                return body
        except OSError:
            pass
        time.sleep(0.2)
    raise BenchError(f"gfxbpf-exporter did not connect:\n{log_path.read_text()}")


def _samples(body: str, prefix: str) -> dict[str, float]:
    out = {}
    for line in body.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def run(stage: Stage, comms: int, scrapes: int) -> dict[str, Any]:
    programs = attachable_programs()
    config = stage.work / "exporter.toml"
    config.write_text(_config(stage, programs, limit=comms * 4))
    config.chmod(0o644)
    log_path = stage.work / "exporter.log"
    url = f"http://127.0.0.1:{PORT}/metrics"
    log(f"exporter: {', '.join(programs)}")
    with open(log_path, "w") as err:
        proc = stage.as_bench_user(
            [str(stage.venv / "bin/gfxbpf-exporter"), "--config", str(config)], stderr=err
        )
    try:
        body = _wait_up(url, proc, log_path)
        rss_idle = rss_kib(proc.pid)
        log(f"exporter: {comms} command names into clonecount")
        stage.workload("comms", comms)
        log(f"exporter: {scrapes} scrapes")
        cpu0 = cpu_seconds(proc.pid)
        times = []
        for _ in range(scrapes):
            dt, body = _get(url)
            times.append(dt)
        cpu = cpu_seconds(proc.pid) - cpu0
        rss = rss_kib(proc.pid)
    finally:
        stop_process(proc, timeout=30)
    available = _samples(body, "gfxbpf_program_available")
    return {
        "programs": {k.split('"')[1]: v == 1 for k, v in available.items()},
        "comms": comms,
        "series": sum(1 for ln in body.splitlines() if ln and not ln.startswith("#")),
        "bytes": len(body.encode()),
        "scrapes": scrapes,
        "scrape_ms": {
            "p50": round(median(times) * 1000, 2),
            "p99": round(percentile(times, 99) * 1000, 2),
        },
        "read_ms_last": round(
            _samples(body, "gfxbpf_scrape_read_seconds")["gfxbpf_scrape_read_seconds"] * 1000, 2
        ),
        "cpu_ms_per_scrape": round(cpu / scrapes * 1000, 2),
        "rss_idle_kib": rss_idle,
        "rss_kib": rss,
    }
