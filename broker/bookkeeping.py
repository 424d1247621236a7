"""What every operation of the Service goes through: its audit lines, the
owners it opens and closes, an owner's attachment looked up, decided again
after a policy reload and pinned for one request, and revocation. Service
(service.py) adds the operations themselves."""

from __future__ import annotations

from gfxbpf.broker import revoke
from gfxbpf.broker.attachments import Attachments
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.instances import SharedInstance
from gfxbpf.broker.owners import Attachment, Owner, Owners
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.request.slurmjob import JobCgroup
from gfxbpf.broker.sharing.registry import Gone, Pin
from gfxbpf.proto import gfxbpf_pb2 as pb

POLICY_REVOKED = "the policy in force no longer allows it (ask the administrator)"


def revoked_error(attachment_id: int, program: str = "", why: str = POLICY_REVOKED) -> BrokerError:
    what = f"attachment {attachment_id}" + (f" ({program})" if program else "")
    return BrokerError(pb.ERROR_PERMISSION_DENIED, f"{what} was detached: {why}")


class Bookkeeping:
    """The Service's state every operation shares (set by Service.__init__)."""

    policy: Policy
    audit: AuditLog
    _owners: Owners
    _attachments: Attachments

    # ------------------------------------------------------------ helpers

    def _log(self, op: str, caller: Caller, result: str, **fields: object) -> None:
        self._record(op, caller, result, False, fields)

    def _record(
        self, op: str, caller: Caller, result: str, always: bool, fields: dict[str, object]
    ) -> None:
        """One audit line; always: never held back by the rate limit (auditlog.py)."""
        write = self.audit.record_always if always else self.audit.record
        write(
            op=op,
            result=result,
            uid=caller.uid,
            pid=caller.pid,
            transport=caller.transport,
            **fields,
        )

    def _fail(self, op: str, caller: Caller, err: BrokerError, **fields: object) -> BrokerError:
        fields.setdefault("detail", err.message)
        if err.audit_rule:
            fields.setdefault("rule", err.audit_rule)
        self._log(op, caller, err.result, code=pb.ErrorCode.Name(err.code), **fields)
        return err

    def _check_owner(self, caller: Caller, owner: Owner) -> None:
        if owner.closed:
            raise BrokerError(pb.ERROR_NOT_FOUND, "this session is closed")
        if owner.caller.uid != caller.uid:
            raise BrokerError(pb.ERROR_PERMISSION_DENIED, "the session belongs to another user")

    def _attachment(self, owner: Owner, attachment_id: int) -> Attachment:
        with owner.lock:
            att = owner.attachments.get(attachment_id)
        if attachment_id in owner.revoked:
            raise revoked_error(attachment_id, why=owner.revoked[attachment_id])
        if att is None or att.closed:
            raise BrokerError(
                pb.ERROR_NOT_FOUND,
                f"no attachment {attachment_id} in this session (attachments: "
                f"{', '.join(map(str, owner.attachment_ids())) or 'none'})",
            )
        self._recheck(owner, att)
        return att

    def _recheck(self, owner: Owner, att: Attachment) -> None:
        """Decide att again if the policy changed since it was last allowed;
        detach it and refuse when the policy in force no longer allows it."""
        policy = self.policy
        if att.policy is not policy:
            if not revoke.allows(policy, att):
                self._revoke(owner, att, "a call after a policy reload")
            else:
                att.policy = policy
        if att.closed:
            raise revoked_error(att.id, att.program, owner.revoked.get(att.id, POLICY_REVOKED))

    def _pin(self, owner: Owner, att: Attachment) -> Pin[SharedInstance]:
        """Hold att's instance open for one request: a detach or revoke meanwhile
        closes it when the request is done, never under it (a closed fd's
        number may already name another user's map)."""
        try:
            return self._attachments.registry.pin(att.key, att.shared)
        except Gone:
            if att.id in owner.revoked:
                raise revoked_error(att.id, att.program, owner.revoked[att.id]) from None
            raise BrokerError(
                pb.ERROR_NOT_FOUND, f"attachment {att.id} was detached meanwhile"
            ) from None

    def _revoke(
        self, owner: Owner, att: Attachment, why: str, because: str = POLICY_REVOKED
    ) -> bool:
        """Detach att from owner as revoked (because: what its holder is told);
        False if it was gone already."""
        with owner.lock:
            if owner.attachments.get(att.id) is not att:
                return False
            del owner.attachments[att.id]
            owner.revoked[att.id] = because
        unloaded = self._attachments.release(att)
        self._log(
            "revoke",
            owner.caller,
            "ok",
            program=att.program,
            sha256=att.sha256,
            scope=att.scope,
            attachment_id=att.id,
            unloaded=unloaded,
            detail=f"detached: {because} ({why})",
        )
        return True

    def revoke_ended_jobs(self) -> list[int]:
        """Detach every scope-job attachment whose Slurm job left this node (its
        cgroup is gone; the main loop asks every second). The ids detached."""
        revoked: list[int] = []
        for owner in self._owners.all():
            with owner.lock:
                atts = [a for a in owner.attachments.values() if a.key.job is not None]
            for att in atts:
                job = att.key.job
                assert isinstance(job, JobCgroup)
                if job.alive():
                    continue
                because = f"Slurm job {job.job} ended (its cgroup left this node)"
                if self._revoke(owner, att, "job ended", because):
                    with owner.lock:  # its holder's detach is then no refusal
                        owner.job_ended.add(att.id)
                    revoked.append(att.id)
        return revoked

    def revoke_disallowed(self) -> list[int]:
        """After a reload: detach every live attachment the policy in force no
        longer allows (an fd client's instance is its uid's own, so its kept
        fds stop receiving data). The ids of those detached."""
        policy = self.policy
        revoked: list[int] = []
        for owner in self._owners.all():
            with owner.lock:
                atts = list(owner.attachments.values())
            for att in atts:
                if revoke.allows(policy, att):
                    att.policy = policy
                elif self._revoke(owner, att, "policy reload"):
                    revoked.append(att.id)
        return revoked

    @property
    def open_owners(self) -> int:
        return len(self._owners)

    @property
    def live_instances(self) -> int:
        return len(self._attachments.registry)

    # ------------------------------------------------------------ owners

    def open_owner(self, caller: Caller) -> Owner:
        """A new holder of attachments. Unix sessions count against sessions_per_user."""
        try:
            return self._owners.open(self.close_owner, caller, self.policy)
        except BrokerError as e:
            raise self._fail("open_session", caller, e) from None

    def close_owner(self, owner: Owner) -> None:
        """Detach everything the owner holds; idempotent."""
        atts = owner.take_all()
        if atts is None:
            return
        unloaded = 0
        for att in atts:  # each detach is a line of its own, never rate-limited
            fields: dict[str, object] = {"program": att.program, "sha256": att.sha256}
            fields.update(scope=att.scope, attachment_id=att.id)
            try:
                freed = self._attachments.release(att)
            except Exception as e:  # keep releasing the rest
                self._record(
                    "detach",
                    owner.caller,
                    "error",
                    True,
                    fields | {"detail": f"release failed: {e}"},
                )
                continue
            unloaded += freed
            why = "implicit: its session or lease ended"
            self._record(
                "detach", owner.caller, "ok", True, fields | {"unloaded": freed, "detail": why}
            )
        self._owners.forget(owner)
        # A session that held attachments: its end is never held back either.
        detail = f"detached {len(atts)} attachments, unloaded {unloaded} instances"
        self._record("close_session", owner.caller, "ok", bool(atts), {"detail": detail})
