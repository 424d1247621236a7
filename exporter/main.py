"""gfxbpf-exporter: serve the broker's maps as Prometheus metrics.

Runs as an ordinary user that the broker's policy names (gfxbpf-exporter),
attaches the programs its configuration lists, and answers /metrics with the
maps as they are at that moment. Errors are sentences, never tracebacks.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import TextIO

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)

from gfxbpf.exporter import listener
from gfxbpf.exporter.collector import GfxbpfCollector
from gfxbpf.exporter.config import ConfigError, ExporterConfig, load_config

PROG = "gfxbpf-exporter"
DEFAULT_CONFIG = "/etc/gfxbpf-exporter/exporter.toml"
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
Serve gfxbpf's BPF maps as Prometheus metrics, as an unprivileged client of
the broker. Each scrape of /metrics reads the maps at that moment.
"""

EPILOG = f"""\
configuration (TOML, default {DEFAULT_CONFIG}):
  listen = "127.0.0.1:9438"        # HOST:PORT for /metrics
  max_series_per_metric = 1000     # more keys are dropped (largest kept) and
                                   # counted in gfxbpf_dropped_series_total
  [listen_tls]                     # optional HTTPS; with client_ca only scrapers
  cert = "/etc/gfxbpf-exporter/exporter.crt"  # holding a certificate it signed get an
  key = "/etc/gfxbpf-exporter/exporter.key"   # answer (otherwise anyone who reaches the
  client_ca = "/etc/gfxbpf-exporter/ca.crt"   # port reads the metrics)
  [broker]                         # default: the local Unix socket
  socket = "/run/gfxbpf/control.sock"
  # grpc = "broker.example:50051"  # a remote broker, with mTLS:
  # tls_ca = "...", tls_cert = "...", tls_key = "..."
  [[program]]                      # one per program (gfxclient list)
  name = "syscount"
  scope = "system"                 # or "self"; the policy must allow it
  # maps = ["counts"]              # default: every map it shows
  # pid, library, functions        # for ucalls
  # (cuda: pid only, a process of the exporter's own user; its libcuda is
  #  found in /proc/PID/maps as gfxclient watch cuda finds it)
examples:
  {PROG} --check-config /etc/gfxbpf-exporter/exporter.toml
  {PROG} --config exporter.toml --once | promtool check metrics   (counts over 1 s)
  {PROG} --config exporter.toml --once --wait 10                  (counts over 10 s)
exit codes:
  {EXIT_OK}  success   {EXIT_RUNTIME}  cannot listen   {EXIT_USAGE}  bad configuration or usage
"""


ONCE_WAIT = 1.0  # --once: seconds of activity the scrape covers


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"--wait takes 0 to 3600 seconds, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG, help="configuration file")
    p.add_argument(
        "--check-config",
        metavar="FILE",
        help="validate FILE, print what it would attach, and exit (2 if it is invalid)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="attach, wait --wait seconds, print one scrape to stdout and exit (no server): "
        "the counters then hold what happened in that interval",
    )
    p.add_argument(
        "--wait",
        type=_seconds,
        default=ONCE_WAIT,
        metavar="S",
        help=f"with --once: seconds between attaching and the scrape (default {ONCE_WAIT:g})",
    )
    p.add_argument("--json", action="store_true", help="--check-config: print JSON")
    return p.parse_args(argv)


def check_config(path: str, as_json: bool, out: TextIO) -> int:
    config = load_config(path)
    if as_json:
        summary = {
            "listen": f"{config.host}:{config.port}",
            "max_series_per_metric": config.max_series_per_metric,
            "broker": vars(config.broker),
            "listen_tls": vars(config.tls) if config.tls else None,
            "programs": [vars(p) for p in config.programs],
        }
        print(json.dumps(summary, indent=2, default=list), file=out)
        return EXIT_OK
    where = config.broker.grpc or config.broker.socket or "the default Unix socket"
    scheme = "https" if config.tls else "http"
    mtls = " (client certificates required)" if config.tls and config.tls.client_ca else ""
    print(
        f"{path}: valid; {scheme}://{config.host}:{config.port}/metrics{mtls}, broker {where}",
        file=out,
    )
    for p in config.programs:
        maps = ", ".join(p.maps) or "every map"
        target = f", pid {p.pid}" if p.pid is not None else ""
        print(f"  {p.name} (scope {p.scope or 'from the policy'}{target}): {maps}", file=out)
    return EXIT_OK


def registry_for(collector: GfxbpfCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    return registry


def serve(config: ExporterConfig, collector: GfxbpfCollector) -> int:
    registry = registry_for(collector)
    collector.open()  # attach now, so counting starts before the first scrape
    try:
        server, thread = listener.start(config.host, config.port, registry, config.tls)
    except listener.TlsFilesError as e:
        collector.close()
        print(f"{PROG}: {config.source}: [listen_tls]: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        collector.close()
        print(
            f"{PROG}: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr
        )
        return EXIT_RUNTIME
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"{PROG}: serving /metrics on {config.host}:{config.port}", file=sys.stderr)
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    collector.close()
    return EXIT_OK


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    out = out or sys.stdout
    try:
        if args.check_config:
            return check_config(args.check_config, args.json, out)
        config = load_config(args.config)
    except ConfigError as e:
        for problem in e.problems:  # every problem found, one a line
            print(f"{PROG}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    collector = GfxbpfCollector(config)
    if args.once:
        try:
            # Counters start at the attach: a scrape right after it shows nearly nothing.
            if collector.open():
                time.sleep(args.wait)
            out.write(generate_latest(registry_for(collector)).decode())
        finally:
            collector.close()
        return EXIT_OK
    return serve(config, collector)


if __name__ == "__main__":
    sys.exit(main())
