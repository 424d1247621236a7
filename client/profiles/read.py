"""Raw stacks out of the profile and ustacks maps (catalog/programs/*.bpf.c).

The layouts are those of the catalog's reviewed objects; a key or value of
another size means the broker runs an object this client does not know, and
is refused with a message rather than misread. Only user addresses ever come
out of these maps: kernel time is a flag (RawStack.kernel).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from gfxbpf.client import profiles as profile
from gfxbpf.client.errors import ProtocolError

if TYPE_CHECKING:
    from gfxbpf.client.profiles.model import RawStack

# profile.bpf.c struct sample_key: tgid, user_stack (id or -errno), kernel, comm[16]
SAMPLE_KEY = struct.Struct("<IiI16s")
# ustacks.bpf.c struct call_key: tgid, user_stack, function, pad, caller
CALL_KEY = struct.Struct("<IiIIQ")
# ustacks.bpf.c struct call_stats: calls, total_ns
CALL_STATS = struct.Struct("<QQ")
U64 = struct.Struct("<Q")

Entries = Iterable[tuple[bytes, bytes | list[bytes]]]


def _one(value: bytes | list[bytes]) -> bytes:
    if isinstance(value, list):  # never per-CPU here; tolerate it all the same
        raise ProtocolError("a profile map came back per-CPU: this client does not know it")
    return value


def _check(name: str, data: bytes, size: int) -> None:
    if len(data) != size:
        raise ProtocolError(
            f"map {name!r}: {len(data)}-byte entries where this gfxclient expects {size}: "
            "the broker runs another version of the program (update gfxclient)"
        )


def stack_table(entries: Entries) -> dict[int, tuple[int, ...]]:
    """Stack id -> user addresses, innermost first (the zero padding dropped)."""
    out: dict[int, tuple[int, ...]] = {}
    for key, value in entries:
        _check("stacks", key, 4)
        raw = _one(value)
        if len(raw) % 8:
            raise ProtocolError(f"map 'stacks': a {len(raw)}-byte stack is not whole u64s")
        addrs = struct.unpack(f"<{len(raw) // 8}Q", raw)
        end = addrs.index(0) if 0 in addrs else len(addrs)  # the padding starts at the first 0
        out[struct.unpack("<I", key)[0]] = addrs[:end]
    return out


# bpf_get_stackid's errors, as the reasons a sample has no user stack.
_STACK_ERRORS = {
    errno.EFAULT: "no user stack (a kernel thread, or unreadable)",
    errno.EEXIST: "stack table collision (another stack holds its slot)",
    errno.ENOMEM: "stack table full",
}


def stack_ids(entries: Entries, probes: bool = False) -> set[int]:
    """The stack ids a counts (profile) or calls (ustacks) map refers to."""
    layout = CALL_KEY if probes else SAMPLE_KEY
    keys = b"".join(k for k, _ in entries if len(k) == layout.size)  # one C loop, not 16,000
    return {row[1] for row in layout.iter_unpack(keys) if row[1] >= 0}


def stack_error(stack_id: int, stacks: dict[int, tuple[int, ...]]) -> str | None:
    """Why a sample has no user stack (None: it has one)."""
    if stack_id >= 0:
        return None if stack_id in stacks else "stack not in the table when read"
    return _STACK_ERRORS.get(-stack_id, f"lost ({os.strerror(-stack_id)})")


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def profile_stacks(
    counts: Entries, stacks: dict[int, tuple[int, ...]], pids: Sequence[int] = ()
) -> list[RawStack]:
    """RawStacks (weight: samples) from profile's counts map; only pids if given."""
    rows = list(counts)
    for key, value in rows:  # sizes first, so the rows can be unpacked in one go
        _check("counts", key, SAMPLE_KEY.size)
        _check("counts", _one(value), U64.size)
    wanted = set(pids)
    keys = SAMPLE_KEY.iter_unpack(b"".join(k for k, _ in rows))
    weights = U64.iter_unpack(b"".join(v for _, v in rows))  # type: ignore[misc]
    out = []
    comms: dict[bytes, str] = {}
    for (tgid, sid, kernel, comm), (weight,) in zip(keys, weights, strict=True):
        if wanted and tgid not in wanted:
            continue
        user = stacks.get(sid) if sid >= 0 else None
        name = comms.get(comm)
        if name is None:
            name = comms[comm] = _comm(comm)
        out.append(
            profile.RawStack(  # the model is imported on first use (issue #15)
                pid=tgid,
                user=user or (),
                kernel=bool(kernel),
                weight=weight,
                comm=name,
                user_error=None if user is not None else stack_error(sid, stacks),
            )
        )
    return out


def call_stacks(
    calls: Entries,
    stacks: dict[int, tuple[int, ...]],
    functions: Sequence[str],
    weight: str = "calls",
) -> list[RawStack]:
    """RawStacks from ustacks' calls map, weighted by calls or by nanoseconds.

    The stack walk at a function's entry starts with the function itself and
    then skips its caller (the frame pointer is still the caller's); the key's
    `caller` return address goes back in between. The function is the leaf.
    """
    out = []
    for key, value in calls:
        _check("calls", key, CALL_KEY.size)
        tgid, sid, function, _pad, caller = CALL_KEY.unpack(key)
        raw = _one(value)
        _check("calls", raw, CALL_STATS.size)
        ncalls, total_ns = CALL_STATS.unpack(raw)
        err = stack_error(sid, stacks)
        above = stacks.get(sid, ())[1:] if not err else ()
        user = ((caller,) if caller else ()) + above
        leaf = functions[function] if function < len(functions) else f"[function {function}]"
        out.append(
            profile.RawStack(
                pid=tgid,
                user=user,
                kernel=False,
                weight=ncalls if weight == "calls" else total_ns,
                user_error=err if not user else None,
                leaf=leaf,
            )
        )
    return out


def lost_count(entries: Entries) -> int:
    """The `lost` counter (samples or calls a full table could not count)."""
    return sum(U64.unpack(_one(v))[0] for _, v in entries if len(_one(v)) == U64.size)
