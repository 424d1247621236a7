"""broker/revoke.py counts every knob of a policy entry (issue 35 item 6):
a field added to ProgramEntry must be checked by a reload's revoke, or said
to be decided elsewhere. The attack (a reload lowering max_stack_bytes and
raising min_block_us, against live attachments) is in
tests/kernel/test_revocation.py."""

from __future__ import annotations

import dataclasses

from gfxbpf.broker import revoke
from gfxbpf.broker.policy.model import ProgramEntry
from gfxbpf.catalog.instance import Params
from gfxbpf.catalog.pymaps import PythonFile

ENTRY = ProgramEntry(index=1, name="stackcopy", sha256="0" * 64)


def test_every_field_of_an_entry_is_a_knob_or_decided_elsewhere() -> None:
    fields = {f.name for f in dataclasses.fields(ProgramEntry)}
    assert fields == set(revoke.KNOBS) | set(revoke.NOT_KNOBS), fields ^ (
        set(revoke.KNOBS) | set(revoke.NOT_KNOBS)
    )
    assert not set(revoke.KNOBS) & set(revoke.NOT_KNOBS)


def test_each_cap_is_compared_as_the_attach_compared_it() -> None:
    fit = revoke._knobs_fit
    entry = dataclasses.replace(ENTRY, max_stack_bytes=1024, min_block_us=500, max_frequency=49)
    assert fit(entry, Params(stack_bytes=1024, min_block_us=500), 49, True)
    assert not fit(entry, Params(stack_bytes=2048), None, True)
    assert not fit(entry, Params(), None, True), "the 8 KiB default copy is above 1024"
    assert fit(entry, Params(), None, False), "a program that copies no stack"
    assert not fit(entry, Params(min_block_us=200), None, False)
    assert not fit(entry, Params(), 99, False)
    py = (PythonFile(1, 2, 3, (3, 11), False),)
    capped = dataclasses.replace(ENTRY, max_python_frames=16)
    assert not fit(capped, Params(python_files=py), None, False), "the default 64 frames"
    assert fit(capped, Params(python_files=py, python_frames=16), None, False)
    assert fit(ENTRY, Params(stack_bytes=8192, python_files=py), None, True)
