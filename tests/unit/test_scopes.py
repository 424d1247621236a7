"""One vocabulary of scopes: the names below the wire and the wire's enum agree."""

from __future__ import annotations

from gfxbpf.bpf import consts
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto.scopes import SCOPE_ENUMS, SCOPE_NAMES, is_scope_value


def test_wire_names_are_the_bpf_names_in_order() -> None:
    assert tuple(SCOPE_ENUMS) == consts.SCOPES == ("self", "system", "job")


def test_mapping_both_ways() -> None:
    assert SCOPE_ENUMS == {"self": pb.SCOPE_SELF, "system": pb.SCOPE_SYSTEM, "job": pb.SCOPE_JOB}
    assert SCOPE_NAMES == {pb.SCOPE_SELF: "self", pb.SCOPE_SYSTEM: "system", pb.SCOPE_JOB: "job"}


def test_scope_values() -> None:
    assert all(
        is_scope_value(v)
        for v in (pb.SCOPE_UNSPECIFIED, pb.SCOPE_SELF, pb.SCOPE_SYSTEM, pb.SCOPE_JOB)
    )
    assert not is_scope_value(7) and not is_scope_value(-1)
