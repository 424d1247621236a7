"""BrokerError, and the one table from a policy refusal to its protocol code."""

from __future__ import annotations

from typing import cast

from gfxbpf.broker.policy.model import Refusal
from gfxbpf.proto import gfxbpf_pb2 as pb

# A refused Decision's kind -> the ErrorCode the caller gets.
DENIAL_CODES: dict[str, int] = {
    Refusal.UNKNOWN_PROGRAM: pb.ERROR_PERMISSION_DENIED,
    Refusal.UNAPPROVED_HASH: pb.ERROR_HASH_MISMATCH,
    Refusal.NOT_LISTED: pb.ERROR_PERMISSION_DENIED,
    Refusal.SCOPE: pb.ERROR_PERMISSION_DENIED,
    Refusal.BAD_SCOPE: pb.ERROR_PERMISSION_DENIED,
}

# Audit-log result "denied" (a refusal) rather than "error" (a failure).
_DENIED = frozenset(
    {
        pb.ERROR_PERMISSION_DENIED,
        pb.ERROR_HASH_MISMATCH,
        pb.ERROR_AUDIT_FAILED,
        pb.ERROR_RESOURCE_EXHAUSTED,
        pb.ERROR_UNAUTHENTICATED,
    }
)


class BrokerError(Exception):
    """An operation failed; code is a pb.ErrorCode.

    message and rule go to the caller: rule is a reference to the policy
    rule that decided, to quote to the administrator (no policy path, no
    other principal). audit_rule, the whole rule, goes to the audit log only.
    """

    def __init__(self, code: int, message: str, rule: str = "", *, audit_rule: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule
        self.audit_rule = audit_rule or rule

    def to_pb(self) -> pb.Error:
        code = cast("pb.ErrorCode", self.code)  # an ErrorCode value, typed as int here
        return pb.Error(code=code, message=self.message, rule=self.rule)

    @property
    def result(self) -> str:
        """The audit-log result word for this error."""
        return "denied" if self.code in _DENIED else "error"


def over_limit(message: str, policy_path: str, key: str, limit: int) -> BrokerError:
    """A [limits] refusal: the caller is told their own limit, the audit log the file too."""
    rule = f"[limits] {key} = {limit}"
    return BrokerError(
        pb.ERROR_RESOURCE_EXHAUSTED, message, rule=rule, audit_rule=f"{policy_path} {rule}"
    )
