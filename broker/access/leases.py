"""Leases for attachments made over gRPC.

A gRPC caller has no connection whose end the broker could notice (a
Unix-socket session ends on EOF; a gRPC channel may come and go between
calls), so what it attaches lives on a lease instead:

- Every authenticated identity (one token, or one client certificate) is a
  Holder. Its attachments belong to one broker Owner (Service.open_owner),
  opened when a call first needs it.
- Attach grants a lease of lease_seconds (the request's, or the policy's
  default when 0; capped by the policy). Every later call that names the
  attachment (ReadMap, Stats, each poll of a running StreamEvents) renews
  it for the same length, and a running StreamEvents pins it (pinned()).
- A reaper thread detaches attachments whose lease ran out, and closes an
  Owner once its holder has no leases and no call in flight, so idle gRPC
  identities hold no broker session slot. A holder whose token expired is
  forgotten.
- stop() ends the reaper and closes every Owner (detaching everything).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gfxbpf.broker.callers import Caller

if TYPE_CHECKING:
    from gfxbpf.broker.owners import Owner
    from gfxbpf.proto import gfxbpf_pb2 as pb

log = logging.getLogger("gfxbpf.broker.access.leases")

REAP_INTERVAL = 0.25  # seconds between reaper passes: bounds how late a lease ends


class OwnerService(Protocol):
    """What leases need of the broker's Service: its owners and detach."""

    def open_owner(self, caller: Caller) -> Owner: ...

    def close_owner(self, owner: Owner) -> None: ...

    def detach(self, caller: Caller, owner: Owner, req: pb.DetachRequest) -> pb.DetachReply: ...


@dataclass
class Lease:
    attachment_id: int
    seconds: float  # length of the lease; each renewal extends it by this much
    deadline: float  # on the manager's monotonic clock
    pins: int = 0  # running streams: a pinned lease does not run out


@dataclass
class Holder:
    """One gRPC identity (a token or a certificate) and what it attached."""

    key: str
    caller: Caller
    expires: float | None = None  # monotonic time its token runs out; None = never (mTLS)
    owner: Owner | None = None  # opened on demand
    leases: dict[int, Lease] = field(default_factory=dict)
    busy: int = 0  # calls in flight that use the owner
    last_used: float = 0.0


class LeaseManager:
    """Holders, their Owners and their attachments' leases. Thread-safe.

    service: opens/closes Owners and detaches (open_owner(caller),
    close_owner(owner), detach(caller, owner, DetachRequest)).
    default_seconds: lease when the request names none (policy lease_seconds).
    max_seconds: the longest lease a request may ask for.
    """

    def __init__(
        self,
        service: OwnerService,
        *,
        default_seconds: float,
        max_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        interval: float = REAP_INTERVAL,
        detach_request: Callable[[int], pb.DetachRequest] | None = None,
    ) -> None:
        if default_seconds <= 0:
            raise ValueError("default_seconds must be positive")
        self.service = service
        self.default_seconds = float(default_seconds)
        self.max_seconds = float(max_seconds if max_seconds is not None else default_seconds)
        self._clock = clock
        self._wall = wall
        self._interval = interval
        self._detach_request = detach_request or _pb_detach_request
        self._lock = threading.Lock()
        self._holders: dict[str, Holder] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    # ------------------------------------------------------------ holders and owners

    def in_use(self, key: str) -> bool:
        """Whether the identity key's client is using it: attachments on its
        leases, or a call in flight (a token so used is not replaced)."""
        with self._lock:
            h = self._holders.get(key)
            return h is not None and (bool(h.leases) or h.busy > 0)

    def holder(self, key: str, caller: Caller, *, expires_unix: float | None = None) -> Holder:
        """The holder for an identity key (created on first use).

        expires_unix: when its token runs out (unix seconds); None for certificates.
        """
        with self._lock:
            h = self._holders.get(key)
            if h is None:
                h = Holder(key=key, caller=caller, last_used=self._clock())
                self._holders[key] = h
            if expires_unix is not None:
                h.expires = self._clock() + (expires_unix - self._wall())
            return h

    @contextlib.contextmanager
    def using(self, holder: Holder) -> Iterator[Owner]:
        """The holder's Owner (opened if needed), kept open for the with-block."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the broker is shutting down")
            # A holder the reaper forgot (token expired, idle) comes back.
            self._holders.setdefault(holder.key, holder)
            if holder.owner is None:
                # Service errors (e.g. sessions_per_user) propagate to the caller.
                holder.owner = self.service.open_owner(holder.caller)
            holder.busy += 1
            holder.last_used = self._clock()
            owner = holder.owner
        try:
            yield owner
        finally:
            with self._lock:
                holder.busy -= 1
                holder.last_used = self._clock()

    # ------------------------------------------------------------ leases

    def lease_length(self, requested: int) -> float:
        """Seconds a lease lasts: the request's (0 = default), at most max_seconds."""
        if requested <= 0:
            return min(self.default_seconds, self.max_seconds)
        return min(float(requested), self.max_seconds)

    def grant(self, holder: Holder, attachment_id: int, requested: int = 0) -> int:
        """Put a new attachment on a lease; return its expiry in unix seconds."""
        seconds = self.lease_length(requested)
        with self._lock:
            now = self._clock()
            holder.leases[attachment_id] = Lease(attachment_id, seconds, now + seconds)
            holder.last_used = now
        return int(self._wall() + seconds + 0.999)

    def renew(self, holder: Holder, attachment_id: int) -> int | None:
        """Extend one lease; its new expiry (unix seconds), or None if it has none."""
        with self._lock:
            lease = holder.leases.get(attachment_id)
            if lease is None:
                return None
            now = self._clock()
            lease.deadline = now + lease.seconds
            holder.last_used = now
            return int(self._wall() + lease.seconds + 0.999)

    def renew_all(self, holder: Holder) -> int:
        """Extend every lease of a holder (Stats for all attachments); how many."""
        with self._lock:
            now = self._clock()
            for lease in holder.leases.values():
                lease.deadline = now + lease.seconds
            holder.last_used = now
            return len(holder.leases)

    @contextlib.contextmanager
    def pinned(self, holder: Holder, attachment_id: int) -> Iterator[None]:
        """Keep a lease from running out for the with-block (an open event stream).

        On exit the lease is renewed: it runs its full length from the
        stream's end.
        """
        with self._lock:
            lease = holder.leases.get(attachment_id)
            if lease is not None:
                lease.pins += 1
        try:
            yield
        finally:
            with self._lock:
                if lease is not None:
                    lease.pins -= 1
                    lease.deadline = self._clock() + lease.seconds

    def release(self, holder: Holder, attachment_id: int) -> bool:
        """Forget a lease (the client detached); True if there was one."""
        with self._lock:
            return holder.leases.pop(attachment_id, None) is not None

    def drop(self, attachment_ids: set[int]) -> int:
        """Forget the leases of attachments the broker detached itself (revoked by
        a reload), so the reaper does not detach them again; how many."""
        n = 0
        with self._lock:
            for h in self._holders.values():
                for aid in attachment_ids & h.leases.keys():
                    del h.leases[aid]
                    n += 1
        return n

    def has_lease(self, holder: Holder, attachment_id: int) -> bool:
        with self._lock:
            return attachment_id in holder.leases

    def leases(self) -> list[tuple[str, int, float]]:
        """(holder key, attachment id, seconds left) for every lease (for status, tests)."""
        with self._lock:
            now = self._clock()
            return [
                (h.key, lease.attachment_id, lease.deadline - now)
                for h in self._holders.values()
                for lease in h.leases.values()
            ]

    # ------------------------------------------------------------ reaping

    def reap(self) -> list[int]:
        """Detach expired attachments; close idle owners. Return the detached ids."""
        expired: list[tuple[Holder, Owner | None, int]] = []
        idle: list[Owner] = []
        with self._lock:
            now = self._clock()
            for key, h in list(self._holders.items()):
                for aid, lease in list(h.leases.items()):
                    if lease.deadline <= now and not lease.pins:
                        del h.leases[aid]
                        expired.append((h, h.owner, aid))
                if h.leases or h.busy:
                    continue
                # Nothing attached and nothing in flight: the owner holds nothing
                # worth keeping, and the holder goes once its token has expired.
                if h.owner is not None and not any(e[0] is h for e in expired):
                    idle.append(h.owner)
                    h.owner = None
                if h.owner is None and h.expires is not None and h.expires <= now:
                    del self._holders[key]
        detached: list[int] = []
        for h, owner, aid in expired:
            if owner is None:
                continue
            try:
                self.service.detach(h.caller, owner, self._detach_request(aid))
                detached.append(aid)
            except Exception as e:  # already gone (client detached meanwhile), or a bug
                log.debug("lease reaper: detaching attachment %d: %s", aid, e)
                continue
            audit = getattr(self.service, "audit", None)
            if audit is not None:  # why the detach above happened, for the audit trail
                audit.ok(
                    "lease_expired",
                    uid=h.caller.uid,
                    pid=0,
                    attachment_id=aid,
                    transport="grpc",
                )
        for owner in idle:
            self._close_owner(owner)
        return detached

    def _close_owner(self, owner: Owner) -> None:
        try:
            self.service.close_owner(owner)
        except Exception as e:  # closing must go on for the others
            log.warning("closing a gRPC owner: %s", e)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.reap()
            except Exception:  # the reaper must outlive a bug in one pass
                log.exception("lease reaper pass failed")

    def start(self) -> None:
        """Start the reaper thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gfxbpf-lease-reaper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the reaper and close every owner (detaching all gRPC attachments)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            self._stopped = True
            owners = [h.owner for h in self._holders.values() if h.owner is not None]
            for h in self._holders.values():
                h.owner = None
                h.leases.clear()
            self._holders.clear()
        for owner in owners:
            self._close_owner(owner)


def _pb_detach_request(attachment_id: int) -> pb.DetachRequest:
    from gfxbpf.proto import gfxbpf_pb2 as pb

    return pb.DetachRequest(attachment_id=attachment_id)


__all__ = ["REAP_INTERVAL", "Holder", "Lease", "LeaseManager"]
