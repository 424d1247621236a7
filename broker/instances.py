"""Attach, last step: run the catalog/instance.py pipeline for a new shared instance
(open → set knobs → charge the map budget → load with client-visible maps
read-only → attach), mapping each step's failure to a protocol error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.bpf import consts as C
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.errors import HostError, InputError, KernelError
from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.loader import LoadedObject, LoadError
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.object import MapSpec, ObjectError, ObjectSpec
from gfxbpf.broker import proctree
from gfxbpf.broker.access import budget
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError, over_limit
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.registry import InstanceKey
from gfxbpf.broker.request.params import Target
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog import instance as bpfinstance
from gfxbpf.catalog.entries import Attach, Program
from gfxbpf.proto import gfxbpf_pb2 as pb


@dataclass
class SharedInstance:
    """One loaded and attached object, possibly shared by several attachments."""

    key: InstanceKey
    entry: Program
    spec: ObjectSpec
    inst: bpfinstance.Instance
    visible: dict[str, Map]  # client-visible maps by catalog name
    map_bytes: int = 0  # charged to its creator's map budget

    @property
    def obj(self) -> LoadedObject:
        return self.inst.obj

    def close(self) -> None:
        self.inst.close()


class InstanceLoader:
    """Creates shared instances; policy() is the policy in force (reloads swap it)."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        clock: Callable[[], float],
        event_exists: Callable[[str, str], bool] = tracefs.event_exists,
        read_format: Callable[[str, str], tracefs.EventFormat] = tracefs.read_format,
    ) -> None:
        self._policy = policy
        self._event_exists = event_exists
        self._read_format = read_format
        self.map_budget = budget.MapBudget(clock)

    def create(
        self, caller: Caller, res: Resolved, target: Target, key: InstanceKey
    ) -> SharedInstance:
        entry = res.entry
        opened = self._open(caller, res, target)
        visible_specs = _visible_specs(entry, opened.spec)
        # Frozen: no fd of a map a client may hold can write it, not even one
        # reopened from a bpffs pin (the program still writes). A ring buffer
        # cannot be frozen; each attachment gets its own (InstanceKey.unique).
        read_only = [ms.real_name for ms in visible_specs if ms.map_type != C.MapType.RINGBUF]
        charge = self.charge_maps(caller, entry, visible_specs)
        try:
            owner = caller.uid if res.scope == C.SELF else None
            inst = _load_and_attach(opened, read_only, target, owner)
        except BaseException:
            self.map_budget.refund(charge)  # its maps are gone with the failed load
            raise
        visible = {m.name: inst.obj.maps[m.name] for m in entry.visible_maps}
        return SharedInstance(key, entry, opened.spec, inst, visible, charge.nbytes)

    def _open(self, caller: Caller, res: Resolved, target: Target) -> bpfinstance.Opened:
        entry = res.entry
        params = bpfinstance.Params(
            uid=caller.uid if res.scope == C.SELF and entry.uid_knob else None,
            pid=target.pid if entry.pid_knob else None,
            library=target.library,
            functions=target.functions,
            cookies=target.cookies,
            frequency=target.frequency,
            children=target.children,
        )
        try:
            return bpfinstance.open_program(
                entry,
                res.data,
                params,
                exists=self._event_exists,
                read_format=self._read_format,
            )
        except ObjectError as e:
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"object cannot be used: {e}") from None
        except HostError as e:  # no such tracepoint, field or driver; tracefs itself
            raise BrokerError(pb.ERROR_UNAVAILABLE, str(e)) from None
        except InputError as e:  # a knob, program, format or parameter that does not fit
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r}: the object does not match its catalog entry: {e}",
            ) from None

    def charge_maps(self, caller: Caller, entry: Program, specs: list[MapSpec]) -> budget.Charge:
        """Charge a new instance's client-visible maps to the caller's map budget:
        a client may keep them alive (fd, bpffs pin) long after detaching."""
        ncpus = bpfsys.possible_cpus()
        need = sum(
            budget.map_bytes(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, ncpus)
            for m in specs
        )
        policy = self._policy()
        limit = policy.limits.map_bytes_per_user
        window = policy.limits.map_bytes_window_seconds
        try:
            return self.map_budget.charge(caller.uid, need, limit, window)
        except budget.OverBudget as e:
            if e.retry_after is None:
                msg = (
                    f"program {entry.name!r} needs {budget.human(need)} of BPF maps, more than "
                    f"the policy lets one user create in {window} s ({budget.human(limit)}): "
                    "ask the administrator to raise map_bytes_per_user"
                )
            else:
                msg = (
                    f"uid {caller.uid} had the broker create {budget.human(e.used)} of BPF maps "
                    f"in the last {window} s; program {entry.name!r} needs "
                    f"{budget.human(need)} more, over the policy's limit of "
                    f"{budget.human(limit)} per {window} s (a client can keep a map alive after "
                    f"detaching). Retry in {max(1, round(e.retry_after))} s, or ask the "
                    "administrator to raise map_bytes_per_user"
                )
            raise over_limit(msg, policy.path, "map_bytes_per_user", limit) from None


def _visible_specs(entry: Program, spec: ObjectSpec) -> list[MapSpec]:
    out = []
    for m in entry.visible_maps:
        ms = spec.maps.get(m.name)
        if ms is None:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r}: catalog map {m.name!r} is not in the object",
            )
        out.append(ms)
    return out


def _load_and_attach(
    opened: bpfinstance.Opened, read_only: list[str], target: Target, owner: int | None
) -> bpfinstance.Instance:
    try:
        inst = opened.load(read_only=read_only)
    except LoadError as e:
        raise BrokerError(pb.ERROR_KERNEL, str(e)) from None
    try:
        # Uprobes go through the fd the policy check looked at: no path race.
        inst.attach(target.library_path, errors=_attach_error)
        if target.children and target.pid is not None:
            _seed_tree(inst, target.pid, owner)
        if target.pid_handle is not None and not target.pid_handle.alive():
            raise BrokerError(pb.ERROR_NOT_FOUND, f"process {target.pid} exited while attaching")
    except BaseException:
        inst.close()
        raise
    return inst


def _seed_tree(inst: bpfinstance.Instance, pid: int, owner: int | None) -> None:
    """Put pid's live descendants (owner's only, for scope self) in the tree.
    The fork hook is attached already and adds the children of whatever is in
    the tree; a process forked while /proc was read is found by the next pass."""
    for _ in range(_SEED_PASSES):
        try:
            if not inst.track(proctree.descendants(pid, owner)):
                return
        except OSError as e:  # a full tree (E2BIG), a map error
            raise BrokerError(pb.ERROR_KERNEL, f"tracking the processes of {pid}: {e}") from None


_SEED_PASSES = 3


def _attach_error(a: Attach, e: Exception) -> Exception:
    if isinstance(e, HostError):  # tracefs
        return BrokerError(pb.ERROR_UNAVAILABLE, str(e))
    # A symbol not found, parameters that do not fit; bpf/link/attach.py also checks
    # its own arguments (a path, a pid) with plain ValueError.
    if isinstance(e, (InputError, ValueError)):
        return BrokerError(pb.ERROR_INVALID_ARGUMENT, f"cannot attach: {e}")
    # The kernel refused (AttachError, BpfError), or a plain OSError on the way.
    if isinstance(e, (KernelError, OSError)):
        return BrokerError(pb.ERROR_KERNEL, f"attaching {a.program!r} failed: {e}")
    return e
