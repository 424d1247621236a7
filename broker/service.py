"""The broker's operations, independent of the transport.

The Unix-socket server (unix/server.py) and the gRPC server (grpc/server.py)
are thin adapters: they identify the caller, hold an Owner per session (or
per gRPC token), and call these methods. Every operation writes one audit
line (uid, pid, op, program, sha256, scope, result). Errors are BrokerError
carrying a protocol ErrorCode and, for policy refusals, the rule.

Attach, in order: find the object (catalog name or uploaded bytes, hashed
once) and ask the policy (hash, user, scope; broker/request/resolve.py), run the
static audit (broker/review/objects.py), check parameters (pid ownership by pidfd,
library and function globs; broker/request/params.py), then join a live identical
instance or load a new one (broker/instances.py): .rodata knobs (scope
uid/pid, tracepoint field offsets), charge the client-visible maps to the
caller's map budget (broker/access/budget.py), load with every client-visible map
but ring buffers frozen, attach.

fds returned by attach() are the broker's own (the instance's map fds):
send them with SCM_RIGHTS and do NOT close them; they stay valid while the
attachment lives (the session handles one request at a time).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.link import tracefs
from gfxbpf.broker import features, replies, streaming
from gfxbpf.broker.attachments import Attachments
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.bookkeeping import Bookkeeping, revoked_error
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.instances import InstanceLoader, SharedInstance
from gfxbpf.broker.owners import Attachment, Owner, Owners
from gfxbpf.broker.policy.rules import Policy, ProgramEntry
from gfxbpf.broker.request.params import Target, check_params
from gfxbpf.broker.request.resolve import Resolved, resolve
from gfxbpf.broker.review.objects import Objects
from gfxbpf.broker.sharing.registry import InstanceKey
from gfxbpf.catalog.entries import Catalog
from gfxbpf.proto import gfxbpf_pb2 as pb

PROTOCOL_VERSION = 1


def _broker_version() -> str:
    """The installed version, from the dist-info directory's name: importlib.metadata
    imports email, zipfile, csv... (~0.7 MiB of the idle broker's RSS), so it is the
    fallback only."""
    for entry in sys.path:
        with contextlib.suppress(OSError):
            for name in os.listdir(entry or "."):
                if name.startswith("gfxbpf-") and name.endswith(".dist-info"):
                    return name[len("gfxbpf-") : -len(".dist-info")]
    try:
        from importlib.metadata import version

        return version("gfxbpf")
    except Exception:
        return "0.1.0"


BROKER_VERSION = _broker_version()


def _unpriv_note(fds: Sequence[int]) -> dict[str, str]:
    """For an attach line that passed fds: whether the host lets their holder
    load BPF (its programs could write those maps; they are the user's own)."""
    if fds and features.unprivileged_bpf_allowed():
        return {"unprivileged_bpf": "allowed"}
    return {}


class TokenIssuer(Protocol):
    """What issue_token needs from the gRPC side (grpc_server's token store).

    issue() returns (token, expires_unix); it raises BrokerError when it refuses.
    """

    def issue(self, caller: Caller, ttl_seconds: int) -> tuple[str, int]: ...


class Service(Bookkeeping):
    """The operations (audit lines, owners and lookups: bookkeeping.py). The
    gRPC server sets `service.tokens` to its token store; without one (no
    --grpc), IssueToken answers UNAVAILABLE."""

    def __init__(
        self,
        policy: Policy,
        catalog: Catalog,
        audit: AuditLog,
        *,
        clock: Callable[[], float] = time.monotonic,
        event_exists: Callable[[str, str], bool] = tracefs.event_exists,
        read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
    ) -> None:
        self.policy = policy
        self.catalog = catalog
        self.audit = audit
        self.clock = clock
        self.tokens: TokenIssuer | None = None
        self._event_exists = event_exists
        self._read_format = read_format
        self._owners = Owners()
        self._objects = Objects()
        self.loader = InstanceLoader(lambda: self.policy, clock, event_exists, read_format)
        # Through self._create, which tests replace to keep away from the kernel.
        self._attachments = Attachments(
            lambda: self.policy, lambda c, r, t, k: self._create(c, r, t, k)
        )

    def close_all(self) -> None:
        """Close every owner (shutdown)."""
        for o in self._owners.all():
            self.close_owner(o)
        self.loader.warm.close()  # what those released was parked

    # ------------------------------------------------------------ Hello, ListPrograms

    def hello(self, caller: Caller, req: pb.HelloRequest) -> pb.HelloReply:
        release = os.uname().release
        reply = pb.HelloReply(
            protocol=PROTOCOL_VERSION,
            broker_version=BROKER_VERSION,
            kernel_release=release,
            features=pb.Features(
                direct_map_reads=features.direct_map_reads(release),
                bpf_stats=features.bpf_stats_enabled(),
            ),
            uid=caller.uid,
            gid=caller.gid,
            pid=caller.pid,
            possible_cpus=bpfsys.possible_cpus(),
        )
        # Checked on each session: an administrator may change it at any time.
        extra = {"unprivileged_bpf": "allowed"} if features.unprivileged_bpf_allowed() else {}
        self._log("hello", caller, "ok", detail=req.client_version or None, **extra)
        return reply

    def list_programs(self, caller: Caller, req: pb.ListProgramsRequest) -> pb.ListProgramsReply:
        by_name: dict[str, list[ProgramEntry]] = {}
        for e in self.policy.programs_for(caller.uid, caller.gids):
            by_name.setdefault(e.name, []).append(e)
        reply = pb.ListProgramsReply()
        for name, group in by_name.items():
            reply.programs.append(
                replies.listing(self.catalog, name, group, self._event_exists, self._read_format)
            )
        self._log("list_programs", caller, "ok", detail=f"{len(reply.programs)} programs")
        return reply

    # ------------------------------------------------------------ Attach

    def attach(
        self, caller: Caller, owner: Owner, req: pb.AttachRequest, fds: Sequence[int] = ()
    ) -> tuple[pb.AttachReply, list[int]]:
        """Attach; fds are those that came with a Unix-socket request (the caller
        keeps and closes them; the broker duplicates what it needs)."""
        started = time.perf_counter()  # the audit record says how long attaching took
        name = req.name if req.WhichOneof("program") == "name" else None
        fields: dict[str, object] = {"program": name}
        policy = self.policy  # decided under one policy; _recheck covers a reload meanwhile
        try:
            self._check_owner(caller, owner)
            res = resolve(policy, self.catalog, self._objects, caller, req, fields)
            fields.update(program=res.entry.name, sha256=res.sha256, scope=res.scope)
            self._objects.audit(res.data, res.sha256, res.entry.name)
            if req.params.job:  # scope job: which Slurm job (checked in check_params)
                fields["job"] = req.params.job
            target = check_params(policy, caller, res, req.params, fds)
            try:
                att, joined = self._attachments.acquire(caller, owner, res, target)
            finally:
                target.close()
            att.policy = policy
            self._recheck(owner, att)
            pass_fds = self._pass_fds(caller, att)
            with self._pin(owner, att):  # a reload may revoke it this very moment
                reply, fds = replies.describe(att, joined, pass_fds=pass_fds)
            reply.skipped_functions.extend(target.skipped)
            if target.skipped:
                fields["skipped_functions"] = len(target.skipped)
            if target.symbols:
                fields["symbols"] = target.symbols
            if target.children:  # the pid's descendants too: who else was traced
                fields["children"] = True
        except BrokerError as e:
            raise self._fail("attach", caller, e, **fields) from None
        except Exception as e:  # a broker bug: report it, keep serving
            err = BrokerError(pb.ERROR_INTERNAL, f"internal error: {type(e).__name__}: {e}")
            raise self._fail("attach", caller, err, **fields) from e
        self._log(
            "attach",
            caller,
            "ok",
            attachment_id=att.id,
            shared=joined,
            warm=att.shared.warm,  # a parked instance, attached without a load
            map_bytes=0 if joined else att.shared.map_bytes,  # charged to the map budget
            fds=len(fds),
            **_unpriv_note(fds),
            rule=res.rule,
            via=res.via,
            prog_ids=[p.prog_id for p in reply.programs],
            elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
            **fields,
        )
        return reply, fds

    def _pass_fds(self, caller: Caller, att: Attachment) -> bool:
        """Whether the reply carries map fds: over the Unix socket, and only of an
        instance no other uid shares (instance_uid). A program the user loads
        could write through such an fd where kernel.unprivileged_bpf_disabled
        is 0, so this is checked on every attach rather than assumed."""
        if caller.transport != "unix":
            return False
        if att.key.uid != caller.uid:
            with att.owner.lock:
                att.owner.attachments.pop(att.id, None)
            self._attachments.release(att)
            raise BrokerError(
                pb.ERROR_INTERNAL,
                f"refusing to pass fds of instance {att.key} shared beyond uid {caller.uid}",
            )
        return True

    def _create(
        self, caller: Caller, res: Resolved, target: Target, key: InstanceKey
    ) -> SharedInstance:
        return self.loader.create(caller, res, target, key)

    # ------------------------------------------------------------ Detach

    def detach(self, caller: Caller, owner: Owner, req: pb.DetachRequest) -> pb.DetachReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id}
        try:
            self._check_owner(caller, owner)
            with owner.lock:
                att = owner.attachments.pop(req.attachment_id, None)
                ended = att is None and req.attachment_id in owner.job_ended
            if ended:  # detached when its Slurm job ended: nothing left to do
                self._log("detach", caller, "ok", unloaded=False, detail="its job ended", **fields)
                return pb.DetachReply(unloaded=False)
            if att is None and req.attachment_id in owner.revoked:
                raise revoked_error(req.attachment_id, why=owner.revoked[req.attachment_id])
            if att is None:
                raise BrokerError(
                    pb.ERROR_NOT_FOUND, f"no attachment {req.attachment_id} in this session"
                )
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            unloaded = self._attachments.release(att)
        except BrokerError as e:
            raise self._fail("detach", caller, e, **fields) from None
        self._log("detach", caller, "ok", unloaded=unloaded, **fields)
        return pb.DetachReply(unloaded=unloaded)

    # ------------------------------------------------------------ ReadMap

    def read_map(self, caller: Caller, owner: Owner, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id, "map": req.map}
        try:
            self._check_owner(caller, owner)
            att = self._attachment(owner, req.attachment_id)
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            limit = self.policy.limits.read_map_entries
            with self._pin(owner, att):
                kmap = replies.readable_map(att, req.map)
                reply = replies.read_page(
                    kmap, req.max_entries, limit, bytes(req.cursor), packed=req.packed
                )
        except BrokerError as e:
            raise self._fail("read_map", caller, e, **fields) from None
        self._log("read_map", caller, "ok", entries=len(reply.entries) or reply.count, **fields)
        return reply

    # ------------------------------------------------------------ StreamEvents

    def stream_events(
        self,
        caller: Caller,
        owner: Owner,
        req: pb.StreamEventsRequest,
        cancelled: Callable[[], bool],
    ) -> Iterator[pb.EventBatch]:
        """The attachment's ring buffer, consumed by the broker (gRPC).

        Over the Unix socket the client holds the ring buffer's fd and is its
        only consumer, so this answers INVALID_ARGUMENT there. Requests are
        checked by this call (BrokerError raises here, not from next()); the
        iterator then yields batches until max_events, detach (a last batch
        with end = true) or cancelled() (no last batch).
        """
        fields: dict[str, object] = {"attachment_id": req.attachment_id, "map": req.map}
        try:
            self._check_owner(caller, owner)
            if caller.transport == "unix":
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT,
                    "over the Unix socket, read events from the ring-buffer fd that came "
                    "with AttachReply (MapDescription.fd_index); StreamEvents is for gRPC",
                )
            att = self._attachment(owner, req.attachment_id)
            fields.update(program=att.program, sha256=att.sha256, scope=att.scope)
            name = fields["map"] = streaming.event_map(att, req.map)
            with owner.lock:
                if att.streaming:
                    raise BrokerError(
                        pb.ERROR_RESOURCE_EXHAUSTED,
                        f"attachment {att.id} is already streaming (one consumer per ring buffer)",
                    )
                att.streaming = True
            try:
                with self._pin(owner, att):  # the ring keeps its own fd from here on
                    ring = streaming.open_ring(att.shared.visible[name])
            except BrokerError:
                att.streaming = False
                raise
        except BrokerError as e:
            raise self._fail("stream_events", caller, e, **fields) from None
        self._log("stream_events", caller, "ok", **fields)
        return streaming.events(att, ring, req.max_events, cancelled)

    # ------------------------------------------------------------ Stats

    def stats(self, caller: Caller, owner: Owner, req: pb.StatsRequest) -> pb.StatsReply:
        fields: dict[str, object] = {"attachment_id": req.attachment_id}
        try:
            self._check_owner(caller, owner)
            if req.attachment_id:
                atts = [self._attachment(owner, req.attachment_id)]
            else:
                with owner.lock:
                    atts = [a for a in owner.attachments.values() if not a.closed]
            with contextlib.ExitStack() as pins:
                held = [a for a in atts if self._pinned(pins, owner, a, bool(req.attachment_id))]
                reply = replies.stats(held)
        except BrokerError as e:
            raise self._fail("stats", caller, e, **fields) from None
        self._log("stats", caller, "ok", programs=len(reply.programs), **fields)
        return reply

    def _pinned(
        self, pins: contextlib.ExitStack, owner: Owner, att: Attachment, asked: bool
    ) -> bool:
        """Pin att for Stats; False if it went away meanwhile (raises if it was the one asked)."""
        try:
            pins.enter_context(self._pin(owner, att))
        except BrokerError:
            if asked:
                raise
            return False
        return True

    # ------------------------------------------------------------ IssueToken

    def issue_token(
        self, caller: Caller, owner: Owner, req: pb.IssueTokenRequest
    ) -> pb.IssueTokenReply:
        try:
            self._check_owner(caller, owner)
            if caller.transport != "unix":
                raise BrokerError(
                    pb.ERROR_PERMISSION_DENIED,
                    "tokens are issued over the Unix control socket only",
                )
            if self.tokens is None:
                raise BrokerError(
                    pb.ERROR_UNAVAILABLE,
                    "this broker serves no gRPC (start it with --grpc) so tokens are useless",
                )
            cap = self.policy.limits.token_ttl_seconds
            ttl = min(req.ttl_seconds or cap, cap)
            token, expires = self.tokens.issue(caller, ttl)
        except BrokerError as e:
            raise self._fail("issue_token", caller, e) from None
        self._log("issue_token", caller, "ok", ttl_seconds=ttl, expires_unix=expires)
        return pb.IssueTokenReply(token=token, expires_unix=expires)
