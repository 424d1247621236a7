"""The Python files and frame depth of an attach request (programs that walk
Python frames, catalog/programs/gfx_python.h), checked against the program,
the broker's layouts and the policy's max_python_frames."""

from __future__ import annotations

from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.request.resolve import Resolved
from gfxbpf.catalog import pymaps
from gfxbpf.proto import gfxbpf_pb2 as pb


def check_python(
    res: Resolved, params: pb.AttachParams
) -> tuple[tuple[pymaps.PythonFile, ...], int | None]:
    """(files, frames per stack or None for the object's default)."""
    entry, pe = res.entry, res.policy_entry
    if not entry.python_frames_knob:
        if params.python_files or params.python_frames:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"program {entry.name!r} walks no Python frames: it takes no python_files "
                "or python_frames",
            )
        return (), None
    files = tuple(
        pymaps.PythonFile(
            f.dev, f.ino, f.runtime_off, (f.major, f.minor), f.library, f.free_threaded
        )
        for f in params.python_files
    )
    try:
        pymaps.check(files)
    except pymaps.PythonFileError as e:
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"params.python_files: {e}") from None
    return files, _frames(res, params.python_frames, pe.max_python_frames)


def _frames(res: Resolved, asked: int, cap: int | None) -> int | None:
    if asked > pymaps.MAX_FRAMES:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT,
            f"python_frames {asked}: at most {pymaps.MAX_FRAMES}",
        )
    want = asked or pymaps.DEFAULT_FRAMES
    if cap is not None and want > cap:
        if asked:  # an explicit ask over the cap is refused, the default is lowered
            pe = res.policy_entry
            raise BrokerError(
                pb.ERROR_PERMISSION_DENIED,
                f"{asked} Python frames a stack is above the {cap} the policy allows you "
                f"for {res.entry.name!r}",
                rule=f"{pe.label}: max_python_frames",
                audit_rule=f"{pe.where}: max_python_frames = {cap}",
            )
        want = cap
    return want if asked or cap is not None else None
