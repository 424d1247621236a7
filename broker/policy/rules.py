"""The broker's policy: which users may run which reviewed programs, how.

Anything the policy does not allow is denied. This module holds what a
policy is (its entries, limits and certificate mappings) and what it
decides; gfxbpf.broker.policy.fileformat reads and validates the TOML file, and
its docstring shows the format.

Several entries may name the same program (different users, scopes or
hashes). User and group names are resolved when a decision is made, so a
policy may name accounts created later; `policy_report.check_warnings()` lists names that
do not resolve now.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Iterable, Mapping
from typing import Any

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.broker.policy import fileformat
from gfxbpf.broker.policy.model import (  # noqa: F401 - re-exported: callers import them here
    LIMIT_KEYS,
    MAX_FREQUENCY,
    MAX_MIN_BLOCK_US,
    WILDCARD,
    Decision,
    Limits,
    NameResolver,
    PolicyError,
    ProgramEntry,
    Refusal,
    TlsClient,
    labels,
)
from gfxbpf.broker.policy.pathglob import is_plain_path, path_matches, resolve_pattern
from gfxbpf.tomlcheck.checks import show


def _upload(program_name: str | None, d: Decision) -> Decision:
    """An upload is known only by its hash: whatever refuses it, that hash is
    what is not approved for this caller."""
    if program_name is None and not d.allowed:
        return dataclasses.replace(d, refusal=Refusal.UNAPPROVED_HASH)
    return d


class Policy:
    """A validated policy. Build it with Policy.load(path) or Policy.parse(text)."""

    def __init__(
        self,
        programs: Iterable[ProgramEntry] = (),
        limits: Limits | None = None,
        tls_clients: Iterable[TlsClient] = (),
        *,
        path: str = "<policy>",
        resolver: NameResolver | None = None,
    ) -> None:
        self.path = path
        self.programs = tuple(programs)
        self.limits = limits or Limits()
        self.tls_clients = tuple(tls_clients)
        self.resolver = resolver or NameResolver()

    # ------------------------------------------------------------ loading
    # The file format lives in policy_file, which builds policy_types' data
    # classes: policy -> policy_file -> policy_types, one way.

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, resolver: NameResolver | None = None) -> Policy:
        p = os.fspath(path)
        return cls.parse(fileformat.read_text(p), path=p, resolver=resolver)

    @classmethod
    def parse(
        cls, text: str, *, path: str = "<policy>", resolver: NameResolver | None = None
    ) -> Policy:
        return cls.from_dict(fileformat.parse_toml(text, path), path=path, resolver=resolver)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        path: str = "<policy>",
        resolver: NameResolver | None = None,
    ) -> Policy:
        programs, limits, tls = fileformat.parse_tables(data, path)
        return cls(programs, limits, tls, path=path, resolver=resolver)

    # ------------------------------------------------------------ decisions

    def _who(self, entry: ProgramEntry, uid: int, gids: frozenset[int]) -> str | None:
        """The entry's field that admits the caller, as written; None if none does."""
        for u in entry.users:
            if u == WILDCARD or u == uid or (isinstance(u, str) and self.resolver.uid_of(u) == uid):
                return f"users = {show(entry.users)}"
        for g in entry.groups:
            if (
                g == WILDCARD
                or g in gids
                or (isinstance(g, str) and self.resolver.gid_of(g) in gids)
            ):
                return f"groups = {show(entry.groups)}"
        return None

    def _caller(self, uid: int) -> str:
        name = self.resolver.user_name(uid)
        return f"uid {uid} ({name})" if name else f"uid {uid}"

    def decide(
        self,
        uid: int,
        gids: Iterable[int],
        program_name: str | None,
        sha256: str,
        scope: str | None,
    ) -> Decision:
        """May uid (with groups gids) run this object in this scope?

        program_name None (uploaded bytes without a name) looks the object up
        by its hash alone. scope None picks the narrowest scope an allowing
        entry grants ("self" before "system"). gids should hold the caller's
        primary and supplementary groups (e.g. framing.peer_groups).
        """
        sha = sha256.lower()
        if scope is not None and scope not in SCOPES:
            why = f'invalid scope {show(scope)} (expected "self", "system" or "job")'
            return _upload(
                program_name, Decision(False, why, reason=why, refusal=Refusal.BAD_SCOPE)
            )
        candidates = self._candidates(program_name, sha, uid)
        if isinstance(candidates, Decision):
            return candidates
        gid_set = frozenset(gids)
        if not any(self._who(e, uid, gid_set) for e in candidates):
            # Entries exist but none names the caller: refused exactly as if there
            # were none (no oracle of the policy's contents); the rule says which.
            return _upload(program_name, self._not_listed(candidates, program_name, sha, uid))
        hashed = [e for e in candidates if e.sha256 == sha]
        if not hashed:
            return self._wrong_hash(candidates, program_name, sha)
        admitted = [(e, field) for e in hashed if (field := self._who(e, uid, gid_set))]
        if not admitted:
            return _upload(program_name, self._not_listed(hashed, program_name, sha, uid))
        return _upload(program_name, self._grant_scope(admitted, scope, uid))

    def _not_for_you(self, program_name: str | None, uid: int) -> str:
        """What a caller no entry admits is told: the same whether entries for the
        program exist or not (issue #26 item 12); the audit rule tells them apart."""
        if program_name is None:
            return "no [[program]] entry approves that sha256 for you"
        return (
            f"no [[program]] entry lets you run {show(program_name)} (you are {self._caller(uid)})"
        )

    def _candidates(
        self, program_name: str | None, sha: str, uid: int
    ) -> list[ProgramEntry] | Decision:
        """The entries for the program (by name, else by hash), or default deny."""
        if program_name is not None:
            candidates = [e for e in self.programs if e.name == program_name]
            if not candidates:
                return Decision(
                    False,
                    f"default deny: no [[program]] entry names {show(program_name)}",
                    reason=self._not_for_you(program_name, uid),
                    ref="default deny",
                    refusal=Refusal.UNKNOWN_PROGRAM,
                )
            return candidates
        candidates = [e for e in self.programs if e.sha256 == sha]
        if not candidates:
            rule = f"default deny: no [[program]] entry approves sha256 {sha}"
            why = self._not_for_you(None, uid)
            return Decision(
                False, rule, reason=why, ref="default deny", refusal=Refusal.UNAPPROVED_HASH
            )
        return candidates

    def _wrong_hash(
        self, candidates: list[ProgramEntry], program_name: str | None, sha: str
    ) -> Decision:
        e = candidates[0]
        if len(candidates) == 1:
            rule = f"{e.where}: sha256 = {show(e.sha256)} does not match the object's {sha}"
        else:
            which = ", ".join(f"#{x.index}" for x in candidates)
            rule = (
                f"{self.path} [[program]] {which} {show(program_name)}: no entry's sha256 "
                f"matches the object's {sha}"
            )
        return Decision(
            False,
            rule,
            e,
            reason="no entry for it approves that sha256",
            ref=f"{labels(candidates)}: sha256",
            refusal=Refusal.UNAPPROVED_HASH,
        )

    def _not_listed(
        self, entries: list[ProgramEntry], program_name: str | None, sha: str, uid: int
    ) -> Decision:
        e = entries[0]
        fields = f"users = {show(e.users)}, groups = {show(e.groups)}"
        others = "".join(f", #{x.index}" for x in entries[1:])
        hashes = (
            ""
            if all(x.sha256 == sha for x in entries)
            else f"; sha256 = {show(e.sha256)}, the object's is {sha}"
        )
        return Decision(
            False,
            f"{e.where}{others}: {fields} do not include {self._caller(uid)} or any of its "
            f"groups{hashes}",
            e,
            reason=self._not_for_you(program_name, uid),
            ref="default deny",
            refusal=Refusal.NOT_LISTED,
        )

    def _grant_scope(
        self, admitted: list[tuple[ProgramEntry, str]], scope: str | None, uid: int
    ) -> Decision:
        """The narrowest scope asked for that an admitting entry grants."""
        wanted = (scope,) if scope is not None else SCOPES
        for want in wanted:
            for e, why in admitted:
                if want in e.scopes:
                    return Decision(True, f"{e.where}: {why}", e, want, ref=e.label)
        e = admitted[0][0]
        # Only the scopes of entries that admit this caller: theirs to know.
        granted = sorted({s for x, _ in admitted for s in x.scopes})
        return Decision(
            False,
            f"{e.where}: scope = {show(list(e.scopes))} does not allow scope {show(scope)} "
            f"for {self._caller(uid)} (allowed: {', '.join(granted)})",
            e,
            reason=f"scope {scope} is not granted to you (yours: {', '.join(granted)})",
            ref=f"{labels([x for x, _ in admitted])}: scope",
            refusal=Refusal.SCOPE,
        )

    def programs_for(self, uid: int, gids: Iterable[int]) -> list[ProgramEntry]:
        """The entries that admit this caller (for ListPrograms), in file order."""
        gid_set = frozenset(gids)
        return [e for e in self.programs if self._who(e, uid, gid_set)]

    def library_allowed(self, entry: ProgramEntry, path: str) -> bool:
        """May entry's uprobes go into the library at path?

        The path is resolved (symlinks, ..) and matched component by
        component against the entry's `libraries` globs, whose glob-free
        leading directories are resolved too. Pass the path of the file the
        broker actually opens (e.g. readlink of /proc/self/fd/N) so the check
        and the use name the same file.
        """
        if not entry.libraries or not isinstance(path, str) or not path.startswith("/"):
            return False
        if "\x00" in path:
            return False
        real = os.path.realpath(path)
        return any(path_matches(resolve_pattern(p), real) for p in entry.libraries)

    def library_named(self, entry: ProgramEntry, path: str) -> bool:
        """May path, as written, name one of entry's libraries?

        A lexical check, made before the broker touches the file system, so
        a path no glob can match is refused alike whether or not it exists.
        path must be absolute and plain (no "." or ".." component); it may
        match a glob as written or with the glob's leading directories
        resolved. library_allowed() then checks the file actually opened.
        """
        if not entry.libraries or not is_plain_path(path):
            return False
        return any(
            path_matches(p, path) or path_matches(resolve_pattern(p), path) for p in entry.libraries
        )

    def function_allowed(self, entry: ProgramEntry, function: str) -> bool:
        """May entry's uprobes attach to this symbol (the `functions` globs)?"""
        return any(fnmatch.fnmatchcase(function, g) for g in entry.functions)

    def tls_user(self, subject_cn: str | None = None, cert_sha256: str | None = None) -> int | None:
        """The uid a client certificate acts as, or None if no [[tls_client]] maps it.

        When an entry lists both subject_cn and cert_sha256, both must match.
        """
        fp = cert_sha256.replace(":", "").lower() if cert_sha256 else None
        for c in self.tls_clients:
            if c.subject_cn is not None and c.subject_cn != subject_cn:
                continue
            if c.cert_sha256 is not None and c.cert_sha256 != fp:
                continue
            if isinstance(c.user, int):
                return c.user
            return self.resolver.uid_of(c.user)
        return None


__all__ = [
    "LIMIT_KEYS",
    "Decision",
    "Limits",
    "NameResolver",
    "Policy",
    "PolicyError",
    "ProgramEntry",
    "TlsClient",
]
