"""Command line of gfxbpf-broker, and its --check-policy mode.

The server's main() parses with parse_args(), runs check_policy() and exits
when --check-policy is given, and otherwise starts serving with the returned
BrokerConfig.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from gfxbpf.broker.policy import report
from gfxbpf.broker.policy.rules import Policy, PolicyError

DEFAULT_POLICY = "/etc/gfxbpf/policy.toml"
DEFAULT_SOCKET = "/run/gfxbpf/control.sock"
LOG_LEVELS = ("debug", "info", "warning", "error")

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(\d{1,5})$")


@dataclass(frozen=True)
class BrokerConfig:
    policy: str
    socket: str
    grpc: str | None  # "unix:/path" or "host:port"; None = no gRPC listener
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    catalog: str | None  # None = the catalog installed with the package
    user: str | None
    check_policy: bool
    log_level: str

    @property
    def grpc_is_unix(self) -> bool:
        return self.grpc is not None and self.grpc.startswith("unix:")

    @property
    def grpc_unix_path(self) -> str | None:
        """The filesystem path of a unix: gRPC address (unix:PATH or unix:///PATH)."""
        if not self.grpc_is_unix:
            return None
        assert self.grpc is not None
        rest = self.grpc[len("unix:") :]
        return "/" + rest.lstrip("/") if rest.startswith("//") else rest


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gfxbpf-broker",
        description=(
            "Hold CAP_BPF and CAP_PERFMON and nothing else; load reviewed BPF programs "
            "for unprivileged users as the policy allows."
        ),
    )
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        metavar="FILE",
        help=f"policy TOML file (default: {DEFAULT_POLICY})",
    )
    p.add_argument(
        "--socket",
        default=DEFAULT_SOCKET,
        metavar="PATH",
        help=f"Unix control socket, SOCK_SEQPACKET (default: {DEFAULT_SOCKET}); "
        "ignored when systemd passes a socket (LISTEN_FDS)",
    )
    p.add_argument(
        "--grpc",
        metavar="ADDR",
        help="also serve gRPC on ADDR: unix:/run/gfxbpf/grpc.sock, or host:port "
        "(host:port requires --tls-cert, --tls-key and --tls-client-ca: mTLS)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM) for gRPC")
    p.add_argument("--tls-key", metavar="FILE", help="server private key (PEM) for gRPC")
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="CA bundle (PEM) that signs client certificates; clients map to users "
        "through [[tls_client]] in the policy",
    )
    p.add_argument(
        "--catalog",
        metavar="DIR",
        help="program catalog directory (default: the catalog installed with gfxbpf)",
    )
    p.add_argument(
        "--user",
        metavar="NAME",
        help="when started as root: switch to this user, keeping only CAP_BPF and CAP_PERFMON",
    )
    p.add_argument(
        "--check-policy",
        action="store_true",
        help="validate the policy, print a summary and warnings, and exit (1 if invalid)",
    )
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="default: info")
    return p


def _grpc_address_problem(addr: str) -> str | None:
    if addr.startswith("unix:"):
        rest = addr[len("unix:") :]
        if not rest or not rest.lstrip("/"):
            return f"--grpc {addr}: no socket path after unix:"
        if not rest.startswith("/"):
            return f"--grpc {addr}: use an absolute path (unix:/run/gfxbpf/grpc.sock)"
        return None
    m = _HOST_PORT.match(addr)
    if not m or not 0 < int(m.group(2)) < 65536:
        return (
            f"--grpc {addr}: expected unix:/absolute/path or host:port "
            "(e.g. 0.0.0.0:50051, [::]:50051)"
        )
    return None


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    """Parse and cross-check the flags; exits with status 2 and a message when wrong."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.grpc is not None:
        problem = _grpc_address_problem(ns.grpc)
        if problem:
            parser.error(problem)
    tls = (ns.tls_cert, ns.tls_key, ns.tls_client_ca)
    if (ns.tls_cert is None) != (ns.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if ns.tls_client_ca is not None and ns.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    if any(x is not None for x in tls) and ns.grpc is None:
        parser.error("--tls-* flags configure the gRPC listener: add --grpc host:port")
    if ns.grpc is not None and not ns.grpc.startswith("unix:") and None in tls:
        parser.error(
            f"--grpc {ns.grpc} listens on the network: it needs mTLS "
            "(--tls-cert, --tls-key and --tls-client-ca); for local use give unix:/path"
        )
    if not ns.socket.startswith("/"):
        parser.error(f"--socket {ns.socket}: use an absolute path")
    if ns.user is not None and not ns.user:
        parser.error("--user needs a user name")
    return BrokerConfig(
        policy=ns.policy,
        socket=ns.socket,
        grpc=ns.grpc,
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        tls_client_ca=ns.tls_client_ca,
        catalog=ns.catalog,
        user=ns.user,
        check_policy=ns.check_policy,
        log_level=ns.log_level,
    )


def _load_catalog(catalog: str | None) -> Any:
    """The catalog to cross-check against (None: the packaged one)."""
    from gfxbpf.catalog.entries import load_catalog

    if catalog is not None and os.path.isdir(catalog):
        catalog = os.path.join(catalog, "catalog.toml")
    return load_catalog(catalog)


def _host_warnings(policy: Policy, programs: Any) -> list[str]:
    """Entries this host's kernel settings stop: Debian's perf_event_paranoid 3
    opens no perf event to the broker (it never holds CAP_SYS_ADMIN); Ubuntu's 3
    acts as upstream's 2, so the kernel is asked."""
    from gfxbpf.bpf.link import perf
    from gfxbpf.catalog.instance import perf_event_programs

    level = perf.refusing_level_for_broker()
    if level is None:
        return []
    stopped = set(perf_event_programs(programs))
    why = f"{perf.admin_only_message(level)} (deploy/sysctl.d/60-gfxbpf.conf)"
    return [
        f"{e.where}: program {e.name!r} cannot attach on this host: {why}"
        for e in policy.programs
        if e.name in stopped
    ]


def check_policy(
    path: str, out: TextIO | None = None, *, catalog: str | None = None, use_catalog: bool = True
) -> int:
    """--check-policy: print a summary and warnings; return the exit status (0 valid, 1 not).

    With use_catalog, entries are also compared with the catalog (names,
    hashes, scopes); a catalog that cannot be loaded is reported as a warning.
    """
    stream = out if out is not None else sys.stdout
    try:
        policy = Policy.load(path)
    except PolicyError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=stream)
        print(f"{path}: INVALID ({len(e.problems)} problems)", file=stream)
        return 1
    print(report.summary(policy), file=stream)
    warnings = report.check_warnings(policy)
    if use_catalog:
        try:
            programs = _load_catalog(catalog)
            warnings += report.catalog_warnings(policy, programs)
            warnings += _host_warnings(policy, programs)
        except Exception as e:  # a broken catalog is the catalog's problem, not the policy's
            warnings.append(f"catalog not checked: {e}")
    for w in warnings:
        print(f"warning: {w}", file=stream)
    print(f"{path}: OK" + (f" ({len(warnings)} warnings)" if warnings else ""), file=stream)
    return 0
