"""The sampling frequency of perf_event programs: the policy's max_frequency
key, and the broker's check of AttachParams.frequency against it."""

from __future__ import annotations

import pytest

from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.policy.rules import Policy, PolicyError
from gfxbpf.broker.request.params import check_params
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.instance import DEFAULT_FREQUENCY
from gfxbpf.proto import gfxbpf_pb2 as pb

SHA = "a" * 64


def _policy(extra: str) -> Policy:
    return Policy.parse(
        f'[[program]]\nname = "profile"\nsha256 = "{SHA}"\nusers = ["*"]\n{extra}',
        path="policy.toml",
    )


def _resolved(policy: Policy, program: str = "profile") -> Resolved:
    entry = load_catalog().get(program)
    return Resolved(b"", SHA, entry, policy.programs[0], "self", "rule", "name")


CALLER = Caller(uid=1000, gid=1000, gids=(1000,), pid=0, transport="grpc")


def test_policy_reads_max_frequency() -> None:
    assert _policy("max_frequency = 999\n").programs[0].max_frequency == 999
    assert _policy("").programs[0].max_frequency is None


@pytest.mark.parametrize("bad", ["0", "-5", '"99"', "100001", "true"])
def test_policy_refuses_bad_max_frequency(bad: str) -> None:
    with pytest.raises(PolicyError) as e:
        _policy(f"max_frequency = {bad}\n")
    assert "max_frequency" in str(e.value) and "samples per second" in str(e.value)


def test_default_frequency_when_none_asked() -> None:
    p = _policy("max_frequency = 999\n")
    t = check_params(p, CALLER, _resolved(p), pb.AttachParams())
    assert t.frequency == DEFAULT_FREQUENCY


def test_frequency_at_the_cap_is_granted() -> None:
    p = _policy("max_frequency = 999\n")
    t = check_params(p, CALLER, _resolved(p), pb.AttachParams(frequency=999))
    assert t.frequency == 999


def test_frequency_above_the_cap_is_refused_with_the_rule() -> None:
    p = _policy("max_frequency = 999\n")
    with pytest.raises(BrokerError) as e:
        check_params(p, CALLER, _resolved(p), pb.AttachParams(frequency=1000))
    assert e.value.code == pb.ERROR_PERMISSION_DENIED
    assert "1000 Hz" in e.value.message and "999 Hz" in e.value.message
    assert "max_frequency" in e.value.rule


def test_frequency_above_the_kernel_ceiling_without_a_cap() -> None:
    p = _policy("")
    with pytest.raises(BrokerError) as e:
        check_params(p, CALLER, _resolved(p), pb.AttachParams(frequency=200_000))
    assert e.value.code == pb.ERROR_INVALID_ARGUMENT


def test_a_program_that_does_not_sample_takes_no_frequency() -> None:
    p = _policy("")
    with pytest.raises(BrokerError) as e:
        check_params(p, CALLER, _resolved(p, "syscount"), pb.AttachParams(frequency=99))
    assert e.value.code == pb.ERROR_INVALID_ARGUMENT
    assert "takes no frequency" in e.value.message


def test_admin_approve_writes_max_frequency(capsys: pytest.CaptureFixture[str]) -> None:
    from gfxbpf.broker import admin

    argv = ["approve", "profile", "--users", "alice", "--scope", "self", "--max-frequency", "499"]
    assert admin.main(argv) == 0
    entry = Policy.parse(capsys.readouterr().out, path="p.toml").programs[0]
    assert entry.name == "profile" and entry.max_frequency == 499
