"""Conformance corpus: the BPF objects inside Debian's libbpf-tools binaries.

Every object is taken from the installed package at test time (tests/corpus.py
finds the embedded EM_BPF images; nothing third-party is committed). For each
object that libbpf (`bpftool prog loadall`) loads on this kernel and whose
program kinds gfxbpf supports, gfxbpf must load every program with identical
translated code and map names (bpftool_compare.py, the mechanism the catalog's
test_conformance.py uses). The counts are printed; fewer identical loads than
pinned below fails, so a regression cannot hide among unsupported objects.
Raise the pins when the loader learns more.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import UnsupportedError
from tests.conftest import skip_or_fail
from tests.corpus import EmbeddedObject, corpus
from tests.kernel.bpftool_compare import (
    LibbpfRefused,
    assert_loads_like_libbpf,
    bpftool_loadall_count,
    ensure_bpffs,
)

# Measured on Debian 12's libbpf-tools: 52 objects, of which libbpf loads 32
# here (101 programs); gfxbpf loads all 32 identically since CO-RE. The rest
# libbpf refuses here too (fentry EPERM, targets this kernel lacks, stack maps).
PINNED_IDENTICAL_OBJECTS = 32
PINNED_IDENTICAL_PROGRAMS = 101


@dataclass
class Tally:
    objects: int = 0
    libbpf_objects: int = 0
    libbpf_programs: int = 0
    same_objects: int = 0
    same_programs: int = 0
    unsupported: Counter[str] = field(default_factory=Counter)
    libbpf_refused: Counter[str] = field(default_factory=Counter)
    differs: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [
            f"libbpf-tools corpus: {self.objects} objects; libbpf loads {self.libbpf_objects} "
            f"({self.libbpf_programs} programs); gfxbpf loads {self.same_objects} of them "
            f"identically ({self.same_programs} programs); differs or fails: {len(self.differs)}"
        ]
        lines += [
            f"  unsupported ({n} objects): {why}" for why, n in self.unsupported.most_common()
        ]
        lines += [f"  DIFFERS {d}" for d in self.differs]
        lines += [
            f"  libbpf refuses ({n} objects): {why}" for why, n in self.libbpf_refused.most_common()
        ]
        return "\n".join(lines)


def unsupported_reason(message: str) -> str:
    """A reason without object-specific names, so objects blocked alike count together."""
    why = re.sub(r"\(in [^)]*\)", "", message)
    why = re.sub(r"'[^']*'", "'…'", why)
    # "section '…': why", "map '…': why": the why; "CO-RE relocations … : advice": the what.
    if re.match(r"(section|map|program) '…'", why):
        return why.split(":", 1)[1].strip()
    if why.startswith("libbpf: "):  # bpftool's first error line, names masked
        return why.removeprefix("libbpf: ")
    return why.split(":")[0].strip()


def _tally_one(t: Tally, o: EmbeddedObject, path: str, bpffs: str) -> None:
    """Compare one object; objects libbpf refuses here count for nothing."""
    try:
        spec = ObjectSpec.parse(o.data, o.name)
    except UnsupportedError as e:
        try:
            t.libbpf_programs += bpftool_loadall_count(path, bpffs)
        except LibbpfRefused as refused:
            t.libbpf_refused[unsupported_reason(str(refused))] += 1
            return
        t.libbpf_objects += 1
        t.unsupported[unsupported_reason(str(e))] += 1
        return
    try:
        n = assert_loads_like_libbpf(path, spec, bpffs)
    except LibbpfRefused as refused:
        t.libbpf_refused[unsupported_reason(str(refused))] += 1
        return
    except Exception as e:  # a mismatch or a gfxbpf load error: all reported at the end
        t.libbpf_objects += 1
        t.differs.append(f"{o.name}: {type(e).__name__}: {e}")
        return
    t.libbpf_objects += 1
    t.libbpf_programs += n
    t.same_objects += 1
    t.same_programs += n


def test_libbpf_tools_corpus_loads_identically(tmp_path: Path) -> None:
    bpffs = ensure_bpffs()
    objects = corpus()
    if not objects:
        skip_or_fail("no BPF objects found: is Debian's libbpf-tools installed?")
    t = Tally(objects=len(objects))
    for o in objects:
        path = tmp_path / f"{o.name}.bpf.o"
        path.write_bytes(o.data)
        _tally_one(t, o, str(path), bpffs)
    print("\n" + t.report())
    assert not t.differs, "gfxbpf loaded differently from libbpf:\n" + "\n".join(t.differs)
    assert t.same_objects >= PINNED_IDENTICAL_OBJECTS, "fewer corpus objects load identically"
    assert t.same_programs >= PINNED_IDENTICAL_PROGRAMS, "fewer corpus programs load identically"
