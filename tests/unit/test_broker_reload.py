"""broker.main.reload_policy (SIGHUP, issue #16 finding 8), offline."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gfxbpf.broker import main
from gfxbpf.broker.access.leases import LeaseManager
from gfxbpf.broker.access.tokens import TokenStore
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.config import parse_args
from gfxbpf.broker.owners import Caller
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.catalog.entries import load_catalog

CATALOG = load_catalog()


def _policy_text(users: str, limits: str = "") -> str:
    sha = CATALOG.get("syscount").sha256
    return (
        f'[[program]]\nname = "syscount"\nsha256 = "{sha}"\nusers = [{users}]\n'
        f'scope = "self"\n\n[limits]\n{limits}\n'
    )


def _setup(tmp_path: Path) -> tuple[Path, SimpleNamespace, AuditLog, io.StringIO, SimpleNamespace]:
    path = tmp_path / "policy.toml"
    path.write_text(_policy_text('"root"'))
    service = SimpleNamespace(
        policy=Policy.load(path), catalog=CATALOG, revoke_disallowed=lambda: [7]
    )
    buf = io.StringIO()
    audit = AuditLog(buf, timer=False)
    audit.set_rate(20)
    tokens = TokenStore.from_policy(service.policy)
    leases = LeaseManager(service, default_seconds=300, max_seconds=300)
    grpc = SimpleNamespace(tokens=tokens, leases=leases)
    return path, service, audit, buf, grpc


def _last(buf: io.StringIO) -> dict:
    return json.loads(buf.getvalue().splitlines()[-1])


def test_a_broken_policy_is_refused_and_the_old_one_kept(tmp_path: Path) -> None:
    path, service, audit, buf, grpc = _setup(tmp_path)
    config = parse_args(["--policy", str(path)])
    old = service.policy
    for text in ("[[program]\n", _policy_text('"root"', "sessions_per_user = 0")):
        path.write_text(text)
        assert main.reload_policy(config, service, audit, grpc) is False
        assert service.policy is old
        rec = _last(buf)
        assert rec["op"] == "reload" and rec["result"] == "error", rec
        assert "NOT reloaded" in rec["detail"] and rec["problems"], rec
    path.unlink()
    assert main.reload_policy(config, service, audit, grpc) is False
    assert "cannot read" in _last(buf)["problems"][0]
    assert service.policy is old


def test_a_good_policy_replaces_it_with_its_limits(tmp_path: Path) -> None:
    path, service, audit, buf, grpc = _setup(tmp_path)
    config = parse_args(["--policy", str(path)])
    limits = (
        "tokens_per_user = 2\ntoken_ttl_seconds = 60\nlease_seconds = 30\n"
        "audit_lines_per_second = 3\nsessions_total = 9\nhello_timeout_seconds = 4\n"
    )
    path.write_text(_policy_text('"root", "nobody-gfxbpf-test"', limits))
    assert main.reload_policy(config, service, audit, grpc) is True
    rec = _last(buf)
    assert rec["op"] == "reload" and rec["result"] == "ok", rec
    assert "applies to every request" in rec["detail"]
    assert rec["revoked_attachments"] == [7]  # what Service.revoke_disallowed detached
    assert any("nobody-gfxbpf-test" in w for w in rec["warnings"]), rec
    lim = service.policy.limits
    assert (lim.sessions_total, lim.hello_timeout_seconds) == (9, 4)
    assert (grpc.tokens.per_user, grpc.tokens.max_ttl) == (2, 60)
    assert (grpc.leases.default_seconds, grpc.leases.max_seconds) == (30.0, 30.0)
    assert audit.rate == 3


def test_reload_works_without_grpc(tmp_path: Path) -> None:
    path, service, audit, buf, _ = _setup(tmp_path)
    config = parse_args(["--policy", str(path)])
    assert main.reload_policy(config, service, audit, None) is True


def test_a_reload_drops_the_tokens_of_users_it_lets_run_nothing(tmp_path: Path) -> None:
    path, service, audit, buf, grpc = _setup(tmp_path)
    config = parse_args(["--policy", str(path)])
    root = Caller(uid=0, gid=0, gids=(0,), pid=1, transport="unix")
    other = Caller(uid=54321, gid=54321, gids=(54321,), pid=2, transport="unix")
    kept, _ = grpc.tokens.issue(root)
    dropped, _ = grpc.tokens.issue(other)
    grpc.leases.holder("token:x", other)
    assert main.reload_policy(config, service, audit, grpc) is True
    assert _last(buf)["revoked_token_uids"] == [54321]
    assert grpc.tokens.authenticate(kept) is not None
    assert grpc.tokens.authenticate(dropped) is None


def test_start_says_when_the_host_lets_any_user_load_bpf(monkeypatch: pytest.MonkeyPatch) -> None:
    from gfxbpf.broker import features

    for value, expect in ((0, "unprivileged_bpf_disabled = 0"), (None, "cannot read"), (2, None)):
        monkeypatch.setattr(features, "unprivileged_bpf_disabled", lambda v=value: v)
        buf = io.StringIO()
        main._check_unprivileged_bpf(AuditLog(buf, timer=False))
        lines = [json.loads(x) for x in buf.getvalue().splitlines()]
        if expect is None:
            assert lines == []
        else:
            assert lines[0]["op"] == "host_check" and expect in lines[0]["detail"], lines


def test_start_says_when_users_may_pin_in_a_bpffs(monkeypatch: pytest.MonkeyPatch) -> None:
    from gfxbpf.broker import features

    for found in ([("/sys/fs/bpf", 0o1777)], []):
        monkeypatch.setattr(features, "open_bpffs", lambda v=found: v)
        buf = io.StringIO()
        main._check_bpffs(AuditLog(buf, timer=False))
        lines = [json.loads(x) for x in buf.getvalue().splitlines()]
        if found:
            assert lines[0]["op"] == "host_check", lines
            assert "/sys/fs/bpf is a bpffs of mode 1777" in lines[0]["detail"], lines
        else:
            assert lines == []


def test_start_says_when_map_ids_cannot_be_listed() -> None:
    for error in ("no BTF", None):
        live = SimpleNamespace(probe=lambda e=error: e)
        service = SimpleNamespace(loader=SimpleNamespace(live_maps=live))
        buf = io.StringIO()
        main._check_live_maps(service, AuditLog(buf, timer=False))
        lines = [json.loads(x) for x in buf.getvalue().splitlines()]
        if error is not None:
            assert lines[0]["op"] == "host_check" and "no BTF" in lines[0]["detail"], lines
        else:
            assert lines == []
