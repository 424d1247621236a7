"""Bearer tokens for the gRPC listener.

A local user gets a token from IssueToken on their Unix-socket session (where
SO_PEERCRED proves who they are) and sends it to the gRPC listener as
metadata "authorization: Bearer <token>". Decisions:

- A token is 32 random bytes (secrets.token_urlsafe); the store keeps only
  its SHA-256, so a memory dump or a log line never yields a usable token.
- A token OUTLIVES the session that issued it: that is its point (a gRPC
  client, or a tool started from a short-lived shell, keeps working after
  the issuing connection closed). Its life is capped instead: at most the
  policy's token_ttl_seconds, and at most tokens_per_user unexpired tokens
  per uid at once. A new one replaces the uid's oldest token that is not in
  use (in_use: its lease holds attachments or a call is in flight), so a
  user whose client cannot keep its tokens (another user squats its cache
  directory) is never locked out, and the short runs that each issue one
  never end the token of the same user's long-running client (issue 35
  item 10: five short runs ended a running `watch`). Only when every token
  of the uid is in use is a new one refused. revoke() ends one early.
- authenticate() returns the identity captured at issue time (uid, gid and
  supplementary groups from SO_PEERGROUPS), with pid 0 and transport "grpc":
  the gRPC caller is not a process the broker can see.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.broker.policy.rules import Policy

TOKEN_BYTES = 32
# Accept nothing much longer than what issue() produces (43 chars): a
# hostile client must not make the broker hash megabytes per call.
MAX_TOKEN_CHARS = 256


@dataclass
class _Record:
    caller: Caller  # the issuing one
    uid: int
    expires: float  # on the store's clock (wall clock: replies carry unix times)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


class TokenStore:
    """Issued tokens by their SHA-256. Thread-safe.

    max_ttl: the longest a token lives (policy limits.token_ttl_seconds).
    per_user: most unexpired tokens one uid may hold (limits.tokens_per_user).
    clock: seconds since the epoch (time.time); tests pass their own.
    """

    def __init__(
        self,
        *,
        max_ttl: int = 3600,
        per_user: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_ttl <= 0 or per_user <= 0:
            raise ValueError("max_ttl and per_user must be positive")
        self.max_ttl = max_ttl
        self.per_user = per_user
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, _Record] = {}
        # digest -> whether a client is using that token now (the gRPC
        # listener sets it from its leases); never called under _lock.
        self.in_use: Callable[[str], bool] = lambda digest: False

    @classmethod
    def from_policy(cls, policy: Policy, **kwargs: Any) -> TokenStore:
        lim = policy.limits
        return cls(max_ttl=lim.token_ttl_seconds, per_user=lim.tokens_per_user, **kwargs)

    def _purge_locked(self, now: float) -> None:
        dead = [h for h, r in self._tokens.items() if r.expires <= now]
        for h in dead:
            del self._tokens[h]

    def issue(self, caller: Caller, ttl_seconds: int = 0) -> tuple[str, int]:
        """A new token for caller: (token, expiry in unix seconds).

        ttl_seconds 0 = the longest allowed; larger values are capped at
        max_ttl. When the caller's uid already holds per_user unexpired
        tokens, the oldest one not in use stops working; BrokerError
        (RESOURCE_EXHAUSTED) when all of them are in use.
        """
        if ttl_seconds < 0:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT, f"ttl_seconds must be >= 0, got {ttl_seconds}"
            )
        life = self.max_ttl if ttl_seconds == 0 else min(ttl_seconds, self.max_ttl)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        with self._lock:
            self._purge_locked(self._clock())
            # The dict keeps issue order: the first ones are the oldest.
            held = [h for h, r in self._tokens.items() if r.uid == caller.uid]
        idle = [h for h in held if not self.in_use(h)]  # outside _lock: leases lock
        excess = len(held) - self.per_user + 1
        if excess > len(idle):
            raise BrokerError(
                pb.ERROR_RESOURCE_EXHAUSTED,
                f"you hold {len(held)} gRPC tokens and every one is in use by a client "
                "(attachments on its lease, or a call in flight): end one of those clients",
                rule=f"[limits] tokens_per_user = {self.per_user}",
            )
        with self._lock:
            for h in idle[: max(0, excess)]:
                self._tokens.pop(h, None)
            expires = self._clock() + life
            self._tokens[token_digest(token)] = _Record(caller, caller.uid, expires)
        return token, int(expires)

    def authenticate(self, token: str) -> Caller | None:
        """The Caller a valid, unexpired token stands for (pid 0, transport "grpc"), else None."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = token_digest(token)
        with self._lock:
            rec = self._tokens.get(digest)
            if rec is None:
                return None
            if rec.expires <= self._clock():
                del self._tokens[digest]
                return None
            caller = rec.caller
        return dataclasses.replace(caller, pid=0, transport="grpc")

    def expires(self, token: str) -> float | None:
        """When an unexpired token runs out (store clock), or None."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return None
        with self._lock:
            rec = self._tokens.get(token_digest(token))
            if rec is None or rec.expires <= self._clock():
                return None
            return rec.expires

    def revoke(self, token: str) -> bool:
        """Forget a token; True if it was known."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return False
        with self._lock:
            return self._tokens.pop(token_digest(token), None) is not None

    def revoke_uid(self, uid: int) -> int:
        """Forget every token of a uid; how many there were."""
        with self._lock:
            dead = [h for h, r in self._tokens.items() if r.uid == uid]
            for h in dead:
                del self._tokens[h]
            return len(dead)

    def revoke_unless(self, keep: Callable[[Caller], bool]) -> list[int]:
        """Forget every token whose issuing Caller keep() rejects (a reload that
        removed its user); the uids whose tokens went."""
        with self._lock:
            dead = [h for h, r in self._tokens.items() if not keep(r.caller)]
            uids = sorted({self._tokens[h].uid for h in dead})
            for h in dead:
                del self._tokens[h]
            return uids

    def count(self, uid: int | None = None) -> int:
        """Unexpired tokens (of one uid, or all)."""
        with self._lock:
            self._purge_locked(self._clock())
            return sum(1 for r in self._tokens.values() if uid is None or r.uid == uid)


__all__ = ["MAX_TOKEN_CHARS", "TokenStore", "token_digest"]
