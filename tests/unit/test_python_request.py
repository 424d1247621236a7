"""Python files and frame depth in attach requests (stackcopy, ustackcopy):
the broker's checks (broker/request/pyfiles.py), the policy's
max_python_frames, and what lands in the object (catalog/pymaps.py)."""

from __future__ import annotations

import struct

import pytest

from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Caller
from gfxbpf.broker.policy.rules import Policy, PolicyError
from gfxbpf.broker.request.params import check_params
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog import pymaps
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.instance import ParameterError, Params, prepare
from gfxbpf.catalog.python.layouts import LAYOUTS
from gfxbpf.proto import gfxbpf_pb2 as pb

SHA = "a" * 64
CALLER = Caller(uid=1000, gid=1000, gids=(1000,), pid=0, transport="grpc")


def _check(name: str, params: pb.AttachParams, extra: str = "") -> tuple:
    policy = Policy.parse(
        f'[[program]]\nname = "{name}"\nsha256 = "{SHA}"\nusers = ["*"]\n{extra}',
        path="policy.toml",
    )
    res = Resolved(b"", SHA, load_catalog().get(name), policy.programs[0], "self", "r", name)
    t = check_params(policy, CALLER, res, params)
    return t.python_files, t.python_frames


def _file(ino: int = 5, major: int = 3, minor: int = 11) -> pb.PythonFile:
    return pb.PythonFile(dev=0x800001, ino=ino, runtime_off=0x63C740, major=major, minor=minor)


def test_files_pass_to_the_target() -> None:
    files, frames = _check("stackcopy", pb.AttachParams(python_files=[_file()]))
    assert files == (pymaps.PythonFile(0x800001, 5, 0x63C740, (3, 11)),)
    assert frames is None  # the object's 64


def test_at_most_16_files() -> None:
    params = pb.AttachParams(python_files=[_file(ino=i + 1) for i in range(17)])
    with pytest.raises(BrokerError) as e:
        _check("stackcopy", params)
    assert "17 Python files; at most 16" in str(e.value)


def test_unknown_versions_are_refused_with_the_known_ones() -> None:
    with pytest.raises(BrokerError) as e:
        _check("stackcopy", pb.AttachParams(python_files=[_file(minor=7)]))
    assert "Python 3.7" in str(e.value) and "3.11" in str(e.value)


def test_a_free_threaded_file_gets_its_own_layout_or_a_refusal() -> None:
    ft = _file(minor=13)
    ft.free_threaded = True
    files, _ = _check("stackcopy", pb.AttachParams(python_files=[ft]))
    assert files == (pymaps.PythonFile(0x800001, 5, 0x63C740, (3, 13), free_threaded=True),)
    assert pymaps.layout_index((3, 13), True) == len(LAYOUTS)  # after every default build
    assert pymaps.layout_index((3, 13)) != pymaps.layout_index((3, 13), True)
    ft = _file(minor=14)
    ft.free_threaded = True
    with pytest.raises(BrokerError) as e:
        _check("stackcopy", pb.AttachParams(python_files=[ft]))
    assert "Python 3.14t" in str(e.value) and "3.13t" in str(e.value), str(e.value)


def test_a_program_without_a_walker_takes_no_files() -> None:
    with pytest.raises(BrokerError) as e:
        _check("profile", pb.AttachParams(python_files=[_file()]))
    assert "walks no Python frames" in str(e.value)


def test_the_policy_caps_the_depth() -> None:
    assert _check("stackcopy", pb.AttachParams(), "max_python_frames = 16\n")[1] == 16
    assert _check("stackcopy", pb.AttachParams(python_frames=8))[1] == 8
    with pytest.raises(BrokerError) as e:
        _check("stackcopy", pb.AttachParams(python_frames=32), "max_python_frames = 16\n")
    assert "max_python_frames" in (e.value.rule or "")
    with pytest.raises(BrokerError):
        _check("stackcopy", pb.AttachParams(python_frames=129))


@pytest.mark.parametrize("bad", ["0", "129", '"64"'])
def test_policy_refuses_bad_max_python_frames(bad: str) -> None:
    with pytest.raises(PolicyError) as e:
        Policy.parse(
            f'[[program]]\nname = "stackcopy"\nsha256 = "{SHA}"\nusers = ["*"]\n'
            f"max_python_frames = {bad}\n",
            path="policy.toml",
        )
    assert "max_python_frames" in str(e.value)


@pytest.mark.parametrize("name", ["stackcopy", "ustackcopy"])
def test_the_depth_knob_lands_in_rodata(name: str) -> None:
    entry = load_catalog().get(name)
    data = (entry.directory / entry.object).read_bytes()
    spec, _ = prepare(entry, data, Params(uid=1000, python_frames=32))
    assert spec.get_variable("python_frames") == 32
    with pytest.raises(ParameterError):
        prepare(entry, data, Params(uid=1000, python_frames=500))


def test_layout_slots_and_the_packed_struct() -> None:
    # struct py_layout in gfx_python.h: 28 u32, the version first.
    for i, version in enumerate(sorted(LAYOUTS)):
        assert pymaps.layout_index(version) == i
        packed = LAYOUTS[version].pack()
        assert len(packed) == 28 * 4
        assert struct.unpack_from("<I", packed)[0] == version[0] << 8 | version[1]
    assert len(LAYOUTS) <= 16  # GFX_PY_LAYOUTS
    assert pymaps.layout_index((2, 7)) is None
