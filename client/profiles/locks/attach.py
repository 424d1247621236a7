"""Attaching program `locks` for `profile --locks` (scope self: stack copies)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gfxbpf.client.errors import BrokerError, ClientError
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.engine.request import ProfileRequest

PROGRAM = "locks"


def attach_locks(
    broker: Broker, req: ProfileRequest, pid: int | None, children: bool
) -> Attachment:
    """The locks attachment; a clear error where the broker or the policy lacks it."""
    kw: dict[str, Any] = {"pid": pid, "children": children}
    if req.stack_bytes:
        kw["stack_bytes"] = req.stack_bytes
    try:
        return broker.attach(PROGRAM, scope="self", **kw)
    except BrokerError as e:
        if e.code == pb.ERROR_NOT_FOUND and e.refuses_program:  # not "no process N"
            raise ClientError(
                f"--locks needs program {PROGRAM}, which this broker does not offer "
                f"(or the policy does not grant you): {e}"
            ) from None
        raise
