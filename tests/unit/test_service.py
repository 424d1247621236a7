"""broker.service.Service offline: policy, hashes, audit, parameters, limits and
sharing, with the kernel replaced by fakes (no bpf(2), no tracefs)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.bpf.kernel import vmlinux as kernel_btf
from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.broker import features, replies
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.policy.rules import NameResolver, Policy
from gfxbpf.broker.service import Service
from gfxbpf.catalog import instance as bpfinstance
from gfxbpf.catalog.entries import Catalog, load_catalog
from gfxbpf.catalog.instance import Params
from gfxbpf.proto import gfxbpf_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = ROOT / "tests" / "data" / "objects"
ALICE, BOB, MALLORY = 1001, 1002, 1003
CATALOG = load_catalog()


class Resolver(NameResolver):
    names = {"alice": ALICE, "bob": BOB, "mallory": MALLORY}

    def uid_of(self, name: str) -> int | None:
        return self.names.get(name)

    def gid_of(self, name: str) -> int | None:
        return {"video": 44}.get(name)

    def user_name(self, uid: int) -> str | None:
        return {v: k for k, v in self.names.items()}.get(uid)


def sha(name: str) -> str:
    return CATALOG.get(name).sha256


def catalog_bytes(name: str) -> bytes:
    e = CATALOG.get(name)
    return (e.directory / e.object).read_bytes()


def make_policy(extra: str = "", limits: str = "", users: str = '["alice", "bob"]') -> Policy:
    root = os.getuid()
    text = f"""
[[program]]
name = "syscount"
sha256 = "{sha("syscount")}"
users = {users}
scope = ["self", "system"]

[[program]]
name = "execsnoop"
sha256 = "{sha("execsnoop")}"
users = ["alice", "bob"]
scope = "self"

[[program]]
name = "vmabind"
sha256 = "{sha("vmabind")}"
users = ["alice"]
scope = "system"

[[program]]
name = "ucalls"
sha256 = "{sha("ucalls")}"
users = ["alice", {root}]
libraries = ["/usr/lib/x86_64-linux-gnu/libc.so.6"]
functions = ["getpid"]

[[program]]
name = "badwrite"
sha256 = "{hashlib.sha256((OBJECTS / "probe_write_user.bpf.o").read_bytes()).hexdigest()}"
users = ["alice"]
scope = "system"

[[program]]
name = "elsewhere"
sha256 = "{"ab" * 32}"
groups = ["video"]
{extra}
{limits}
"""
    return Policy.parse(text, path="/etc/gfxbpf/policy.toml", resolver=Resolver())


def caller(uid: int, transport: str = "unix", gids: tuple[int, ...] = ()) -> Caller:
    return Caller(uid=uid, gid=uid, gids=(uid, *gids), pid=4242, transport=transport)


def no_i915(system: str, event: str) -> bool:
    return system not in ("i915", "gpu_scheduler")


class FakeMap:
    """A map on a real fd (of /dev/null): the broker duplicates the fds it passes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.map_type = 1
        self.key_size = 4
        self.value_size = 8
        self.max_entries = 16
        self.percpu = False
        self.ncpus = 1
        self.key_type_id = 0
        self.value_type_id = 0
        self._fd = os.open(os.devnull, os.O_RDONLY)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


@dataclass
class FakeProgSpec:
    section: str
    prog_type: int


@dataclass
class FakeProg:
    spec: FakeProgSpec
    id: int
    fd: int = -1


@dataclass
class FakeObj:
    programs: dict[str, FakeProg] = field(default_factory=dict)


class FakeShared:
    """Stands in for SharedInstance: what _describe and release look at."""

    next_id = 100

    def __init__(self, key: Any, entry: Any, spec: ObjectSpec) -> None:
        FakeShared.next_id += 1
        self.key = key
        self.entry = entry
        self.spec = spec
        self.warm = False
        self.visible = {m.name: FakeMap(m.name) for m in entry.visible_maps}
        self.obj = FakeObj(
            {
                a.program: FakeProg(FakeProgSpec(f"{a.kind}/{a.target}", 5), FakeShared.next_id)
                for a in entry.attach
            }
        )
        self.closed = False
        self.map_bytes = 0
        # What a reload's revoke compares with the policy (broker/revoke.py).
        self.inst = SimpleNamespace(
            entry=entry, params=Params(), obj=SimpleNamespace(btf_error=None)
        )

    def close(self) -> None:
        self.closed = True
        for m in self.visible.values():
            m.close()


@pytest.fixture
def log() -> io.StringIO:
    return io.StringIO()


@pytest.fixture
def service(log: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> Service:
    s = Service(make_policy(), CATALOG, AuditLog(stream=log), event_exists=no_i915)
    created: list[FakeShared] = []

    def fake_create(self: Service, c: Caller, res: Any, target: Any, key: Any) -> FakeShared:
        shared = FakeShared(key, res.entry, ObjectSpec.parse(res.data, res.entry.name))
        created.append(shared)
        return shared

    def no_load(*a: Any, **k: Any) -> None:
        raise AssertionError("nothing may reach the kernel in this test")

    monkeypatch.setattr(Service, "_create", fake_create)
    monkeypatch.setattr(bpfinstance, "load", no_load)
    s.created = created  # type: ignore[attr-defined]
    return s


def records(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


def attach(s: Service, c: Caller, owner: Any = None, **kw: Any) -> tuple[pb.AttachReply, list[int]]:
    owner = owner or s.open_owner(c)
    return s.attach(c, owner, pb.AttachRequest(**kw))


# ---------------------------------------------------------------- ListPrograms


def test_list_programs_names_a_field_this_kernel_lacks(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel without BTF (so execsnoop's tracefs build) whose
    # sched_process_exec has no `filename`: execsnoop cannot run,
    # and the listing says so before anyone attaches.
    text = (
        "name: sched_process_exec\nID: 1\nformat:\n"
        "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n"
        "\tfield:int old_pid;\toffset:12;\tsize:4;\tsigned:1;\n"
    )

    fork = (  # the process-tree programs' fork hook (tracefs build)
        "name: sched_process_fork\nID: 2\nformat:\n"
        "\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n"
    )

    def read_format(system: str, event: str) -> tracefs.EventFormat:
        assert system == "sched" and event in ("sched_process_exec", "sched_process_fork")
        return tracefs.parse_format(text if event == "sched_process_exec" else fork)

    monkeypatch.setattr(kernel_btf, "tp_btf_target_exists", lambda _name: False)

    s = Service(
        make_policy(), CATALOG, AuditLog(stream=log), event_exists=no_i915, read_format=read_format
    )
    by = {p.name: p for p in s.list_programs(caller(ALICE), pb.ListProgramsRequest()).programs}
    e = by["execsnoop"]
    assert not e.available
    assert "sched:sched_process_exec has no field 'filename'" in e.unavailable_reason
    assert by["syscount"].available  # reads no tracepoint fields


def test_list_programs_marks_vmabind_unavailable(service: Service) -> None:
    reply = service.list_programs(caller(ALICE), pb.ListProgramsRequest())
    by = {p.name: p for p in reply.programs}
    assert list(by) == ["syscount", "execsnoop", "vmabind", "ucalls", "badwrite"]
    v = by["vmabind"]
    assert not v.available
    # What the program needs, then why it is missing here.
    assert v.requires == "an Intel GPU on the i915 driver (the i915:i915_vma_bind tracepoint)"
    assert v.unavailable_reason.startswith(
        f"needs {v.requires}: tracepoint i915:i915_vma_bind does not exist"
    )
    assert "i915 driver must be loaded" in v.unavailable_reason
    assert list(v.scopes) == [pb.SCOPE_SYSTEM]
    assert "tracepoint/i915/i915_vma_bind" in v.attach_points
    s = by["syscount"]
    assert s.available and s.unavailable_reason == ""
    assert s.sha256 == sha("syscount")
    assert list(s.scopes) == [pb.SCOPE_SELF, pb.SCOPE_SYSTEM]
    u = by["ucalls"]
    assert list(u.libraries) == ["/usr/lib/x86_64-linux-gnu/libc.so.6"]
    assert {p.name for p in u.parameters} == {"pid", "library", "functions"}
    assert not by["badwrite"].available
    assert "not in the broker's catalog" in by["badwrite"].unavailable_reason


def test_list_programs_follows_the_policy(service: Service) -> None:
    assert service.list_programs(caller(MALLORY), pb.ListProgramsRequest()).programs == []
    names = [
        p.name
        for p in service.list_programs(
            caller(MALLORY, gids=(44,)), pb.ListProgramsRequest()
        ).programs
    ]
    assert names == ["elsewhere"]


# ---------------------------------------------------------------- refusals


def test_denied_attach_carries_the_rule(service: Service, log: io.StringIO) -> None:
    c = caller(MALLORY)
    with pytest.raises(BrokerError) as ei:
        attach(service, c, name="syscount", scope=pb.SCOPE_SELF)
    e = ei.value
    assert e.code == pb.ERROR_PERMISSION_DENIED
    # The caller gets a reference to quote and what they lack: not the
    # policy's path, not the principals the entry names.
    # Told as if no entry named the program (no oracle of the policy).
    assert e.rule == "default deny"
    assert 'no [[program]] entry lets you run "syscount" (you are uid 1003 (mallory))' in (
        e.message
    )
    for hidden in ("/etc/gfxbpf", "alice", "bob", "users ="):
        assert hidden not in e.message + e.rule
    assert e.to_pb().rule == e.rule
    last = records(log)[-1]
    assert (last["op"], last["result"], last["uid"], last["pid"]) == (
        "attach",
        "denied",
        MALLORY,
        4242,
    )
    assert (last["program"], last["sha256"], last["scope"]) == ("syscount", sha("syscount"), "self")
    # The audit line keeps the whole rule.
    assert last["rule"].startswith('/etc/gfxbpf/policy.toml [[program]] #1 "syscount": users = ')
    assert '["alice", "bob"]' in last["rule"] and "uid 1003 (mallory)" in last["rule"]
    assert last["code"] == "ERROR_PERMISSION_DENIED"


def test_scope_not_granted(service: Service) -> None:
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE), name="execsnoop", scope=pb.SCOPE_SYSTEM)
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED
    assert "scope" in ei.value.rule


def test_unknown_names(service: Service) -> None:
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE), name="nosuch")
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED
    assert "default deny" in ei.value.rule
    # Named by the policy, but no such catalog program: say so.
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(MALLORY, gids=(44,)), name="elsewhere")
    assert ei.value.code == pb.ERROR_NOT_FOUND
    assert "send the approved object's bytes" in ei.value.message


def test_changed_upload_is_a_hash_mismatch(service: Service) -> None:
    data = bytearray(catalog_bytes("syscount"))
    data[100] ^= 1
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE), object=bytes(data))
    assert ei.value.code == pb.ERROR_HASH_MISMATCH
    assert hashlib.sha256(bytes(data)).hexdigest() in ei.value.message
    assert "default deny" in ei.value.rule


def test_upload_of_approved_bytes_uses_the_catalog_entry(service: Service) -> None:
    reply, fds = attach(
        service, caller(ALICE), object=catalog_bytes("syscount"), scope=pb.SCOPE_SELF
    )
    assert reply.program == "syscount" and reply.sha256 == sha("syscount")
    assert [m.name for m in reply.maps] == ["counts"] and len(fds) == 1
    # The fd sent is a duplicate of the instance's map fd (the session closes it).
    kept = service.created[-1].visible["counts"].fileno()  # type: ignore[attr-defined]
    assert fds[0] != kept and os.path.samestat(os.fstat(fds[0]), os.fstat(kept))
    os.close(fds[0])


def test_upload_without_catalog_metadata_is_refused(log: io.StringIO) -> None:
    # The syscount object approved under another name, on a broker whose
    # catalog lacks it: nothing says how to attach it.
    cat = Catalog(CATALOG.path, tuple(p for p in CATALOG if p.name != "syscount"))
    policy = make_policy(
        extra=f'[[program]]\nname = "mine"\nsha256 = "{sha("syscount")}"\nusers = ["alice"]\n'
    )
    s = Service(policy, cat, AuditLog(stream=log), event_exists=no_i915)
    with pytest.raises(BrokerError) as ei:
        attach(s, caller(ALICE), object=catalog_bytes("syscount"))
    assert ei.value.code == pb.ERROR_NOT_FOUND
    assert "needs a catalog entry" in ei.value.message


def test_approved_probe_write_user_fails_the_audit(service: Service, log: io.StringIO) -> None:
    data = (OBJECTS / "probe_write_user.bpf.o").read_bytes()
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE), object=data)
    assert ei.value.code == pb.ERROR_AUDIT_FAILED
    assert "bpf_probe_write_user" in ei.value.message
    last = records(log)[-1]
    assert (last["program"], last["result"]) == ("badwrite", "denied")
    assert service.created == []  # type: ignore[attr-defined]


def test_oversized_upload(service: Service) -> None:
    big = b"\0" * (service.policy.limits.max_object_bytes + 1)
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE), object=big)
    assert ei.value.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert "max_object_bytes" in ei.value.rule


def test_no_program_named(service: Service) -> None:
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(ALICE))
    assert ei.value.code == pb.ERROR_INVALID_ARGUMENT


# ---------------------------------------------------------------- parameters


def test_parameters_are_checked(service: Service) -> None:
    with pytest.raises(BrokerError, match="takes no pid") as ei:
        attach(service, caller(ALICE), name="syscount", params=pb.AttachParams(pid=os.getpid()))
    assert ei.value.code == pb.ERROR_INVALID_ARGUMENT
    with pytest.raises(BrokerError, match="takes no library"):
        attach(service, caller(ALICE), name="syscount", params=pb.AttachParams(library="/x"))
    with pytest.raises(BrokerError, match="needs a pid"):
        attach(service, caller(ALICE), name="ucalls")


def test_ucalls_pid_must_be_the_callers(service: Service) -> None:
    with pytest.raises(BrokerError) as ei:
        attach(
            service,
            caller(ALICE),
            name="ucalls",
            params=pb.AttachParams(pid=os.getpid(), library="/bin/true", functions=["main"]),
        )
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED
    assert f"belongs to uid {os.getuid()}" in ei.value.message


def test_ucalls_pid_that_does_not_exist_is_not_found(service: Service) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process now
    with pytest.raises(BrokerError) as ei:
        attach(
            service,
            caller(ALICE),
            name="ucalls",
            params=pb.AttachParams(pid=dead.pid, library="/bin/true", functions=["main"]),
        )
    assert ei.value.code == pb.ERROR_NOT_FOUND  # a wrong pid, not a refusal
    assert ei.value.message == f"no process {dead.pid}"


def attach_ucalls(
    s: Service, c: Caller, library: str, functions: tuple[str, ...] = ("getpid",)
) -> tuple[pb.AttachReply, list[int]]:
    """ucalls as a client asks for it: over Unix the library's fd rides along, over gRPC
    its path."""
    params = pb.AttachParams(pid=os.getpid(), library=library, functions=list(functions))
    req = pb.AttachRequest(name="ucalls", params=params)
    if c.transport != "unix":
        return s.attach(c, s.open_owner(c), req)
    fd = os.open(library, os.O_RDONLY | os.O_CLOEXEC)
    try:
        req.params.library_fd_index = 0
        return s.attach(c, s.open_owner(c), req, [fd])
    finally:
        os.close(fd)


@pytest.mark.parametrize("transport", ["unix", "grpc"])
def test_ucalls_library_and_functions_follow_the_policy(
    service: Service, log: io.StringIO, transport: str
) -> None:
    me = caller(os.getuid(), transport)
    with pytest.raises(BrokerError) as ei:
        attach_ucalls(service, me, "/bin/true")
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED
    assert "library /bin/true" in ei.value.message and "is not allowed" in ei.value.message
    assert ei.value.rule == '[[program]] #4 "ucalls": libraries'
    # The allowed globs stay in the audit line.
    assert records(log)[-1]["rule"].endswith("libraries = ['/usr/lib/x86_64-linux-gnu/libc.so.6']")
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip(f"{libc} is not here")
    with pytest.raises(BrokerError) as ei:
        attach_ucalls(service, me, libc, ("system",))
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED
    assert "function 'system' is not allowed" in ei.value.message
    assert "getpid" not in ei.value.message + ei.value.rule  # the allowed list stays unsaid
    attach_ucalls(service, me, libc)
    key = service.created[-1].key  # type: ignore[attr-defined]
    assert (key.pid, key.library, key.functions, key.uid) == (
        os.getpid(),
        os.path.realpath(libc),
        ("getpid",),
        os.getuid(),
    )


def test_ucalls_over_unix_needs_the_library_fd(service: Service) -> None:
    # The broker never opens a path a Unix client names: the client passes the file.
    params = pb.AttachParams(pid=os.getpid(), library="/bin/true", functions=["getpid"])
    with pytest.raises(BrokerError) as ei:
        attach(service, caller(os.getuid()), name="ucalls", params=params)
    assert ei.value.code == pb.ERROR_INVALID_ARGUMENT
    assert "send its fd" in ei.value.message
    params.library_fd_index = 1
    with pytest.raises(BrokerError, match="library_fd_index 1, but the request carried 0 fds"):
        attach(service, caller(os.getuid()), name="ucalls", params=params)


# ---------------------------------------------------------------- sharing, limits, lifetime


def test_system_scope_is_shared_and_refcounted(service: Service) -> None:
    # Over gRPC (no fds) users share a system-scope instance.
    a, b = caller(ALICE, "grpc"), caller(BOB, "grpc")
    oa, ob = service.open_owner(a), service.open_owner(b)
    ra, fa = service.attach(a, oa, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    rb, fb = service.attach(b, ob, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    assert not ra.shared and rb.shared
    assert [p.prog_id for p in ra.programs] == [p.prog_id for p in rb.programs]
    assert fa == fb == []  # the broker reads for them
    assert all(p.fd_index == -1 for p in ra.programs)
    assert service.live_instances == 1
    assert service.detach(a, oa, pb.DetachRequest(attachment_id=ra.attachment_id)).unloaded is False
    shared = service.created[0]  # type: ignore[attr-defined]
    assert not shared.closed
    assert service.detach(b, ob, pb.DetachRequest(attachment_id=rb.attachment_id)).unloaded is True
    assert shared.closed and service.live_instances == 0


def test_fd_clients_share_system_instances_with_their_own_uid_only(service: Service) -> None:
    a, b = caller(ALICE), caller(BOB)
    oa, oa2, ob = service.open_owner(a), service.open_owner(a), service.open_owner(b)
    req = pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM)
    ra, fa = service.attach(a, oa, req)
    ra2, fa2 = service.attach(a, oa2, req)
    rb, fb = service.attach(b, ob, req)
    assert ra2.shared and len(fa2) == len(fa) == 1  # alice's two sessions: one instance
    assert not rb.shared and len(fb) == 1  # bob's fds reach his own instance only
    assert service.live_instances == 2
    assert {s.key.uid for s in service.created} == {ALICE, BOB}  # type: ignore[attr-defined]


def test_reload_detaches_what_the_new_policy_refuses(service: Service, log: io.StringIO) -> None:
    a, b = caller(ALICE), caller(BOB, "grpc")
    oa, ob = service.open_owner(a), service.open_owner(b)
    ra, _ = service.attach(a, oa, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    rb, _ = service.attach(b, ob, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    bob_instance = service.created[1]  # type: ignore[attr-defined]
    service.policy = make_policy(users='["alice"]')
    assert service.revoke_disallowed() == [rb.attachment_id]
    assert bob_instance.closed and service.live_instances == 1
    with pytest.raises(BrokerError) as e:
        service.read_map(b, ob, pb.ReadMapRequest(attachment_id=rb.attachment_id))
    assert e.value.code == pb.ERROR_PERMISSION_DENIED and "no longer allows" in e.value.message
    service.stats(a, oa, pb.StatsRequest(attachment_id=ra.attachment_id))  # alice keeps hers
    revoked = [r for r in records(log) if r["op"] == "revoke"]
    assert [(r["uid"], r["attachment_id"]) for r in revoked] == [(BOB, rb.attachment_id)]


def test_a_call_after_a_reload_decides_again_before_reading(service: Service) -> None:
    b = caller(BOB, "grpc")
    ob = service.open_owner(b)
    rb, _ = service.attach(b, ob, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    service.policy = make_policy(users='["alice"]')  # swapped, not yet revoked
    with pytest.raises(BrokerError) as e:
        service.read_map(b, ob, pb.ReadMapRequest(attachment_id=rb.attachment_id))
    assert e.value.code == pb.ERROR_PERMISSION_DENIED and "no longer allows" in e.value.message
    assert service.live_instances == 0 and service.revoke_disallowed() == []


def test_a_revoke_during_a_read_closes_the_instance_after_the_read(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reload that revokes while ReadMap reads must not close the map fd under
    # it: its number could name another user's map by the time it is read.
    b = caller(BOB, "grpc")
    ob = service.open_owner(b)
    rb, _ = service.attach(b, ob, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    shared = service.created[0]  # type: ignore[attr-defined]
    seen: list[bool] = []

    def read_page(kmap: Any, *a: Any, **k: Any) -> pb.ReadMapReply:
        service.policy = make_policy(users='["alice"]')
        assert service.revoke_disallowed() == [rb.attachment_id]
        seen.append(shared.closed)
        os.fstat(kmap.fileno())  # still the map's fd
        return pb.ReadMapReply()

    monkeypatch.setattr(replies, "read_page", read_page)
    service.read_map(b, ob, pb.ReadMapRequest(attachment_id=rb.attachment_id, map="counts"))
    assert seen == [False] and shared.closed  # closed once the read was done
    with pytest.raises(BrokerError) as e:
        service.read_map(b, ob, pb.ReadMapRequest(attachment_id=rb.attachment_id))
    assert e.value.code == pb.ERROR_PERMISSION_DENIED


def test_a_revoke_during_attach_leaves_the_fds_sent_valid(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reload lands between the attach's decision and its reply: the fds in
    # the reply are duplicates made while the instance was held open.
    a = caller(ALICE)
    oa = service.open_owner(a)
    describe = replies.describe

    def revoke_then_describe(att: Any, joined: bool, pass_fds: bool) -> Any:
        service.policy = make_policy(users='["bob"]')
        assert service.revoke_disallowed() == [att.id]
        return describe(att, joined, pass_fds)

    monkeypatch.setattr(replies, "describe", revoke_then_describe)
    reply, fds = service.attach(a, oa, pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM))
    shared = service.created[0]  # type: ignore[attr-defined]
    assert shared.closed and len(fds) == 1
    assert os.path.samestat(os.fstat(fds[0]), os.stat(os.devnull))  # the map's, not closed
    os.close(fds[0])
    with pytest.raises(BrokerError) as e:
        service.stats(a, oa, pb.StatsRequest(attachment_id=reply.attachment_id))
    assert e.value.code == pb.ERROR_PERMISSION_DENIED


def test_self_scope_shares_per_user_and_rings_never(service: Service) -> None:
    a, b = caller(ALICE), caller(BOB)
    r1, _ = attach(service, a, name="syscount", scope=pb.SCOPE_SELF)
    r2, _ = attach(service, a, name="syscount", scope=pb.SCOPE_SELF)
    r3, _ = attach(service, b, name="syscount", scope=pb.SCOPE_SELF)
    assert r2.shared and not r3.shared
    e1, f1 = attach(service, a, name="execsnoop", scope=pb.SCOPE_SELF)
    e2, _ = attach(service, a, name="execsnoop", scope=pb.SCOPE_SELF)
    assert not e1.shared and not e2.shared
    assert e1.maps[0].show == "events" and e1.maps[0].fd_index == 0 and len(f1) == 1
    assert e1.maps[0].event_type == "exec_event" and e1.maps[0].btf_event_type_id > 0
    assert e1.btf  # raw .BTF for the client's decoder


def test_grpc_callers_get_no_fds(service: Service) -> None:
    reply, fds = attach(service, caller(ALICE, "grpc"), name="syscount", scope=pb.SCOPE_SELF)
    assert fds == [] and all(m.fd_index == -1 for m in reply.maps)


def test_attachments_per_user(log: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = make_policy(limits="[limits]\nattachments_per_user = 2\nsessions_per_user = 2\n")
    s = Service(policy, CATALOG, AuditLog(stream=log), event_exists=no_i915)
    monkeypatch.setattr(
        Service,
        "_create",
        lambda self, c, res, t, key: FakeShared(key, res.entry, ObjectSpec.parse(res.data, "x")),
    )
    a = caller(ALICE)
    o1 = s.open_owner(a)
    attach(s, a, o1, name="syscount", scope=pb.SCOPE_SELF)
    o2 = s.open_owner(a)
    attach(s, a, o2, name="syscount", scope=pb.SCOPE_SYSTEM)
    with pytest.raises(BrokerError) as ei:
        attach(s, a, o2, name="execsnoop", scope=pb.SCOPE_SELF)
    assert ei.value.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert ei.value.rule == "[limits] attachments_per_user = 2"  # no policy path
    attach(s, caller(BOB), name="syscount", scope=pb.SCOPE_SELF)  # per user
    # sessions_per_user
    with pytest.raises(BrokerError) as ei:
        s.open_owner(a)
    assert ei.value.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert "sessions_per_user = 2" in ei.value.rule
    s.open_owner(caller(ALICE, "grpc"))  # gRPC holders are not sessions
    # Closing a session returns both its session and its attachments.
    s.close_owner(o1)
    s.close_owner(o1)  # idempotent
    o3 = s.open_owner(a)
    attach(s, a, o3, name="execsnoop", scope=pb.SCOPE_SELF)
    closes = [r for r in records(log) if r["op"] == "close_session"]
    assert len(closes) == 1 and "detached 1 attachments" in closes[0]["detail"]


def test_close_owner_releases_everything(service: Service) -> None:
    a = caller(ALICE)
    o = service.open_owner(a)
    for name in ("syscount", "execsnoop"):
        attach(service, a, o, name=name, scope=pb.SCOPE_SELF)
    assert service.live_instances == 2
    service.close_owner(o)
    assert service.live_instances == 0
    assert all(x.closed for x in service.created)  # type: ignore[attr-defined]
    with pytest.raises(BrokerError) as ei:
        attach(service, a, o, name="syscount", scope=pb.SCOPE_SELF)
    assert ei.value.code == pb.ERROR_NOT_FOUND


def test_owner_belongs_to_its_user(service: Service) -> None:
    o = service.open_owner(caller(ALICE))
    with pytest.raises(BrokerError) as ei:
        service.stats(caller(BOB), o, pb.StatsRequest())
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED


def test_detach_and_read_unknown_attachment(service: Service) -> None:
    a = caller(ALICE)
    o = service.open_owner(a)
    with pytest.raises(BrokerError) as ei:
        service.detach(a, o, pb.DetachRequest(attachment_id=77))
    assert ei.value.code == pb.ERROR_NOT_FOUND
    with pytest.raises(BrokerError) as ei:
        service.read_map(a, o, pb.ReadMapRequest(attachment_id=77, map="counts"))
    assert ei.value.code == pb.ERROR_NOT_FOUND
    reply, _ = attach(service, a, o, name="syscount", scope=pb.SCOPE_SELF)
    with pytest.raises(BrokerError) as ei:
        service.read_map(a, o, pb.ReadMapRequest(attachment_id=reply.attachment_id, map="nope"))
    assert ei.value.code == pb.ERROR_NOT_FOUND and "counts" in ei.value.message


def test_stream_events_over_unix_is_refused(service: Service) -> None:
    a = caller(ALICE)
    o = service.open_owner(a)
    reply, _ = attach(service, a, o, name="execsnoop", scope=pb.SCOPE_SELF)
    with pytest.raises(BrokerError) as ei:
        service.stream_events(
            a, o, pb.StreamEventsRequest(attachment_id=reply.attachment_id), lambda: False
        )
    assert ei.value.code == pb.ERROR_INVALID_ARGUMENT
    assert "fd_index" in ei.value.message


def test_a_stream_that_could_not_start_can_be_asked_again(service: Service) -> None:
    # The fake ring buffer is /dev/null, which cannot be mapped: each ask is
    # that kernel error, never "already streaming" left over from the last.
    g = caller(ALICE, "grpc")
    o = service.open_owner(g)
    reply, _ = attach(service, g, o, name="execsnoop", scope=pb.SCOPE_SELF)
    req = pb.StreamEventsRequest(attachment_id=reply.attachment_id)
    for _ in range(2):
        with pytest.raises(BrokerError) as ei:
            service.stream_events(g, o, req, lambda: False)
        assert ei.value.code == pb.ERROR_KERNEL, ei.value.message


def test_issue_token(service: Service) -> None:
    a = caller(ALICE)
    o = service.open_owner(a)
    with pytest.raises(BrokerError) as ei:
        service.issue_token(a, o, pb.IssueTokenRequest())
    assert ei.value.code == pb.ERROR_UNAVAILABLE

    class Tokens:
        def issue(self, c: Caller, ttl: int) -> tuple[str, int]:
            return f"t-{c.uid}-{ttl}", 123

    service.tokens = Tokens()
    reply = service.issue_token(a, o, pb.IssueTokenRequest(ttl_seconds=10**9))
    assert reply.token == f"t-{ALICE}-{service.policy.limits.token_ttl_seconds}"
    g = caller(ALICE, "grpc")
    with pytest.raises(BrokerError) as ei:
        service.issue_token(g, service.open_owner(g), pb.IssueTokenRequest())
    assert ei.value.code == pb.ERROR_PERMISSION_DENIED


def test_hello(service: Service, log: io.StringIO) -> None:
    r = service.hello(caller(ALICE), pb.HelloRequest(protocol=1, client_version="t"))
    assert r.protocol == 1 and r.uid == ALICE and r.pid == 4242
    assert r.kernel_release == os.uname().release
    assert r.possible_cpus >= 1
    assert records(log)[-1]["op"] == "hello"


def test_kernel_version_parse() -> None:
    assert features.direct_map_reads("6.18.44-fc")
    assert features.direct_map_reads("5.19.0")
    assert not features.direct_map_reads("5.15.0-91-generic")
    assert not features.direct_map_reads("garbage")
