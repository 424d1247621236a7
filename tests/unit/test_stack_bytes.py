"""The size of stack copies (stackcopy, ustackcopy, cudakernels ...): the policy's
max_stack_bytes key, the size a client asks for (params.stack_bytes), and
the knob the broker writes from them."""

from __future__ import annotations

import json
import sys

import pytest

from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Caller
from gfxbpf.broker.policy.rules import Policy, PolicyError
from gfxbpf.broker.request.params import check_params
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.instance import Params, prepare
from gfxbpf.catalog.stack_copies import (
    DEEP_STACK_BYTES,
    DEFAULT_STACK_BYTES,
    MAX_STACK_BYTES,
)
from gfxbpf.proto import gfxbpf_pb2 as pb

SHA = "a" * 64
CALLER = Caller(uid=1000, gid=1000, gids=(1000,), pid=0, transport="grpc")


def _policy(name: str, extra: str) -> Policy:
    return Policy.parse(
        f'[[program]]\nname = "{name}"\nsha256 = "{SHA}"\nusers = ["*"]\n{extra}',
        path="policy.toml",
    )


def _target(name: str, extra: str, asked: int = 0) -> int | None:
    params = pb.AttachParams(stack_bytes=asked)
    if name == "cudakernels":  # probes a library: any file stands in for the CUPTI one
        params.library = sys.executable
        extra += f"libraries = [{json.dumps(sys.executable)}]\n"
    policy = _policy(name, extra)
    res = Resolved(b"", SHA, load_catalog().get(name), policy.programs[0], "self", "r", name)
    return check_params(policy, CALLER, res, params).stack_bytes


def test_the_policy_sets_the_default_copy_size() -> None:
    """A request that names no size gets the entry's max_stack_bytes: the
    policy decides how deep its users' copies go (docs/ARCHITECTURE.md)."""
    assert _target("stackcopy", "max_stack_bytes = 1024\n") == 1024
    assert _target("stackcopy", "max_stack_bytes = 16384\n") == 16384
    assert _target("stackcopy", "") is None  # the object's own 8 KiB
    assert _target("profile", "max_stack_bytes = 1024\n") is None  # copies nothing


def test_the_client_chooses_a_size_within_the_cap() -> None:
    assert _target("stackcopy", "", asked=2048) == 2048
    assert _target("stackcopy", "max_stack_bytes = 4096\n", asked=4096) == 4096
    assert _target("stackcopy", "max_stack_bytes = 4096\n", asked=100) == 100


def test_more_than_the_default_where_the_policy_allows_it() -> None:
    """Up to the objects' 24 KiB (deep C++ stacks such as PyTorch's), only
    where the entry's max_stack_bytes says so; without it the default stays 8 KiB."""
    assert _target("stackcopy", "max_stack_bytes = 16384\n", asked=16384) == 16384
    assert _target("stackcopy", "max_stack_bytes = 12288\n", asked=12288) == 12288
    assert _target("stackcopy", f"max_stack_bytes = {MAX_STACK_BYTES}\n") == MAX_STACK_BYTES
    assert _target("stackcopy", "max_stack_bytes = 16384\n", asked=4096) == 4096


@pytest.mark.parametrize(
    ("name", "extra", "asked", "code"),
    [
        ("stackcopy", "max_stack_bytes = 1024\n", 2048, pb.ERROR_PERMISSION_DENIED),
        ("stackcopy", "", 8193, pb.ERROR_PERMISSION_DENIED),  # above the default: policy says
        ("stackcopy", "max_stack_bytes = 12288\n", 16384, pb.ERROR_PERMISSION_DENIED),
        ("stackcopy", "max_stack_bytes = 16384\n", 16385, pb.ERROR_PERMISSION_DENIED),
        ("stackcopy", "", MAX_STACK_BYTES + 1, pb.ERROR_INVALID_ARGUMENT),  # > object
        # cudakernels copies deeper, straight into its ring (gfx_udeep.h), and no further
        ("cudakernels", "", DEEP_STACK_BYTES + 1, pb.ERROR_INVALID_ARGUMENT),
        (
            "cudakernels",
            f"max_stack_bytes = {MAX_STACK_BYTES}\n",
            MAX_STACK_BYTES + 1,
            pb.ERROR_PERMISSION_DENIED,
        ),  # fmt: skip
        ("profile", "", 1024, pb.ERROR_INVALID_ARGUMENT),  # copies no stack
    ],
)
def test_sizes_the_broker_refuses(name: str, extra: str, asked: int, code: int) -> None:
    with pytest.raises(BrokerError) as e:
        _target(name, extra, asked)
    assert e.value.code == code, e.value


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        *[("stackcopy", bad) for bad in ["-1", '"8k"', str(MAX_STACK_BYTES + 1), "true"]],
        ("cudakernels", str(DEEP_STACK_BYTES + 1)),
    ],
)
def test_policy_refuses_bad_max_stack_bytes(name: str, bad: str) -> None:
    with pytest.raises(PolicyError) as e:
        _policy(name, f"max_stack_bytes = {bad}\n")
    assert "max_stack_bytes" in str(e.value) and "bytes of user stack" in str(e.value)


def test_launch_copies_go_deeper_than_the_scratch_holds() -> None:
    """cudakernels' copies are reserved in its ring (72 KiB: past cuBLASLt's
    frames), by the policy and by a request; the scratch programs' are not."""
    most = f"max_stack_bytes = {DEEP_STACK_BYTES}\n"
    assert _target("cudakernels", most) == DEEP_STACK_BYTES
    assert _target("cudakernels", most, asked=40000) == 40000
    with pytest.raises(PolicyError):
        _policy("stackcopy", most)


@pytest.mark.parametrize("name", ["stackcopy", "ustackcopy"])
def test_the_knob_lands_in_rodata(name: str) -> None:
    entry = load_catalog().get(name)
    data = (entry.directory / entry.object).read_bytes()
    spec, _ = prepare(entry, data, Params(uid=1000, stack_bytes=2048))
    assert spec.get_variable("stack_bytes") == 2048


def test_admin_approve_writes_max_stack_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    from gfxbpf.broker import admin

    argv = ["approve", "stackcopy", "--users", "alice", "--max-stack-bytes", "16384"]
    assert admin.main(argv) == 0
    assert Policy.parse(capsys.readouterr().out, path="p.toml").programs[0].max_stack_bytes == 16384
    assert admin.main(["approve", "profile", "--users", "alice", "--max-stack-bytes", "4096"]) == 2
    assert "copies no stack" in capsys.readouterr().err
    argv = ["approve", "stackcopy", "--users", "alice", "--max-stack-bytes", "24577"]
    assert admin.main(argv) == 2  # more than this program copies: says its most
    assert "copies at most 24576 bytes of stack" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # more than any program copies
        admin.main(["approve", "cudakernels", "--users", "alice", "--max-stack-bytes", "73729"])


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("stackcopy", MAX_STACK_BYTES),
        ("ustackcopy", MAX_STACK_BYTES),
        ("cudakernels", DEEP_STACK_BYTES),
        ("offcpu", None),
    ],
)
def test_admin_approve_lets_cpu_samples_copy_whole_stacks_by_default(
    capsys: pytest.CaptureFixture[str], name: str, want: int | None
) -> None:
    """Without --max-stack-bytes, approve writes the objects' whole copy for the
    CPU-sample and probe programs (PyTorch's stacks need 13-20 KiB), and
    leaves offcpu (a copy per wait) at the 8 KiB default."""
    from gfxbpf.broker import admin

    assert admin.main(["approve", name, "--users", "alice"]) == 0
    entry = Policy.parse(capsys.readouterr().out, path="p.toml").programs[0]
    assert entry.max_stack_bytes == want


def test_the_bounds_are_the_objects_own() -> None:
    """catalog.stack_copies says what gfx_ucopy.h compiles in: its record size
    (GFX_COPY_MAX) and its knob's default."""
    import re
    from pathlib import Path

    import gfxbpf.catalog

    header = (Path(gfxbpf.catalog.__file__).parent / "programs" / "gfx_ucopy.h").read_text()
    assert re.search(r"#define GFX_COPY_MAX (\d+)", header)[1] == str(MAX_STACK_BYTES)  # type: ignore[index]
    knob = re.search(r"const volatile __u32 stack_bytes = (\d+);", header)
    assert knob is not None and int(knob[1]) == DEFAULT_STACK_BYTES
    cuda = (Path(gfxbpf.catalog.__file__).parent / "programs" / "cudakernels.bpf.c").read_text()
    assert re.search(r"#define GFX_DEEP_COPY_MAX (\d+)", cuda)[1] == str(DEEP_STACK_BYTES)  # type: ignore[index]
