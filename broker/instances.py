"""Attach, last step: run the catalog/instance.py pipeline for a new shared instance
(open → set knobs → charge the map budget → load with client-visible maps
read-only → attach), mapping each step's failure to a protocol error."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from gfxbpf.bpf import consts as C
from gfxbpf.bpf import mapids
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.errors import HostError, InputError, KernelError
from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.loader import LoadedObject, LoadError
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import MapSpec, ObjectError
from gfxbpf.broker.access import budget, loadcpu
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError, over_limit
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.request.params import Target
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.broker.sharing import warm
from gfxbpf.broker.sharing.registry import InstanceKey
from gfxbpf.catalog import instance as bpfinstance
from gfxbpf.catalog import proctree
from gfxbpf.catalog.entries import Attach, MapEntry, Program
from gfxbpf.proto import gfxbpf_pb2 as pb

LOAD_DELAY_ENV = "GFXBPF_TEST_LOAD_DELAY_S"


@dataclass
class SharedInstance:
    """One loaded and attached object, possibly shared by several attachments."""

    key: InstanceKey
    entry: Program
    spec: ObjectSpec
    inst: bpfinstance.Instance
    visible: dict[str, Map]  # client-visible maps by catalog name
    map_bytes: int = 0  # charged to its creator's map budget
    warm: bool = False  # taken from the warm pool: attached, not loaded
    # Where close() parks it for the next profile (broker/sharing/warm.py), if anywhere.
    park: Callable[[SharedInstance], None] | None = None

    @property
    def obj(self) -> LoadedObject:
        return self.inst.obj

    def close(self) -> None:
        if self.park is not None:
            self.park(self)
        else:
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
        # Which maps the kernel still holds, so a charge ends when its maps do.
        self.live_maps = mapids.LiveMaps()
        self.map_budget = budget.MapBudget(clock, lambda: self.live_maps.ids())
        self.load_budget = loadcpu.LoadBudget(clock)
        self.warm: warm.WarmPool[SharedInstance] = warm.WarmPool()
        # Tests only: a load this much slower, as the verifier is on a loaded
        # machine, so no test depends on how fast an attach is.
        self._load_delay = float(os.environ.get(LOAD_DELAY_ENV) or 0)

    def create(
        self, caller: Caller, res: Resolved, target: Target, key: InstanceKey
    ) -> SharedInstance:
        """A warm instance for the same user and knobs if one is parked (only
        attached: milliseconds), else a new one (loaded: the verifier's time)."""
        params = self._params(caller, res, target)
        pooled = warm.poolable(res.entry)
        pool_key = (key.sha256, key.scope, key.uid, res.policy_entry.allow_no_btf, params)
        shared = self.warm.take(pool_key) if pooled else None
        if shared is not None:
            shared = self._rearm(shared, caller, res, target, key)
        else:
            shared = self._create(caller, res, target, key, params)
        if pooled:
            shared.park = lambda s: self.warm.park(pool_key, s, key.uid)
        return shared

    def _create(
        self,
        caller: Caller,
        res: Resolved,
        target: Target,
        key: InstanceKey,
        params: bpfinstance.Params,
    ) -> SharedInstance:
        entry = res.entry
        with self._load_paid(caller, entry):  # its CPU is charged, however it ends
            opened = self._open(res, params)
            visible_specs = _visible_specs(entry, opened.spec)
            # Frozen: no fd of a map a client may hold can write it, not even one
            # reopened from a bpffs pin (the program still writes). A ring buffer
            # cannot be frozen; each attachment gets its own (InstanceKey.unique).
            read_only = [ms.real_name for ms in visible_specs if ms.map_type != C.MapType.RINGBUF]
            # Every map the load creates is charged, the broker-only ones too:
            # the caller's request makes the kernel allocate them all.
            specs = list(opened.spec.maps.values())
            try:
                charge = self.charge_maps(caller, entry, specs)
            except BrokerError:  # the user's parked instances may be what holds the budget
                if not self.warm.evict_user(key.uid):
                    raise
                charge = self.charge_maps(caller, entry, specs)
            try:
                owner = caller.uid if res.scope in (C.SELF, C.JOB) else None
                time.sleep(self._load_delay)
                inst = _load(opened, read_only, res.policy_entry.allow_no_btf)
                _attach(inst, target, owner)
            except BaseException:
                # Its maps are gone with the failed load or attach; what it
                # created still counts against the user's churn allowance.
                self.map_budget.refund(charge)
                raise
        visible = {m.name: inst.obj.maps[m.name] for m in entry.visible_maps}
        self.map_budget.bind(charge, {mapids.map_id(m.fileno()) for m in visible.values()})
        return SharedInstance(key, entry, opened.spec, inst, visible, charge.nbytes)

    @contextmanager
    def _load_paid(self, caller: Caller, entry: Program) -> Iterator[None]:
        """Around one load: refused while the caller's recent loads used the
        policy's CPU allowance (load_cpu_seconds_per_user), else charged to it."""
        policy = self._policy()
        lim = policy.limits
        limits = loadcpu.LoadLimits(lim.load_cpu_seconds_per_user, lim.load_cpu_window_seconds)
        try:
            with self.load_budget.loading(caller.uid, limits):
                yield
        except loadcpu.OverLoadBudget as e:
            msg = (
                f"uid {caller.uid} had the broker spend {e.used:.1f} s of CPU loading "
                f"programs (the kernel verifier's work, failed loads and attaches included) "
                f"in the last {limits.window:g} s, which uses up the policy's allowance of "
                f"{limits.seconds:g} s per {limits.window:g} s; program {entry.name!r} needs "
                f"a new load. Retry in {max(1, math.ceil(e.retry_after))} s, reuse the same "
                "knobs (a profile's instance is kept warm for the next one), or ask the "
                "administrator to raise load_cpu_seconds_per_user"
            )
            raise over_limit(
                msg, policy.path, "load_cpu_seconds_per_user", lim.load_cpu_seconds_per_user
            ) from None

    def _rearm(
        self,
        shared: SharedInstance,
        caller: Caller,
        res: Resolved,
        target: Target,
        key: InstanceKey,
    ) -> SharedInstance:
        """Attach a parked instance to this request's target (it was loaded
        for the same user and knobs). Closed if that fails."""
        owner = caller.uid if res.scope in (C.SELF, C.JOB) else None
        _attach(shared.inst, target, owner)  # closes it on failure
        shared.key, shared.warm = key, True
        return shared

    def _params(self, caller: Caller, res: Resolved, target: Target) -> bpfinstance.Params:
        """The load-time settings: everything that goes into the verified program.
        A poolable entry's pid is GFX_TREE_ONLY (the tree holds the target)."""
        entry = res.entry
        pid = target.pid if entry.pid_knob else None
        if pid is not None and warm.poolable(entry):
            pid = bpfinstance.TREE_ONLY
        return bpfinstance.Params(
            uid=caller.uid if res.scope in (C.SELF, C.JOB) and entry.uid_knob else None,
            cgroup=target.job.cgroup_id if target.job is not None else None,
            pid=pid,
            children=target.children,
            stack_bytes=target.stack_bytes,
            min_block_us=target.min_block_us,
            sample_bytes=target.sample_bytes,
            python_files=target.python_files,
            python_frames=target.python_frames,
        )

    def _open(self, res: Resolved, params: bpfinstance.Params) -> bpfinstance.Opened:
        entry = res.entry
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
        """Charge a new instance's maps to the caller's map budget: a client may
        keep the visible ones alive (fd, bpffs pin) long after detaching, and
        the broker-only ones live as long as the instance (parked warm too)."""
        ncpus = bpfsys.possible_cpus()
        need = sum(
            budget.map_bytes(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, ncpus)
            for m in specs
        )
        policy = self._policy()
        lim = policy.limits
        limits = budget.Limits(
            lim.map_bytes_per_user, lim.map_churn_bytes_per_user, lim.map_bytes_window_seconds
        )
        try:
            return self.map_budget.charge(caller.uid, need, limits)
        except budget.OverBudget as e:
            key = "map_bytes_per_user" if e.kind == "live" else "map_churn_bytes_per_user"
            limit = limits.live if e.kind == "live" else limits.churn
            msg = _over_budget(caller, entry, e, limits)
            raise over_limit(msg, policy.path, key, limit) from None


def _over_budget(caller: Caller, entry: Program, e: budget.OverBudget, lim: budget.Limits) -> str:
    """The refusal of a charge over a limit: what is used, what is needed, what to do."""
    h = budget.human
    need = h(e.need)
    if e.whole:
        live = e.kind == "live"
        limit, key = (
            (lim.live, "map_bytes_per_user") if live else (lim.churn, "map_churn_bytes_per_user")
        )
        return (
            f"program {entry.name!r} needs {need} of BPF maps, more than the policy lets one "
            f"user {'hold' if live else 'create per window'} ({h(limit)}): ask the "
            f"administrator to raise {key}"
        )
    if e.kind == "live":
        return (
            f"uid {caller.uid} already holds {h(e.used)} of BPF maps alive (attached, or kept "
            f"through map fds or pins after detaching); program {entry.name!r} needs {need} "
            f"more, over the policy's limit of {h(lim.live)}. Detach, or close the map fds "
            "you kept (end the processes that hold them), or ask the administrator to raise "
            "map_bytes_per_user"
        )
    wait = max(1, round(e.retry_after or 0))
    return (
        f"uid {caller.uid} had the broker create {h(e.used)} of BPF maps in the last "
        f"{lim.window:g} s; program {entry.name!r} needs {need} more, over the policy's "
        f"allowance of {h(lim.churn)} per {lim.window:g} s. Retry in {wait} s, or ask the "
        "administrator to raise map_churn_bytes_per_user"
    )


def _visible_specs(entry: Program, spec: ObjectSpec) -> list[MapSpec]:
    return _specs(entry, spec, entry.visible_maps)


def _specs(entry: Program, spec: ObjectSpec, maps: Sequence[MapEntry]) -> list[MapSpec]:
    out = []
    for m in maps:
        ms = spec.maps.get(m.name)
        if ms is None:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r}: catalog map {m.name!r} is not in the object",
            )
        out.append(ms)
    return out


def _load(
    opened: bpfinstance.Opened, read_only: list[str], allow_no_btf: bool
) -> bpfinstance.Instance:
    try:
        return opened.load(read_only=read_only, allow_no_btf=allow_no_btf)
    except LoadError as e:
        raise BrokerError(pb.ERROR_KERNEL, str(e)) from None


def _attach(inst: bpfinstance.Instance, target: Target, owner: int | None) -> None:
    """Attach a loaded instance to the request's target; closed on failure."""
    loaded = inst.params  # the knobs it was verified with; the target is per attach
    inst.params = replace(
        loaded,
        pid=target.pid,
        library=target.library,
        functions=target.functions,
        cookies=target.cookies,
        frequency=target.frequency,
    )
    try:
        if loaded.pid == bpfinstance.TREE_ONLY:
            assert target.pid is not None
            inst.track([target.pid])
        # Uprobes go through the fd the policy check looked at: no path race.
        inst.attach(target.library_path, errors=_attach_error)
        if target.children and target.pid is not None:
            _seed_tree(inst, target.pid, owner)
        if target.pid_handle is not None and not target.pid_handle.alive():
            raise BrokerError(pb.ERROR_NOT_FOUND, f"process {target.pid} exited while attaching")
    except BaseException:
        inst.close()
        raise
    finally:
        inst.params = replace(inst.params, pid=loaded.pid)


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
