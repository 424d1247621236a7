"""Attach, first step: find the object (catalog name or uploaded bytes, hashed
once) and ask the policy whether this caller may run it in this scope."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gfxbpf.bpf.consts import Scope
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import DENIAL_CODES, BrokerError, over_limit
from gfxbpf.broker.policy.rules import Decision, Policy, ProgramEntry
from gfxbpf.broker.review.objects import Objects
from gfxbpf.catalog.entries import Catalog, Program
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto.scopes import SCOPE_NAMES, is_scope_value


@dataclass
class Resolved:
    """An attach request resolved to bytes, metadata and a policy decision."""

    data: bytes
    sha256: str
    entry: Program
    policy_entry: ProgramEntry
    scope: Scope
    rule: str  # the whole rule, for the audit log
    via: str  # "name" or "bytes"


def decide(
    policy: Policy, caller: Caller, name: str | None, sha: str, scope: str | None
) -> Decision:
    """An allowing decision, or BrokerError.

    The caller is told what they lack and a reference to the rule; the
    whole rule (other principals, the policy's path) is for the audit log.
    """
    d = policy.decide(caller.uid, caller.gids, name, sha, scope)
    if d.allowed:
        assert d.entry is not None and d.scope is not None
        return d
    code = DENIAL_CODES[d.refusal]
    if name is None:
        msg = f"uploaded object (sha256 {sha}) is not approved for you"
    elif code == pb.ERROR_HASH_MISMATCH:
        msg = f"program {name!r} (sha256 {sha}) is not the reviewed object"
    else:
        msg = f"you may not run program {name!r}" + (f" with scope {scope}" if scope else "")
    raise BrokerError(code, f"{msg}: {d.reason}", rule=d.ref, audit_rule=d.rule)


def resolve(
    policy: Policy,
    catalog: Catalog,
    objects: Objects,
    caller: Caller,
    req: pb.AttachRequest,
    fields: dict[str, object],
) -> Resolved:
    """Find the object and ask the policy; fields (for the audit line) fill in as
    they become known, so a refusal is logged with what was asked."""
    if not is_scope_value(req.scope):
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"unknown scope value {req.scope}")
    scope = SCOPE_NAMES.get(req.scope)
    fields["scope"] = scope
    which = req.WhichOneof("program")
    if which == "name":
        return _by_name(policy, catalog, objects, caller, req.name, scope, fields)
    if which == "object":
        return _by_bytes(policy, catalog, objects, caller, bytes(req.object), scope, fields)
    raise BrokerError(
        pb.ERROR_INVALID_ARGUMENT, "AttachRequest names no program: set name or object"
    )


def _by_name(
    policy: Policy,
    catalog: Catalog,
    objects: Objects,
    caller: Caller,
    name: str,
    scope: str | None,
    fields: dict[str, object],
) -> Resolved:
    entry = next((p for p in catalog.programs if p.name == name), None)
    if entry is None:
        # Policy first: a name nobody approved for this caller is a plain
        # refusal, the same whether someone else's entry names it or not.
        if not any(e.name == name for e in policy.programs_for(caller.uid, caller.gids)):
            decide(policy, caller, name, "0" * 64, scope)
        raise BrokerError(
            pb.ERROR_NOT_FOUND,
            f"no program {name!r} in the broker's catalog (known: "
            f"{', '.join(catalog.names())}); send the approved object's bytes",
        )
    fields["sha256"] = entry.sha256
    data = objects.catalog_bytes(entry)
    d = decide(policy, caller, name, entry.sha256, scope)
    assert d.entry is not None and d.scope is not None
    return Resolved(data, entry.sha256, entry, d.entry, d.scope, d.rule, "name")


def _by_bytes(
    policy: Policy,
    catalog: Catalog,
    objects: Objects,
    caller: Caller,
    data: bytes,
    scope: str | None,
    fields: dict[str, object],
) -> Resolved:
    limit = policy.limits.max_object_bytes
    if len(data) > limit:
        raise over_limit(
            f"uploaded object is {len(data)} bytes, over the policy's limit of {limit}",
            policy.path,
            "max_object_bytes",
            limit,
        )
    sha = hashlib.sha256(data).hexdigest()
    fields["sha256"] = sha
    d = decide(policy, caller, None, sha, scope)
    pentry = d.entry
    assert pentry is not None and d.scope is not None
    fields["program"] = pentry.name
    # The audit runs before anything else touches these bytes' meaning.
    objects.audit(data, sha, pentry.name)
    entry = next((p for p in catalog.programs if p.sha256 == sha), None)
    if entry is None:
        entry = next((p for p in catalog.programs if p.name == pentry.name), None)
    if entry is None:
        raise BrokerError(
            pb.ERROR_NOT_FOUND,
            f"uploaded object (sha256 {sha}) is approved by {pentry.label}, but no "
            f"catalog program is named {pentry.name!r} or has that hash: the broker "
            "needs a catalog entry (attach points, knobs, visible maps) to run it",
            rule=d.ref,
            audit_rule=d.rule,
        )
    return Resolved(data, sha, entry, pentry, d.scope, d.rule, "bytes")
