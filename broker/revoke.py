"""Whether the policy in force still allows a live attachment.

A reload (SIGHUP) re-decides every live attachment with the new policy and
detaches those it no longer allows (Service.revoke_disallowed); every later
call on an attachment decided under an older policy decides again first
(Service._recheck), so a call racing a reload never reads under the old one.

Every knob of a policy entry counts (issue 35 item 6): a reload that lowers
max_stack_bytes, raises min_block_us, lowers max_python_frames or
max_frequency, narrows libraries or functions, or withdraws allow_no_btf
from an object loaded without its BTF revokes what no longer fits, as the
attach itself would have been refused. KNOBS names the fields checked here
and NOT_KNOBS those decide() already covers or that limit nothing: a unit
test fails when a field is added to ProgramEntry in neither.
"""

from __future__ import annotations

from gfxbpf.broker.owners import Attachment
from gfxbpf.broker.policy.model import ProgramEntry
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.request.params import MIN_BLOCK_FLOOR_US
from gfxbpf.catalog import pymaps
from gfxbpf.catalog.instance import Params
from gfxbpf.catalog.stack_copies import DEFAULT_STACK_BYTES

__all__ = ["KNOBS", "NOT_KNOBS", "allows"]

KNOBS = (
    "libraries",
    "functions",
    "max_frequency",
    "max_stack_bytes",
    "min_block_us",
    "max_python_frames",
    "allow_no_btf",
)
# Decided by Policy.decide (who, what, which scope), or no limit at all.
NOT_KNOBS = ("index", "name", "sha256", "users", "groups", "scopes", "description", "source")


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
    inst = att.shared.inst
    copies = inst.entry.stack_bytes_knob is not None
    return _knobs_fit(d.entry, inst.params, key.frequency, copies) and (
        d.entry.allow_no_btf or inst.obj.btf_error is None
    )


def _knobs_fit(entry: ProgramEntry, params: Params, frequency: int | None, copies: bool) -> bool:
    """The attachment's sampling rate, stack copy size, shortest wait and
    Python depth within the entry's caps, as request/params.py checks them
    at attach (a knob the program lacks is None there and here)."""
    cap = entry.max_frequency
    if frequency and cap is not None and frequency > cap:
        return False
    if copies:  # None: the object's default copy
        copied = params.stack_bytes or DEFAULT_STACK_BYTES
        if copied > (entry.max_stack_bytes or DEFAULT_STACK_BYTES):
            return False
    floor = entry.min_block_us or MIN_BLOCK_FLOOR_US
    if params.min_block_us is not None and params.min_block_us < floor:
        return False
    frames = params.python_frames or pymaps.DEFAULT_FRAMES
    cap = entry.max_python_frames
    return not (params.python_files and cap is not None and frames > cap)
