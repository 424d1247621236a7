"""CO-RE decisions, libbpf's and gfxbpf's, in one comparable form.

libbpf (through `bpftool -d prog loadall`) logs each CO-RE relocation it
applies: "prog 'p': relo #3: patched insn #24 (ALU/ALU64) imm 12 -> 1268", or
"substituting insn #24 w/ invalid insn" for a poisoned one. It logs them
before loading, so the decisions can be compared even for programs whose
kind gfxbpf (or this kernel) cannot load. Both sides become
{(program, insn index): (what, new value)} with what in imm, off, mem_sz,
imm64, poison.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from gfxbpf.bpf.core.apply import CoreResult

Decisions = dict[tuple[str, int], tuple[tuple[str, int], ...]]

_PATCHED = re.compile(
    r"prog '([^']+)': relo #\d+: patched insn #(\d+) \([^)]*\) (imm64|imm|off|mem_sz) "
    r"(\d+) -> (\d+)"
)
_POISON = re.compile(r"prog '([^']+)': relo #(\d+): substituting insn #(\d+) w/ invalid insn")
# libbpf's first CO-RE line for a record: "prog 'p': relo #0: <byte_off> [5] struct ..."
_SPEC = re.compile(r"prog '[^']+': relo #\d+: <")


def libbpf_decisions(path: str, bpffs: str = "/sys/fs/bpf") -> Decisions | None:
    """Run `bpftool -d prog loadall` on path and collect the CO-RE decisions it logs.

    The load itself may fail (a program kind this kernel refuses): the
    relocations were applied and logged before. None when libbpf stopped
    before CO-RE (e.g. a map it could not create) and so decided nothing.
    """
    pin_dir = tempfile.mkdtemp(prefix="gfxtest_corelog_", dir=bpffs)
    os.rmdir(pin_dir)
    try:
        r = subprocess.run(
            ["bpftool", "-d", "prog", "loadall", path, pin_dir],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)
    out: dict[tuple[str, int], list[tuple[str, int]]] = {}
    poisoned: set[tuple[str, str]] = set()  # (program, relo #)
    reached = False
    for line in r.stderr.splitlines():
        reached = reached or _SPEC.search(line) is not None
        m = _PATCHED.search(line)
        if m:
            out.setdefault((m[1], int(m[2])), []).append((m[3], int(m[5])))
            continue
        m = _POISON.search(line)
        if m:
            if (m[1], m[2]) in poisoned:
                continue  # the second slot of the same poisoned ld_imm64
            poisoned.add((m[1], m[2]))
            out[(m[1], int(m[3]))] = [("poison", 0)]
    return {k: tuple(v) for k, v in out.items()} if reached else None


def gfxbpf_decisions(core: CoreResult) -> Decisions:
    """The same form from gfxbpf's relocation records."""
    out: Decisions = {}
    for rec in core.records:
        res = rec.result
        assert res is not None, f"{rec.program} insn {rec.insn}: {rec.error}"
        if res.poison:
            out[(rec.program, rec.insn)] = (("poison", 0),)
            continue
        what = rec.change.split(" ", 1)[0]
        steps: tuple[tuple[str, int], ...] = ((what, res.new_val),)
        if "size" in rec.change:
            steps += (("mem_sz", res.new_sz),)
        out[(rec.program, rec.insn)] = steps
    return out
