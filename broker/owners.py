"""Who holds what: callers, owners (sessions, token holders), attachments, and
the per-user counts the [limits] bound."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.bpf.consts import Scope
from gfxbpf.broker.access.peruser import PerUser
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import over_limit
from gfxbpf.broker.instances import SharedInstance
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.sharing.registry import InstanceKey

# What closing an owner does (Service.close_owner): a callback, so that
# sessions need not know the service that holds them.
CloseOwner = Callable[["Owner"], None]


@dataclass
class Attachment:
    id: int
    owner: Owner
    uid: int
    program: str
    sha256: str
    scope: Scope
    key: InstanceKey
    shared: SharedInstance
    closed: bool = False
    streaming: bool = False
    name: str | None = None  # as the request named it (None: uploaded bytes)
    # The policy that last allowed it: a call made under another one (a
    # reload) decides again before it reads (Service._recheck).
    policy: Policy | None = None


class Owner:
    """Holds attachments: a Unix session, or a gRPC token's lease holder.

    close() detaches everything it holds (idempotent), through the callback
    it was made with. Create with Service.open_owner(caller).
    """

    def __init__(self, on_close: CloseOwner, caller: Caller, owner_id: int, counted: bool) -> None:
        self._on_close = on_close
        self.caller = caller
        self.id = owner_id
        self.counted = counted  # counts against sessions_per_user
        self.closed = False
        self.lock = threading.Lock()
        self.attachments: dict[int, Attachment] = {}
        # ids the broker detached (a policy reload, a Slurm job's end) -> why, for the refusal
        self.revoked: dict[int, str] = {}
        self.job_ended: set[int] = set()  # of those, the ids whose Slurm job ended

    def attachment_ids(self) -> list[int]:
        with self.lock:
            return list(self.attachments)

    def add(self, att: Attachment) -> bool:
        """Hold att; False if the owner closed meanwhile."""
        with self.lock:
            if self.closed:
                return False
            self.attachments[att.id] = att
            return True

    def take_all(self) -> list[Attachment] | None:
        """Close: hand over every attachment held; None if closed already."""
        with self.lock:
            if self.closed:
                return None
            self.closed = True
            atts = list(self.attachments.values())
            self.attachments.clear()
            return atts

    def close(self) -> None:
        self._on_close(self)


def too_many_sessions(uid: int, have: int) -> str:
    """The refusal of a session over sessions_per_user (at accept, or at open_owner)."""
    return (
        f"uid {uid} already has {have} open sessions, the policy's limit "
        "(close one, or ask the administrator to raise it)"
    )


class Owners:
    """The open owners, and the open Unix sessions per uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[int, Owner] = {}
        self._ids = itertools.count(1)
        self._sessions = PerUser()

    def open(self, on_close: CloseOwner, caller: Caller, policy: Policy) -> Owner:
        """A new owner; a Unix session counts against sessions_per_user."""
        counted = caller.transport == "unix"
        if counted:
            limit = policy.limits.sessions_per_user
            have = self._sessions.take(caller.uid, limit)
            if have is not None:
                raise over_limit(
                    too_many_sessions(caller.uid, have),
                    policy.path,
                    "sessions_per_user",
                    limit,
                )
        with self._lock:
            owner = Owner(on_close, caller, next(self._ids), counted)
            self._owners[owner.id] = owner
        return owner

    def forget(self, owner: Owner) -> None:
        """A closed owner leaves the table and gives back its session."""
        with self._lock:
            self._owners.pop(owner.id, None)
        if owner.counted:
            self._sessions.give_back(owner.caller.uid)

    def all(self) -> list[Owner]:
        with self._lock:
            return list(self._owners.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._owners)
