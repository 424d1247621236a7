"""Attaching the program a profile needs: stack copies (stackcopy,
ustackcopy, offcpu) where the policy grants them, frame-pointer stacks
(profile, ustacks) where it does not, and the CPython files the kernel
walks."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gfxbpf.client.errors import BrokerError, ClientError
from gfxbpf.client.humanize import user_name
from gfxbpf.client.profiles.engine.request import (
    GPU,
    LOCKS,
    MEMORY,
    OFF_CPU,
    WALL,
    ProfileRequest,
)
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.python.targets import Interpreters


def find_pythons(req: ProfileRequest) -> Interpreters | None:
    """The CPython executables to walk (scope self only: the walk reads process memory)."""
    if not req.own_processes:
        return None
    from gfxbpf.client.profiles.python.targets import find

    return find(req.pids, req.command)


def attach(
    broker: Broker, req: ProfileRequest, pid: int | None, pythons: Interpreters | None = None
) -> Attachment:
    """The sampling (or probing, or off-CPU) attachment; pid: the one the kernel filters on."""
    children = req.children and pid is not None  # several --pid: kept here, by /proc
    files = python_files(pythons)
    if req.mode == OFF_CPU:
        return _attach_offcpu(broker, req, pid, children, files)
    if req.mode == LOCKS:
        from gfxbpf.client.profiles.locks.attach import attach_locks

        return attach_locks(broker, req, pid, children)
    if req.mode == WALL:  # the samples here; attach_waits adds the offcpu attachment
        copies = _try_copies(
            broker, req, "stackcopy", files, pid=pid, frequency=req.frequency, children=children
        )
        if copies is None:
            raise ClientError(
                "--wall needs program stackcopy (stack copies), which the policy does not "
                "grant you: ask the administrator, or use --off-cpu and a CPU profile apart"
            )
        return copies
    if req.mode == MEMORY:
        return _attach_memory(broker, req, pid, children, files)
    if req.mode == GPU:
        return _attach_gpu(broker, req, pid, files)
    if req.probes:
        return _attach_probes(broker, req, pid, children, files)
    sampling: dict[str, Any] = {"frequency": req.frequency, "children": children}
    copies = _try_copies(broker, req, "stackcopy", files, pid=pid, **sampling)
    sampling.update(req.job_params)
    return copies or broker.attach("profile", scope=req.scope, pid=pid, **sampling)


def _attach_probes(
    broker: Broker, req: ProfileRequest, pid: int | None, children: bool, files: list[pb.PythonFile]
) -> Attachment:
    """ustackcopy, else ustacks; refused both, the error says which grant is missing."""
    where: dict[str, Any] = {"library": req.library, "functions": req.functions}
    copies = _try_copies(broker, req, "ustackcopy", files, pid=pid, children=children, **where)
    if copies is not None:
        return copies
    try:
        return broker.attach("ustacks", scope=req.scope, pid=pid, children=children, **where)
    except BrokerError as e:
        if not e.refuses_program:
            raise  # not the policy's refusal (the process exited, or is not yours)
        why = _probes_refused(req, e)
        raise BrokerError(e.code, why, e.rule, operation=e.operation) from None


def _attach_memory(
    broker: Broker, req: ProfileRequest, pid: int | None, children: bool, files: list[pb.PythonFile]
) -> Attachment:
    """memstacks on the target's libc (or its libcuda, --cuda): req.library is set here."""
    from gfxbpf.client.profiles.memory import library

    if pid is None:
        raise ClientError("--memory needs one process: one --pid, or -- COMMAND")
    held = bool(req.command)
    req.library = library.find_cuda(pid, children, held) if req.cuda else library.find_libc(pid)
    where = {"library": req.library, "sample_bytes": req.sample_bytes}
    copies = _try_copies(broker, req, "memstacks", files, pid=pid, children=children, **where)
    if copies is None:
        raise ClientError(
            f"--memory needs program memstacks on {req.library}, which the policy does not "
            f"grant you: the administrator can grant it with `gfxbpf-admin approve memstacks "
            f"--users {user_name(os.getuid())} --scope self --libraries {req.library}`"
        )
    return copies


def _attach_gpu(
    broker: Broker, req: ProfileRequest, pid: int | None, files: list[pb.PythonFile]
) -> Attachment:
    """cudakernels on the process's CUPTI injection library (req.library is set
    here). Not its children: following them probes every process that maps the
    library, which raises its semaphores and makes all of them collect."""
    from gfxbpf.client.profiles.gpu.kernels import attach_kernels, find_injection

    if pid is None:
        raise ClientError("--gpu needs one process: one --pid")
    req.library = req.library or find_injection(pid)
    where: dict[str, Any] = {"scope": "self", "pid": pid, "python_files": files}
    if req.stack_bytes:  # the launch copies' size
        where["stack_bytes"] = req.stack_bytes
    return attach_kernels(broker, "profile --gpu", req.library, where)


def _probes_refused(req: ProfileRequest, e: BrokerError) -> str:
    """What --stacks-at lacks: a grant of ustackcopy (ustacks in scope system) on its library."""
    functions = ",".join(req.functions)
    if req.own_processes:
        name, scope = "ustackcopy", "self"
        what = "program ustackcopy (or ustacks, by frame pointers), and the policy grants neither"
    else:
        name, scope = "ustacks", req.scope or "system"
        what = f"program ustacks in scope {scope}, which the policy does not grant"
    return (
        f"--stacks-at on {req.library} (functions {functions}) needs {what} for this library: "
        f"the administrator can grant it with `gfxbpf-admin approve {name} "
        f"--users {user_name(os.getuid())} --scope {scope} --libraries {req.library} "
        f"--functions {functions}`\n  broker: {e.message}"
    )


def attach_waits(
    broker: Broker,
    req: ProfileRequest,
    sampling: Attachment,
    pid: int | None,
    pythons: Interpreters | None = None,
) -> Attachment | None:
    """--wall: offcpu beside the sampling attachment (detached if it cannot attach)."""
    if req.mode != WALL:
        return None
    try:
        children = req.children and pid is not None
        return _attach_offcpu(broker, req, pid, children, python_files(pythons))
    except BaseException:
        sampling.detach()
        raise


def python_files(pythons: Interpreters | None) -> list[pb.PythonFile]:
    """The attach request's interpreters: the CPython executables and shared
    libpythons to walk."""
    return [
        pb.PythonFile(
            dev=f.dev,
            ino=f.ino,
            runtime_off=f.runtime_off or 0,
            major=f.version[0],
            minor=f.version[1],
            library=f.is_library,
            free_threaded=f.free_threaded,
        )
        for f in (pythons.files.values() if pythons else ())
    ]


def _attach_offcpu(
    broker: Broker, req: ProfileRequest, pid: int | None, children: bool, files: list[pb.PythonFile]
) -> Attachment:
    kw: dict[str, Any] = {"pid": pid, "children": children, "min_block_us": req.min_block_us}
    name = "offwake" if req.wakers else "offcpu"  # --wakers: offcpu with the wakers' stacks
    if req.stack_bytes:  # --stack-bytes sizes the waits' copies too
        kw["stack_bytes"] = req.stack_bytes
    try:
        try:
            return broker.attach(name, scope="self", python_files=files, **kw)
        except BrokerError as e:
            if files and e.code == pb.ERROR_INVALID_ARGUMENT and "Python" in str(e):
                return broker.attach(name, scope="self", **kw)  # walks no Python
            if req.min_block_asked or e.code != pb.ERROR_PERMISSION_DENIED or "below" not in str(e):
                raise
            # --wall's 0.1 ms is under this policy's floor: the broker's default then.
            req.min_block_us = kw["min_block_us"] = 0
            return broker.attach(name, scope="self", python_files=files, **kw)
    except BrokerError as e:
        if e.code == pb.ERROR_NOT_FOUND and e.refuses_program:  # not "no process N"
            raise ClientError(
                f"--{req.mode} needs program {name}, which this broker does not offer "
                f"(or the policy does not grant you): {e}"
            ) from None
        raise


def _try_copies(
    broker: Broker, req: ProfileRequest, name: str, files: list[pb.PythonFile], **kw: Any
) -> Attachment | None:
    """The stack-copy program, for complete stacks; None where it is not granted
    (or an older broker lacks it): then frame-pointer stacks, as before. An
    older broker that walks no Python frames gets the request without files."""
    if not req.own_processes:
        return None  # copies are process memory: scope self only
    stack_bytes = req.stack_bytes
    scope = req.own_scope
    kw.update(req.job_params)
    try:
        kw["stack_bytes"] = stack_bytes
        try:
            return broker.attach(name, scope=scope, python_files=files, **kw)
        except BrokerError as e:
            if not files or e.code != pb.ERROR_INVALID_ARGUMENT or "Python" not in str(e):
                raise
            return broker.attach(name, scope=scope, **kw)
    except BrokerError as e:
        if stack_bytes or not e.refuses_program:
            # --stack-bytes asks for copies: no quiet fallback to frame pointers;
            # nor when the target was refused (not yours, gone): said as it is
            raise
        return None
