"""btf_sanitize.sanitize: each kind a kernel may lack rewritten as libbpf rewrites it."""

from __future__ import annotations

from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.kinds import (
    INT_SIGNED,
    KIND_CONST,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_FLOAT,
    KIND_INT,
    KIND_PTR,
    KIND_STRUCT,
    KIND_TYPE_TAG,
    KIND_UNION,
    KIND_VAR,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Int,
    Ptr,
    TypeTag,
    Union,
    Var,
    VarSecinfo,
    Void,
)
from gfxbpf.bpf.btf.parse import parse_blob
from gfxbpf.bpf.btf.sanitize import FEATURES, needs_sanitizing, sanitize

ALL = frozenset(FEATURES)


def _btf() -> Btf:
    strs = b"\0int\0f\0tag\0w\0A\0B\0s\0N\0x\0?.data\0"
    #       0 1    5 7    11 13 15 17 19 21 23
    types = [
        Void(0, 0, "", 0, False),
        Int(1, KIND_INT, "int", 1, False, 4, INT_SIGNED, 0, 32),
        Float(2, KIND_FLOAT, "f", 5, False, 8),
        TypeTag(3, KIND_TYPE_TAG, "tag", 7, False, 1),
        Ptr(4, KIND_PTR, "", 0, False, 3),
        Enum(5, KIND_ENUM64, "w", 11, False, 8, [EnumValue("A", 13, 1), EnumValue("B", 15, 2**40)]),
        Enum(6, KIND_ENUM, "s", 17, True, 4, [EnumValue("N", 19, -1)]),
        Var(7, KIND_VAR, "x", 21, False, 1, 0),
        DeclTag(8, KIND_DECL_TAG, "tag", 7, False, 7, -1),
        Datasec(9, KIND_DATASEC, "?.data", 23, False, 4, [VarSecinfo(7, 0, 4)]),
    ]  # fmt: skip
    return Btf(types, strs)


def test_nothing_missing_means_nothing_to_do() -> None:
    assert not needs_sanitizing(_btf(), frozenset())
    assert needs_sanitizing(_btf(), frozenset({"float"}))


def test_every_refused_kind_is_rewritten_keeping_ids() -> None:
    orig = _btf()
    out = sanitize(orig, ALL)
    kinds = [t.kind for t in out.types]
    assert kinds[1:10] == [
        KIND_INT, KIND_STRUCT, KIND_CONST, KIND_PTR, KIND_UNION, KIND_ENUM, KIND_VAR, KIND_INT,
        KIND_DATASEC,
    ]  # fmt: skip
    assert out.types[2].size == 8 and out.types[2].name == ""  # FLOAT: anonymous, same size
    assert out.types[3].type == 1 and out.types[3].name == ""  # TYPE_TAG: CONST of its type
    union = out.types[5]
    assert isinstance(union, Union) and union.size == 8
    assert [m.name for m in union.members] == ["A", "B"]
    placeholder = out.types[10]  # appended once, for every ENUM64
    assert isinstance(placeholder, Int) and placeholder.name == "enum64_placeholder"
    assert {m.type for m in union.members} == {10} and {m.bit_offset for m in union.members} == {0}
    assert not out.types[6].kind_flag  # signed ENUM: kind_flag cleared
    assert out.types[8].name == "tag" and out.types[8].size == 1  # DECL_TAG: 1-byte INT
    assert out.types[9].name == "_.data"
    assert orig.types[9].name == "?.data" and orig.types[2].kind == KIND_FLOAT  # a copy
    # The result is a well-formed blob with the same types.
    assert [t.kind for t in parse_blob(out.to_bytes()).types] == kinds


def test_only_the_missing_features_are_rewritten() -> None:
    out = sanitize(_btf(), frozenset({"decl_tag"}))
    assert [t.kind for t in out.types] == [t.kind for t in _btf().types][:8] + [KIND_INT, 15]
