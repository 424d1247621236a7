"""TokenStore: random tokens stored only as hashes, expiry, per-user cap, revocation."""

from __future__ import annotations

import hashlib

import pytest

from gfxbpf.broker.access.tokens import MAX_TOKEN_CHARS, TokenStore, token_digest
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb

ALICE = Caller(uid=1001, gid=1001, gids=(1001, 44), pid=4242, transport="unix")
BOB = Caller(uid=1002, gid=1002, gids=(1002,), pid=4343, transport="unix")


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_issue_and_authenticate_gives_the_issuer_over_grpc() -> None:
    clock = Clock()
    store = TokenStore(max_ttl=600, per_user=4, clock=clock)
    token, expires = store.issue(ALICE, 60)
    assert expires == int(clock.t) + 60
    got = store.authenticate(token)
    assert got == Caller(uid=1001, gid=1001, gids=(1001, 44), pid=0, transport="grpc")
    assert store.authenticate(token + "x") is None
    assert store.authenticate("") is None


def test_tokens_are_random_and_stored_only_as_sha256() -> None:
    store = TokenStore(clock=Clock())
    tokens = {store.issue(ALICE)[0] for _ in range(4)}
    assert len(tokens) == 4
    for t in tokens:
        assert len(t) >= 43  # 32 random bytes, urlsafe base64
        assert token_digest(t) == hashlib.sha256(t.encode()).hexdigest()
    # Nothing in the store holds a token in clear.
    blob = repr(store.__dict__) + repr(list(store._tokens.items()))
    for t in tokens:
        assert t not in blob
        assert token_digest(t) in store._tokens


def test_expiry_and_ttl_cap() -> None:
    clock = Clock()
    store = TokenStore(max_ttl=100, per_user=4, clock=clock)
    short, exp_short = store.issue(ALICE, 10)
    longest, exp_long = store.issue(ALICE, 10_000)  # capped by the policy
    default, exp_default = store.issue(ALICE, 0)  # 0 = the policy maximum
    assert exp_short == int(clock.t) + 10
    assert exp_long == exp_default == int(clock.t) + 100
    clock.t += 10
    assert store.authenticate(short) is None
    assert store.expires(short) is None
    assert store.authenticate(longest) is not None
    clock.t += 89.5
    assert store.authenticate(default) is not None
    clock.t += 0.5
    assert store.authenticate(longest) is None
    assert store.authenticate(default) is None
    assert store.count() == 0


def test_negative_ttl_is_invalid_argument() -> None:
    with pytest.raises(BrokerError) as e:
        TokenStore(clock=Clock()).issue(ALICE, -1)
    assert e.value.code == pb.ERROR_INVALID_ARGUMENT


def test_a_token_over_the_per_user_limit_replaces_that_uids_oldest() -> None:
    # Issue 26 item 9: refusing locked out a user whose client could not keep
    # its tokens (another user squatting its cache directory).
    clock = Clock()
    store = TokenStore(max_ttl=100, per_user=2, clock=clock)
    first, _ = store.issue(ALICE, 100)
    clock.t += 1
    second, _ = store.issue(ALICE, 50)
    bob, _ = store.issue(BOB)
    third, _ = store.issue(ALICE)
    assert store.authenticate(first) is None  # the oldest, though it expires last
    assert store.authenticate(second) is not None and store.authenticate(third) is not None
    assert store.count(ALICE.uid) == 2
    assert store.authenticate(bob) is not None  # another user is not affected
    fourth, _ = store.issue(ALICE)
    assert store.authenticate(second) is None and store.authenticate(fourth) is not None
    # An expired token frees its slot: nothing else is replaced.
    clock.t += 100
    fifth, _ = store.issue(ALICE)
    sixth, _ = store.issue(ALICE)
    assert store.count(ALICE.uid) == 2
    assert store.authenticate(fifth) is not None and store.authenticate(sixth) is not None


def test_a_token_in_use_is_never_replaced() -> None:
    # Issue 35 item 10: short runs that each issue a token (their cache
    # directory refused) replaced the token of the same user's running watch.
    store = TokenStore(max_ttl=100, per_user=2, clock=Clock())
    live: set[str] = set()
    store.in_use = lambda digest: digest in live
    watch, _ = store.issue(ALICE)
    live.add(token_digest(watch))  # its lease holds attachments
    runs = [store.issue(ALICE)[0] for _ in range(5)]
    assert store.authenticate(watch) is not None, "a short run replaced the watch's token"
    assert store.authenticate(runs[-1]) is not None and store.count(ALICE.uid) == 2
    # Every token in use: a new one is refused, none replaced.
    live.add(token_digest(runs[-1]))
    with pytest.raises(BrokerError) as ei:
        store.issue(ALICE)
    assert ei.value.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert ei.value.rule == "[limits] tokens_per_user = 2"
    assert store.authenticate(watch) is not None and store.authenticate(runs[-1]) is not None
    assert store.issue(BOB)[0]  # another user is not affected


def test_revoke() -> None:
    store = TokenStore(clock=Clock())
    a1, _ = store.issue(ALICE)
    a2, _ = store.issue(ALICE)
    b, _ = store.issue(BOB)
    assert store.revoke(a1) is True
    assert store.revoke(a1) is False
    assert store.authenticate(a1) is None
    assert store.authenticate(a2) is not None
    assert store.revoke_uid(ALICE.uid) == 1
    assert store.authenticate(a2) is None
    assert store.authenticate(b) is not None


def test_hostile_token_values_are_refused_cheaply() -> None:
    store = TokenStore(clock=Clock())
    token, _ = store.issue(ALICE)
    assert store.authenticate("A" * (MAX_TOKEN_CHARS + 1)) is None
    assert store.authenticate(token + "\udcff") is None
    assert store.authenticate(None) is None  # type: ignore[arg-type]
    assert store.revoke("x" * 10_000) is False
    assert store.expires("x" * 10_000) is None


def test_from_policy_uses_the_limits() -> None:
    from gfxbpf.broker.policy.rules import Policy

    policy = Policy.parse("[limits]\ntoken_ttl_seconds = 120\ntokens_per_user = 1\n")
    clock = Clock()
    store = TokenStore.from_policy(policy, clock=clock)
    first, exp = store.issue(ALICE, 0)
    assert exp == int(clock.t) + 120
    store.issue(ALICE)
    assert store.count(ALICE.uid) == 1 and store.authenticate(first) is None


def test_bad_construction() -> None:
    with pytest.raises(ValueError):
        TokenStore(max_ttl=0)
    with pytest.raises(ValueError):
        TokenStore(per_user=0)
