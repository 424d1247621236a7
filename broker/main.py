"""gfxbpf-broker: the daemon's entry point.

Order matters: parse flags; --check-policy exits early; drop to exactly
CAP_BPF + CAP_PERFMON (and switch user when root with --user) BEFORE any
thread starts, since capabilities are per thread and grpc starts threads;
load policy and catalog; take the control socket from systemd (LISTEN_FDS)
or bind --socket; start gRPC if asked; tell systemd READY=1; serve until
SIGTERM/SIGINT, then stop accepting, close every session (detaching all)
and exit 0.

SIGHUP (systemctl reload: ExecReload= in gfxbpf.service) re-reads the
policy file with the same validation as at start. A policy with problems is
not applied: the broker keeps the one it has and writes a "reload" audit
record with result "error" and the problems. A valid one replaces it for
every request that starts afterwards (limits included: the gRPC token
store, lease lengths, the audit rate limit), and to what already lives:
every live attachment is decided again and detached when the new policy no
longer allows it (a Unix client's instance is its own uid's, so the map fds
it kept stop receiving data), a call on an attachment decided under an
older policy decides again first, and the gRPC tokens of users the policy
lets run nothing are dropped. The catalog is not re-read. The
signal handler only sets a flag; the main loop does the work.

Any error while starting is one line on stderr and exit status 1, never a
traceback. At run time stderr carries the audit log (JSON lines).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.config import BrokerConfig, check_policy, parse_args
from gfxbpf.broker.listening import LISTEN_BACKLOG

if TYPE_CHECKING:  # imported where they are used (gRPC only with --grpc)
    from gfxbpf.broker.grpc.server import GrpcServer
    from gfxbpf.broker.policy.rules import Policy
    from gfxbpf.broker.service import Service
    from gfxbpf.catalog.entries import Catalog

PROG = "gfxbpf-broker"
SD_LISTEN_FDS_START = 3


class StartError(Exception):
    """The broker cannot start; the message is the one line it prints."""


def listen_fds(environ: dict[str, str] | None = None) -> list[int]:
    """fds passed by systemd socket activation (LISTEN_FDS, checked against LISTEN_PID)."""
    env = os.environ if environ is None else environ
    try:
        pid = int(env.get("LISTEN_PID", ""))
        n = int(env.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    if pid != os.getpid() or n <= 0:
        return []
    return list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + n))


def _activated_socket(fds: list[int]) -> socket.socket:
    for fd in fds:
        os.set_inheritable(fd, False)
    for fd in fds:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        if s.family == socket.AF_UNIX and s.type == socket.SOCK_SEQPACKET:
            return s
        s.detach()
    raise StartError(
        f"systemd passed {len(fds)} fds (LISTEN_FDS) but none is a listening AF_UNIX "
        "SOCK_SEQPACKET socket: check gfxbpf.socket (ListenSequentialPacket=)"
    )


def bind_socket(path: str) -> socket.socket:
    """Bind and listen on path (replacing a stale socket), mode 0666."""
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        raise StartError(f"--socket {path}: directory {parent} does not exist")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StartError(f"--socket {path}: {e.strerror}") from None
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise StartError(f"--socket {path}: exists and is not a socket; remove it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: nobody listens
        else:
            probe.close()
            raise StartError(f"--socket {path}: another broker is listening on it")
        finally:
            probe.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.bind(path)
        # Connecting grants nothing: every request is checked against the policy.
        os.chmod(path, 0o666)
        s.listen(LISTEN_BACKLOG)
    except OSError as e:
        s.close()
        raise StartError(f"--socket {path}: cannot listen: {e.strerror or e}") from None
    return s


def sd_notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send state (e.g. "READY=1") to $NOTIFY_SOCKET; False when there is none."""
    env = os.environ if environ is None else environ
    addr = env.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.connect(addr)
            s.sendall(state.encode())
        except OSError:
            return False
    return True


def _load(config: BrokerConfig) -> tuple[Any, Any]:
    from gfxbpf.broker.policy.rules import Policy, PolicyError
    from gfxbpf.catalog.entries import CatalogError, load_catalog

    try:
        policy = Policy.load(config.policy)
    except PolicyError as e:
        more = (
            f" (+{len(e.problems) - 1} more: run {PROG} --check-policy)"
            if len(e.problems) > 1
            else ""
        )
        first = e.problems[0] if e.problems else str(e)
        raise StartError(f"invalid policy: {first}{more}") from None
    catalog_path = None
    if config.catalog is not None:
        p = Path(config.catalog)
        catalog_path = p / "catalog.toml" if p.is_dir() else p
    try:
        catalog = load_catalog(catalog_path)
    except CatalogError as e:
        raise StartError(f"catalog: {e}") from None
    return policy, catalog


def known_program(service: Service, name: str) -> bool:
    """Whether name is a program of the catalog or of the policy in force (audit keys)."""
    return name in service.catalog or any(e.name == name for e in service.policy.programs)


def reload_policy(
    config: BrokerConfig, service: Service, audit: AuditLog, grpc_server: GrpcServer | None
) -> bool:
    """Re-read the policy (SIGHUP); apply it when valid, else keep the old one. Audited."""
    from gfxbpf.broker.policy import report
    from gfxbpf.broker.policy.rules import Policy, PolicyError

    old = service.policy
    try:
        new = Policy.load(config.policy)
    except PolicyError as e:
        audit.error(
            "reload",
            detail=f"policy {config.policy} NOT reloaded ({len(e.problems)} problems); still "
            f"enforcing the previous one ({len(old.programs)} entries). Check it with "
            f"{PROG} --check-policy",
            problems=e.problems[:32],
        )
        return False
    except Exception as e:  # never let a reload take the broker down
        audit.error(
            "reload",
            detail=f"policy {config.policy} NOT reloaded: {type(e).__name__}: {e}; still "
            "enforcing the previous one",
        )
        return False
    warnings: list[str] = []
    with contextlib.suppress(Exception):
        warnings = report.check_warnings(new) + report.catalog_warnings(new, service.catalog)
    service.policy = new  # one reference swap: requests that start now see the new policy
    revoked = _revoke(service, new, grpc_server, audit)
    limits = new.limits
    audit.set_rate(limits.audit_lines_per_second)
    if grpc_server is not None:
        tokens = getattr(grpc_server, "tokens", None)
        if tokens is not None:
            tokens.max_ttl = limits.token_ttl_seconds
            tokens.per_user = limits.tokens_per_user
        leases = getattr(grpc_server, "leases", None)
        if leases is not None:
            leases.default_seconds = float(limits.lease_seconds)
            leases.max_seconds = float(max(limits.lease_seconds, 1))
    audit.ok(
        "reload",
        detail=f"policy {config.policy} reloaded: {len(new.programs)} entries (was "
        f"{len(old.programs)}); it applies to every request from now on; "
        f"{len(revoked['attachments'])} attachments it no longer allows were detached",
        warnings=warnings[:32],
        revoked_attachments=revoked["attachments"][:64],
        revoked_token_uids=revoked["token_uids"],
    )
    return True


def _revoke(
    service: Service, new: Policy, grpc_server: GrpcServer | None, audit: AuditLog
) -> dict[str, list[int]]:
    """Re-decide what lives under the new policy: detach the attachments it no
    longer allows (and forget their gRPC leases), and drop the tokens of users
    it lets run nothing at all."""
    out: dict[str, list[int]] = {"attachments": [], "token_uids": []}
    try:
        out["attachments"] = service.revoke_disallowed()
    except Exception as e:  # never let a reload take the broker down
        audit.error("revoke", detail=f"re-deciding attachments failed: {e}")
    leases = getattr(grpc_server, "leases", None)
    if leases is not None and out["attachments"]:
        leases.drop(set(out["attachments"]))
    tokens = getattr(grpc_server, "tokens", None)
    if tokens is not None:
        out["token_uids"] = tokens.revoke_unless(lambda c: bool(new.programs_for(c.uid, c.gids)))
    return out


def _start_grpc(
    config: BrokerConfig, service: Service, listener: socket.socket
) -> GrpcServer | None:
    """The gRPC listener if --grpc was given (None otherwise); StartError if it cannot."""
    if not config.grpc:
        return None
    from gfxbpf.broker.grpc.server import start_grpc_server, tls_from_config

    try:
        return start_grpc_server(service, config.grpc, tls_from_config(config))
    except (OSError, ValueError, RuntimeError) as e:
        listener.close()
        raise StartError(f"gRPC: {e}") from None


def _check_unprivileged_bpf(audit: AuditLog) -> None:
    """Say at start when any user may load BPF (sysctl kernel.unprivileged_bpf_disabled
    = 0): their programs can write maps whose fds they hold, frozen or not. The
    broker then still passes each user fds of that user's own instances only."""
    from gfxbpf.broker import features

    value = features.unprivileged_bpf_disabled()
    if value == 0:
        audit.error(
            "host_check",
            detail="kernel.unprivileged_bpf_disabled = 0: any user may load BPF programs, "
            "which can write the maps whose fds they hold (frozen or not). Map fds go only "
            "to their own user's instances; set the sysctl to 2 (deploy/README.md, Security)",
        )
    elif value is None:
        audit.error("host_check", detail="cannot read kernel.unprivileged_bpf_disabled")


def _check_perf_paranoid(audit: AuditLog, catalog: Catalog) -> None:
    """Say at start when the kernel lets only CAP_SYS_ADMIN open perf events
    (Debian's default level 3): every perf_event and classic tracepoint attach
    would then fail, and the policy may well grant them."""
    from gfxbpf.bpf.link import perf
    from gfxbpf.catalog.instance import perf_event_programs

    level = perf.refusing_level()
    if level is None:
        return
    names = ", ".join(perf_event_programs(catalog))
    audit.error(
        "host_check",
        detail=f"{perf.admin_only_message(level)}. Until then these programs cannot attach: "
        f"{names} (deploy/sysctl.d/60-gfxbpf.conf; deploy/README.md, Security)",
    )


def _check_bpffs(audit: AuditLog) -> None:
    """Say at start when any user may pin in a bpffs (mode 1777): a pinned map
    outlives its session and the broker, its memory charged to the broker."""
    from gfxbpf.broker import features

    for point, mode in features.open_bpffs():
        audit.error(
            "host_check",
            detail=f"{point} is a bpffs of mode {mode:o}: any user may pin the maps she is "
            f"given, keeping them past her session and the broker; chmod 0700 {point} "
            "(deploy/README.md, Security)",
        )


def _index_kernel_btf() -> None:
    """Index vmlinux BTF at start, so that the first CO-RE attach does not pay
    for it: the live-maps iterator, CO-RE, is loaded in a child (LiveMaps.probe)."""
    from gfxbpf.bpf.core.relo import CoreError
    from gfxbpf.bpf.kernel.vmlinux import kernel_target

    with contextlib.suppress(CoreError, OSError):
        kernel_target()


def _check_live_maps(service: Service, audit: AuditLog) -> None:
    """Load the live-maps iterator; say at start when the kernel cannot list map
    ids for the live map budget."""
    error = service.loader.live_maps.probe()
    if error is not None:
        audit.error(
            "host_check",
            detail=f"cannot list BPF map ids ({error}): a map "
            "charge counts as live for map_bytes_window_seconds instead of until the "
            "kernel frees the map (deploy/README.md, Security)",
        )


class _Signals:
    """SIGTERM/SIGINT ask to stop, SIGHUP to reload; the handlers only set flags
    (the main loop does the work), SIGPIPE is ignored."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.wake = threading.Event()
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stop.set()
        self.wake.set()

    def _on_hup(self, signum: int, frame: object) -> None:
        self.reload.set()
        self.wake.set()


def _serve_until_stopped(
    signals: _Signals, reload: Callable[[], bool], config: BrokerConfig, tick: Callable[[], object]
) -> None:
    """Wait for a signal: reload the policy on SIGHUP (telling systemd), return
    on stop; tick() every second (scope job: revoke what ended jobs held)."""
    while True:
        signals.wake.wait(1.0)
        signals.wake.clear()
        if signals.stop.is_set():
            return
        tick()
        if signals.reload.is_set():
            signals.reload.clear()
            now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            sd_notify(f"RELOADING=1\nMONOTONIC_USEC={now_us}")
            ok = reload()
            sd_notify(
                "READY=1\nSTATUS=serving"
                + ("" if ok else f" (last reload failed: {config.policy} invalid, old policy kept)")
            )


def _revoke_ended_jobs(service: Service, audit: AuditLog) -> None:
    """Scope job's check, every second; an error in it is logged, never the
    end of the broker."""
    try:
        service.revoke_ended_jobs()
    except Exception as e:  # noqa: BLE001 - the broker keeps serving
        audit.error("revoke", detail=f"checking scope job attachments: {type(e).__name__}: {e}")


def run(config: BrokerConfig, audit: AuditLog) -> int:
    from gfxbpf.broker.privileges import PrivilegeError, ensure_broker_privileges

    # Configuration errors first (plain file reads, no threads), then the
    # privilege drop, before anything can start a thread.
    policy, catalog = _load(config)
    try:
        privileges = ensure_broker_privileges(config.user)
    except PrivilegeError as e:
        raise StartError(f"privileges: {e}") from None
    from gfxbpf.broker.service import Service
    from gfxbpf.broker.unix.server import UnixServer

    fds = listen_fds()
    listener = _activated_socket(fds) if fds else bind_socket(config.socket)
    if fds:  # systemd's default Backlog= is 4096: a short queue is shorter to wait in
        with contextlib.suppress(OSError):
            listener.listen(LISTEN_BACKLOG)
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)

    audit.ok("start", detail=privileges.summary(), uid=privileges.uid, pid=os.getpid())
    _check_unprivileged_bpf(audit)
    _check_perf_paranoid(audit, catalog)
    _check_bpffs(audit)
    audit.set_rate(policy.limits.audit_lines_per_second)
    service = Service(policy, catalog, audit)
    audit.set_programs(lambda name: known_program(service, name))
    _index_kernel_btf()
    _check_live_maps(service, audit)
    grpc_server = _start_grpc(config, service, listener)
    signals = _Signals()

    server = UnixServer(service, listener, on_error=lambda m: audit.error("accept", detail=m))
    server.start()
    audit.ok(
        "listen",
        detail=f"policy {config.policy}: {len(policy.programs)} entries; catalog "
        f"{catalog.path}: {len(catalog)} programs",
        socket="systemd" if fds else config.socket,
        grpc=config.grpc,
    )
    sd_notify("READY=1\nSTATUS=serving")
    _serve_until_stopped(
        signals,
        lambda: reload_policy(config, service, audit, grpc_server),
        config,
        lambda: _revoke_ended_jobs(service, audit),
    )
    sd_notify("STOPPING=1")
    server.shutdown()
    if grpc_server is not None:
        grpc_server.stop()
    service.close_all()
    if not fds:
        with contextlib.suppress(OSError):
            os.unlink(config.socket)
    audit.flush_suppressed()
    audit.ok("stop", detail="signal received; every session closed")
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.check_policy:
        return check_policy(config.policy, catalog=config.catalog)
    audit = AuditLog()
    try:
        return run(config, audit)
    except StartError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # never a traceback at start: one line, exit 1
        print(f"{PROG}: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
