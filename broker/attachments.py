"""Live attachments: the per-user attachment count, the registry of shared
instances (an identical request joins a live one) and attachment ids."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from gfxbpf.bpf.consts import JOB, SELF
from gfxbpf.broker.access.peruser import PerUser
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError, over_limit
from gfxbpf.broker.instances import SharedInstance
from gfxbpf.broker.owners import Attachment, Owner
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.request.params import Target
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.broker.sharing.registry import InstanceKey, Registry
from gfxbpf.proto import gfxbpf_pb2 as pb

# Makes a new shared instance (InstanceLoader.create, or a test's stand-in).
Create = Callable[[Caller, Resolved, Target, InstanceKey], SharedInstance]


def instance_uid(caller: Caller, res: Resolved) -> int | None:
    """Who may share the instance: None for everyone, else only this uid.

    Scope self is the caller's own data. A client that gets map fds (the
    Unix socket) gets an instance shared only with its own uid, in every
    scope: a revoked user's instance can then be detached without touching
    anyone else's (the fds they kept stop receiving data), and where the
    kernel lets unprivileged users load BPF (a program of theirs may write a
    frozen map through such an fd), what they could forge is only their own.
    Over gRPC the broker does every read, so users share system instances.
    """
    if res.scope in (SELF, JOB) or caller.transport == "unix":
        return caller.uid
    return None


class Attachments:
    """policy() is the policy in force; create() loads an instance nobody shares yet."""

    def __init__(self, policy: Callable[[], Policy], create: Create) -> None:
        self._policy = policy
        self._create = create
        self._per_user = PerUser()
        self._ids = itertools.count(1)
        self._unique = itertools.count(1)
        self.registry: Registry[SharedInstance] = Registry()

    def acquire(
        self, caller: Caller, owner: Owner, res: Resolved, target: Target
    ) -> tuple[Attachment, bool]:
        """Count the attachment, join or create its instance, give it to owner.
        Returns (attachment, joined: it shares an instance already live)."""
        key = InstanceKey(
            sha256=res.sha256,
            scope=res.scope,
            uid=instance_uid(caller, res),
            pid=target.pid,
            library=target.library,
            functions=target.functions,
            frequency=target.frequency,
            children=target.children,
            job=target.job,
            # A ring buffer has one consumer: such instances are never shared.
            unique=next(self._unique)
            if any(m.show == "events" for m in res.entry.visible_maps)
            else None,
        )
        self._count(caller)
        try:
            shared, joined = self.registry.acquire(
                key, lambda: self._create(caller, res, target, key)
            )
        except BaseException:
            self._per_user.give_back(caller.uid)
            raise
        att = Attachment(
            id=next(self._ids),
            owner=owner,
            uid=caller.uid,
            program=res.entry.name,
            sha256=res.sha256,
            scope=res.scope,
            key=key,
            shared=shared,
            name=res.entry.name if res.via == "name" else None,
        )
        if not owner.add(att):  # the session closed while we loaded
            self.release(att)
            raise BrokerError(pb.ERROR_NOT_FOUND, "the session closed during attach")
        return att, joined

    def _count(self, caller: Caller) -> None:
        policy = self._policy()
        limit = policy.limits.attachments_per_user
        have = self._per_user.take(caller.uid, limit)
        if have is not None:
            raise over_limit(
                f"uid {caller.uid} already has {have} attachments, the policy's limit "
                "(detach one, or ask the administrator to raise it)",
                policy.path,
                "attachments_per_user",
                limit,
            )

    def release(self, att: Attachment) -> bool:
        """Detach att; True if that unloaded its instance (its last attachment)."""
        att.closed = True
        try:
            return self.registry.release(att.key, att.shared)
        finally:
            self._per_user.give_back(att.uid)
