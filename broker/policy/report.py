"""What --check-policy and a reload report about a valid policy.

Warnings name things that are valid but probably wrong (accounts that do
not exist yet, entries that admit nobody, hashes the catalog disagrees
with); the summary is the policy in a few lines. `gfxbpf-broker --check-policy`
and reloads call in here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gfxbpf.broker.policy.model import LIMIT_KEYS, WILDCARD
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.tomlcheck.checks import show


def check_warnings(policy: Policy) -> list[str]:
    """Things that are valid but probably wrong (for --check-policy)."""
    out: list[str] = []
    seen: dict[tuple[Any, ...], int] = {}
    for e in policy.programs:
        for u in e.users:
            if isinstance(u, str) and u != WILDCARD and policy.resolver.uid_of(u) is None:
                out.append(f"{e.where}: field 'users': no user {show(u)} on this host (yet)")
        for g in e.groups:
            if isinstance(g, str) and g != WILDCARD and policy.resolver.gid_of(g) is None:
                out.append(f"{e.where}: field 'groups': no group {show(g)} on this host (yet)")
        if not e.users and not e.groups:
            out.append(f"{e.where}: neither users nor groups: the entry admits nobody")
        if not e.functions:
            out.append(f"{e.where}: field 'functions' is empty: no uprobe can attach")
        key = (
            e.name,
            e.sha256,
            e.users,
            e.groups,
            e.scopes,
            e.libraries,
            e.functions,
            e.max_frequency,
            e.allow_no_btf,
        )
        if key in seen:
            out.append(f"{e.where}: same as [[program]] #{seen[key]}")
        else:
            seen[key] = e.index
    for c in policy.tls_clients:
        if isinstance(c.user, str) and policy.resolver.uid_of(c.user) is None:
            out.append(
                f"{policy.path} [[tls_client]] #{c.index}: field 'user': no user "
                f"{show(c.user)} on this host (yet)"
            )
    return out + _limit_warnings(policy)


def _limit_warnings(policy: Policy) -> list[str]:
    lim, where = policy.limits, f"{policy.path} [limits]"
    out = []
    if lim.grpc_connections_per_user > lim.grpc_connections_total:
        out.append(
            f"{where}: grpc_connections_per_user ({lim.grpc_connections_per_user}) is more "
            f"than grpc_connections_total ({lim.grpc_connections_total}): one user can take "
            "every gRPC connection"
        )
    if lim.sessions_per_user > lim.sessions_total:
        out.append(
            f"{where}: sessions_per_user ({lim.sessions_per_user}) is more than "
            f"sessions_total ({lim.sessions_total}): one user can take every session"
        )
    return out


def catalog_warnings(policy: Policy, catalog: Iterable[Any]) -> list[str]:
    """Entries that disagree with the catalog (for --check-policy).

    catalog: programs with .name, .sha256 and .scopes (gfxbpf.catalog.entries).
    """
    programs = {p.name: p for p in catalog}
    out: list[str] = []
    for e in policy.programs:
        prog = programs.get(e.name)
        if prog is None:
            out.append(
                f"{e.where}: no program {show(e.name)} in the catalog "
                f"(known: {', '.join(sorted(programs)) or 'none'}); only uploaded "
                "objects with this hash can match"
            )
            continue
        if prog.sha256.lower() != e.sha256:
            out.append(
                f"{e.where}: field 'sha256': the catalog's object has sha256 "
                f"{prog.sha256.lower()}; this entry approves another build, so the "
                "catalog program is refused (re-approve it: gfxbpf-admin approve "
                f"{e.name})"
            )
        unsupported = [sc for sc in e.scopes if sc not in tuple(prog.scopes)]
        if unsupported:
            out.append(
                f"{e.where}: field 'scope': the catalog program supports only "
                f"{', '.join(prog.scopes)}, not {', '.join(unsupported)}"
            )
    return out


def summary(policy: Policy) -> str:
    names = {e.name for e in policy.programs}
    lines = [
        f"{policy.path}: {len(policy.programs)} [[program]] entries for {len(names)} programs, "
        f"{len(policy.tls_clients)} [[tls_client]] entries"
    ]
    for e in policy.programs:
        who = []
        if e.users:
            who.append(f"users {', '.join(str(u) for u in e.users)}")
        if e.groups:
            who.append(f"groups {', '.join(str(g) for g in e.groups)}")
        line = f"  #{e.index} {e.name}  sha256 {e.sha256[:16]}...  scope {'/'.join(e.scopes)}  " + (
            "; ".join(who) or "nobody"
        )
        if e.libraries:
            line += f"  libraries {', '.join(e.libraries)}"
        if e.max_frequency is not None:
            line += f"  max_frequency {e.max_frequency} Hz"
        if e.allow_no_btf:
            line += "  allow_no_btf"
        lines.append(line)
    lim = ", ".join(f"{k}={getattr(policy.limits, k)}" for k in LIMIT_KEYS)
    lines.append(f"  limits: {lim}")
    return "\n".join(lines)
