"""The wire's pb.Scope and the scope names ("self", "system"), both ways.

The one mapping the broker and the client use. The names are the enum's own
(SCOPE_SELF is "self"); gfxbpf.bpf.consts.SCOPES lists the same names for the
layers below the wire, and tests/unit/test_scopes.py checks that they agree.
"""

from __future__ import annotations

from typing import cast

from gfxbpf.proto import gfxbpf_pb2 as pb

__all__ = ["SCOPE_ENUMS", "SCOPE_NAMES", "is_scope_value"]

_PREFIX = "SCOPE_"


def _scopes() -> dict[str, pb.Scope]:
    """{"self": pb.SCOPE_SELF, ...} from the enum itself, unspecified left out."""
    out = {}
    for name, value in pb.Scope.items():
        if value != pb.SCOPE_UNSPECIFIED:
            out[name.removeprefix(_PREFIX).lower()] = cast(pb.Scope, value)  # stubs say int
    return out


# Every scope a program runs in, by name, narrowest first (the enum's order).
SCOPE_ENUMS: dict[str, pb.Scope] = _scopes()
SCOPE_NAMES: dict[int, str] = {v: k for k, v in SCOPE_ENUMS.items()}


def is_scope_value(value: int) -> bool:
    """A value the Scope field may carry: a scope, or unspecified (the policy picks)."""
    return value == pb.SCOPE_UNSPECIFIED or value in SCOPE_NAMES
