"""Whether the policy in force still allows a live attachment.

A reload (SIGHUP) re-decides every live attachment with the new policy and
detaches those it no longer allows (Service.revoke_disallowed); every later
call on an attachment decided under an older policy decides again first
(Service._recheck), so a call racing a reload never reads under the old one.
"""

from __future__ import annotations

from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.sessions import Attachment


def allows(policy: Policy, att: Attachment) -> bool:
    """Would policy let att's owner attach it now, as it was attached?"""
    caller = att.owner.caller
    d = policy.decide(caller.uid, caller.gids, att.name, att.sha256, att.scope)
    if not d.allowed or d.entry is None or d.scope != att.scope:
        return False
    key = att.key
    if key.library is not None and not policy.library_allowed(d.entry, key.library):
        return False
    if not all(policy.function_allowed(d.entry, f) for f in key.functions):
        return False
    cap = d.entry.max_frequency
    return not (key.frequency and cap is not None and key.frequency > cap)
