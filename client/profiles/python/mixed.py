"""Mixed stacks: each run of Python frames in place of the native frame of
CPython's evaluation loop that runs it.

One C call of the evaluation loop (_PyEval_EvalFrameDefault) runs several
Python frames from 3.11 on; the walker flags the last of them (the one the
C call entered with) ENTRY. Cut innermost-first at those flags, the runs
match the loop's native frames innermost first, so

    main → Py_BytesMain → … → _PyEval_EvalFrameDefault → PyObject_Call → …
         → _PyEval_EvalFrameDefault → PyObject_Free

becomes main → Py_BytesMain → … → outer (s.py:9) → PyObject_Call → …
→ middle (s.py:5) → inner (s.py:2) → PyObject_Free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gfxbpf.client.profiles.python.records import FRAME_ENTRY

# The evaluation loop's native function names (its frame is replaced).
EVAL_FRAMES = frozenset({"_PyEval_EvalFrameDefault", "_PyEval_EvalFrame"})

# Runs innermost first, each run's names root first.
Runs = tuple[tuple[str, ...], ...]


def split_runs(frames: Iterable[tuple[str, int]]) -> Runs:
    """(name, flags) innermost first -> runs innermost first, each root first.
    A run ends at an ENTRY frame; frames after the last ENTRY (a chain cut
    short) make a run of their own."""
    runs: list[tuple[str, ...]] = []
    run: list[str] = []
    for name, flags in frames:
        run.append(name)
        if flags & FRAME_ENTRY:
            runs.append(tuple(reversed(run)))
            run = []
    if run:
        runs.append(tuple(reversed(run)))
    return tuple(runs)


def mix(native: Sequence[str], runs: Runs) -> tuple[str, ...]:
    """native (root first) with runs put in place of its evaluation-loop frames,
    innermost with innermost. Runs left over (the native stack was cut before
    reaching them) go, outermost first, before the outermost loop frame's run;
    with no loop frame at all, every run goes before the native frames."""
    if not runs:
        return tuple(native)
    loops = [i for i, name in enumerate(native) if name in EVAL_FRAMES]
    if not loops:
        return tuple(name for run in reversed(runs) for name in run) + tuple(native)
    placed: dict[int, tuple[str, ...]] = {}
    for k, i in enumerate(reversed(loops)):
        if k >= len(runs):
            break
        placed[i] = runs[k]
    if len(runs) > len(loops):
        extra = tuple(name for run in reversed(runs[len(loops) :]) for name in run)
        placed[loops[0]] = extra + placed[loops[0]]
    out: list[str] = []
    for i, name in enumerate(native):
        out.extend(placed.get(i, (name,)))
    return tuple(out)
