"""Reduce the broker to CAP_BPF + CAP_PERFMON and nothing else, then prove it.

The target state, read back from /proc/self/status:

    CapEff == CapPrm == CapBnd == CAP_BPF | CAP_PERFMON  (0x000000c000000000)
    CapInh == CapAmb == 0
    NoNewPrivs == 1

Two ways in:
  * started as root with user=NAME: keep capabilities across setuid
    (PR_SET_KEEPCAPS), shrink the bounding set while CAP_SETPCAP is still
    held, clear supplementary groups, setgid + setuid to NAME, then set the
    capability sets to exactly the two;
  * started as a non-root user that already holds CAP_BPF and CAP_PERFMON
    (systemd AmbientCapabilities=, or setpriv): drop whatever else it holds.

Capabilities are per thread: call ensure_broker_privileges() before any
thread starts (gRPC, logging handlers...). It refuses when more than one
thread runs.
"""

from __future__ import annotations

import ctypes
import os
import pwd
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

CAP_PERFMON = 38
CAP_BPF = 39
BROKER_CAPS = (CAP_PERFMON, CAP_BPF)
BROKER_CAPS_MASK = (1 << CAP_BPF) | (1 << CAP_PERFMON)  # 0x000000c000000000
_CAP_SETGID = 6
_CAP_SETUID = 7
_CAP_SETPCAP = 8

# PR_CAP_AMBIENT is newer than python-prctl 1.8 knows; call prctl(2) directly.
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

FIX_HINT = (
    "Run gfxbpf-broker as root with --user gfxbpf (it keeps only CAP_BPF and "
    "CAP_PERFMON), or as a systemd service with User=gfxbpf, "
    "AmbientCapabilities=CAP_BPF CAP_PERFMON, CapabilityBoundingSet=CAP_BPF "
    "CAP_PERFMON and NoNewPrivileges=yes (by hand: setpriv --reuid=gfxbpf "
    "--regid=gfxbpf --clear-groups --inh-caps=-all,+bpf,+perfmon "
    "--ambient-caps=-all,+bpf,+perfmon --bounding-set=-all,+bpf,+perfmon "
    "gfxbpf-broker ...)."
)

_CAP_NAMES = {
    0: "chown",
    1: "dac_override",
    2: "dac_read_search",
    3: "fowner",
    4: "fsetid",
    5: "kill",
    6: "setgid",
    7: "setuid",
    8: "setpcap",
    9: "linux_immutable",
    10: "net_bind_service",
    11: "net_broadcast",
    12: "net_admin",
    13: "net_raw",
    14: "ipc_lock",
    15: "ipc_owner",
    16: "sys_module",
    17: "sys_rawio",
    18: "sys_chroot",
    19: "sys_ptrace",
    20: "sys_pacct",
    21: "sys_admin",
    22: "sys_boot",
    23: "sys_nice",
    24: "sys_resource",
    25: "sys_time",
    26: "sys_tty_config",
    27: "mknod",
    28: "lease",
    29: "audit_write",
    30: "audit_control",
    31: "setfcap",
    32: "mac_override",
    33: "mac_admin",
    34: "syslog",
    35: "wake_alarm",
    36: "block_suspend",
    37: "audit_read",
    38: "perfmon",
    39: "bpf",
    40: "checkpoint_restore",
}


class PrivilegeError(RuntimeError):
    """The broker cannot reach (or does not hold) exactly CAP_BPF + CAP_PERFMON."""


@dataclass(frozen=True)
class CapState:
    """The capability-related lines of /proc/<pid>/status."""

    eff: int
    prm: int
    inh: int
    bnd: int
    amb: int
    no_new_privs: bool
    uids: tuple[int, ...] = ()  # real, effective, saved, fs
    gids: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class PrivilegeReport:
    uid: int
    gid: int
    user: str | None  # the account name, when it has one
    switched_user: bool  # setuid happened here (root -> user)
    state: CapState
    dropped: tuple[str, ...] = ()  # capabilities removed from the permitted set
    warnings: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        who = f"uid {self.uid}" + (f" ({self.user})" if self.user else "") + f" gid {self.gid}"
        caps = ",".join(cap_names(self.state.eff)) or "none"
        text = (
            f"{who}: capabilities {caps} (CapEff=CapPrm=CapBnd={self.state.eff:016x}, "
            f"CapInh={self.state.inh:x}, CapAmb={self.state.amb:x}), "
            f"NoNewPrivs {int(self.state.no_new_privs)}"
        )
        if self.switched_user:
            text += ", switched from root"
        if self.dropped:
            text += f", dropped {len(self.dropped)} other capabilities"
        return text


def cap_name(cap: int) -> str:
    return "cap_" + _CAP_NAMES.get(cap, str(cap))


def cap_names(mask: int) -> list[str]:
    return [cap_name(c) for c in range(64) if mask >> c & 1]


def _ints(value: str) -> tuple[int, ...]:
    return tuple(int(x) for x in value.split())


def parse_status(text: str) -> CapState:
    """Parse /proc/<pid>/status (the Cap*, NoNewPrivs, Uid, Gid, Groups lines)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return CapState(
            eff=int(fields["CapEff"], 16),
            prm=int(fields["CapPrm"], 16),
            inh=int(fields["CapInh"], 16),
            bnd=int(fields["CapBnd"], 16),
            amb=int(fields.get("CapAmb", "0"), 16),
            no_new_privs=fields.get("NoNewPrivs", "0") == "1",
            uids=_ints(fields.get("Uid", "")),
            gids=_ints(fields.get("Gid", "")),
            groups=_ints(fields.get("Groups", "")),
        )
    except (KeyError, ValueError) as e:
        raise PrivilegeError(f"cannot parse the capability lines of /proc status: {e}") from e


def read_status(pid: int | str = "self") -> CapState:
    # Binary + utf-8: after setuid the stdlib may be unreadable, and utf-8 needs no
    # codec module import (ascii would).
    with open(f"/proc/{pid}/status", "rb") as f:
        return parse_status(f.read().decode("utf-8", "replace"))


def state_problems(state: CapState) -> list[str]:
    """What differs from the target state; empty when it is exactly reached."""
    want = BROKER_CAPS_MASK
    out = []
    for label, value in (("CapEff", state.eff), ("CapPrm", state.prm), ("CapBnd", state.bnd)):
        if value != want:
            extra = cap_names(value & ~want)
            missing = cap_names(want & ~value)
            detail = []
            if extra:
                more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
                detail.append("also holds " + ",".join(extra[:5]) + more)
            if missing:
                detail.append("lacks " + ",".join(missing))
            out.append(f"{label} is {value:016x}, not {want:016x} ({'; '.join(detail)})")
    for label, value in (("CapInh", state.inh), ("CapAmb", state.amb)):
        if value:
            out.append(f"{label} is {value:016x}, not 0 ({','.join(cap_names(value))})")
    if not state.no_new_privs:
        out.append("NoNewPrivs is 0, not 1")
    return out


def _libc_prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.prctl
    fn.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    fn.restype = ctypes.c_int
    rc = fn(option, arg2, arg3, arg4, arg5)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg2}): {os.strerror(err)}")
    return int(rc)


def _cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def _set_caps(prctl_mod: ModuleType, eff: int, prm: int, inh: int) -> None:
    """Set the three capability sets of this thread to exactly these masks."""
    known = [c for c in prctl_mod.ALL_CAPS if c < 64]
    on = {
        flag: [c for c in known if mask >> c & 1]
        for flag, mask in (
            (prctl_mod.CAP_EFFECTIVE, eff),
            (prctl_mod.CAP_PERMITTED, prm),
            (prctl_mod.CAP_INHERITABLE, inh),
        )
    }
    args = []
    for flag, caps in on.items():
        args.append((caps, flag, True))
        args.append(([c for c in known if c not in caps], flag, False))
    prctl_mod.set_caps(*args)


def _lookup_user(user: str) -> pwd.struct_passwd:
    try:
        if user.isdigit():
            return pwd.getpwuid(int(user))
        return pwd.getpwnam(user)
    except (KeyError, OverflowError) as e:
        raise PrivilegeError(
            f"--user {user}: no such user on this host; create the service account "
            "(deploy/ has a sysusers.d file) or name another"
        ) from e


def ensure_broker_privileges(user: str | None = None) -> PrivilegeReport:
    """Reach exactly {CAP_BPF, CAP_PERFMON}, no_new_privs, and verify it.

    user: the account to switch to when started as root (name or uid). When
    the process already runs as that user (or user is None and it is not
    root), it only drops what it holds beyond the two capabilities.
    Raises PrivilegeError naming what is missing and how to fix it.

    The steps run in this order, each refusing with its own message: what
    the process holds, whom to become, the drop, and a check of the result.
    """
    try:
        import prctl
    except ImportError as e:
        raise PrivilegeError("python-prctl is missing: pip install python-prctl") from e

    before = _holdings_before()
    target, switch = _target_user(user, before)
    _drop(prctl, before, target, switch)
    after = read_status()
    problems = _problems_after(before, after, target, switch, user)
    if problems:
        raise PrivilegeError(
            "cannot reach exactly CAP_BPF+CAP_PERFMON with no_new_privs: "
            + "; ".join(problems)
            + f". {FIX_HINT}"
        )
    return _report(before, after, switch)


def _holdings_before() -> CapState:
    """The state to drop from; refuses a kernel without CAP_BPF, a process with
    threads (capabilities are per thread) or one lacking the two capabilities."""
    if _cap_last_cap() < CAP_BPF:
        raise PrivilegeError(
            "this kernel does not know CAP_BPF/CAP_PERFMON (Linux >= 5.8 needed); "
            "gfxbpf-broker cannot run on it"
        )
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise PrivilegeError(
            f"{threads} threads are running: capabilities are per thread, so drop them "
            "before starting any thread (call ensure_broker_privileges first)"
        )
    before = read_status()
    if before.prm & BROKER_CAPS_MASK != BROKER_CAPS_MASK:
        missing = ",".join(cap_names(BROKER_CAPS_MASK & ~before.prm))
        raise PrivilegeError(
            f"gfxbpf-broker needs CAP_BPF and CAP_PERFMON; this process (uid {os.getuid()}) "
            f"lacks {missing} in its permitted set "
            f"(holds: {','.join(cap_names(before.prm)) or 'none'}). {FIX_HINT}"
        )
    return before


def _target_user(user: str | None, before: CapState) -> tuple[pwd.struct_passwd | None, bool]:
    """(the account to become, whether the uids/gids must change); never root."""
    target: pwd.struct_passwd | None = _lookup_user(user) if user is not None else None
    if target is not None and target.pw_uid == 0:
        raise PrivilegeError(
            f"--user {user} is root: name an unprivileged service account (e.g. gfxbpf)"
        )
    switch = target is not None and (
        os.getresuid() != (target.pw_uid,) * 3 or os.getresgid() != (target.pw_gid,) * 3
    )
    if switch:
        lacking = [c for c in (_CAP_SETUID, _CAP_SETGID) if not before.prm >> c & 1]
        if lacking:
            raise PrivilegeError(
                f"switching to --user {user} needs {','.join(cap_name(c) for c in lacking)}; "
                f"start as root, or start directly as {user} and leave out --user. {FIX_HINT}"
            )
    return target, switch


def _drop(prctl: Any, before: CapState, target: pwd.struct_passwd | None, switch: bool) -> None:
    """Bounding set, user, capability sets, ambient set, no_new_privs: in that order."""
    try:
        # Use everything permitted for the steps below (CAP_SETPCAP, CAP_SETUID...).
        _set_caps(prctl, before.prm, before.prm, before.inh & before.prm)
        # The bounding set only shrinks, and only with CAP_SETPCAP: do it first.
        if before.prm >> _CAP_SETPCAP & 1:
            for cap in range(_cap_last_cap() + 1):
                if cap not in BROKER_CAPS and prctl.capbset_read(cap):
                    prctl.capbset_drop(cap)
        if switch:
            assert target is not None
            # Keep the permitted set across the uid change (it is otherwise cleared
            # when the real, effective and saved uids all leave 0).
            prctl.set_keepcaps(True)
            os.setgroups([])
            os.setgid(target.pw_gid)
            os.setuid(target.pw_uid)
            prctl.set_keepcaps(False)
        _set_caps(prctl, BROKER_CAPS_MASK, BROKER_CAPS_MASK, 0)
        _libc_prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
        prctl.set_no_new_privs(1)
    except OSError as e:
        raise PrivilegeError(f"dropping privileges failed: {e}. {FIX_HINT}") from e


def _problems_after(
    before: CapState,
    after: CapState,
    target: pwd.struct_passwd | None,
    switch: bool,
    user: str | None,
) -> list[str]:
    """What the drop failed to reach (empty: exactly the broker's state)."""
    problems = state_problems(after)
    if after.bnd & ~BROKER_CAPS_MASK and not before.prm >> _CAP_SETPCAP & 1:
        problems.append(
            "the bounding set can only shrink with CAP_SETPCAP, which this process lacks: "
            "start it with a reduced bounding set (CapabilityBoundingSet=CAP_BPF CAP_PERFMON)"
        )
    if target is not None:
        if os.getresuid() != (target.pw_uid,) * 3 or os.getresgid() != (target.pw_gid,) * 3:
            problems.append(
                f"uids {os.getresuid()} / gids {os.getresgid()} are not all "
                f"{target.pw_uid}/{target.pw_gid} ({user})"
            )
        if switch and os.getgroups():
            problems.append(f"supplementary groups remain: {os.getgroups()}")
    return problems


def _report(before: CapState, after: CapState, switch: bool) -> PrivilegeReport:
    """Who the broker is now, what it dropped, and a warning if that is still root."""
    uid, gid = os.getuid(), os.getgid()
    warnings = []
    if uid == 0:
        warnings.append(
            "running as uid 0: files owned by root stay writable without any capability; "
            "pass --user gfxbpf"
        )
    try:
        name: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = None
    return PrivilegeReport(
        uid=uid,
        gid=gid,
        user=name,
        switched_user=switch,
        state=after,
        dropped=tuple(cap_names(before.prm & ~BROKER_CAPS_MASK)),
        warnings=tuple(warnings),
    )
