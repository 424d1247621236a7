"""What the two halves of issue #10 agreed on, and what no output may hold:
RawStack carries no kernel address, so no written profile can contain one;
pprof.proto keeps the published field numbers; C++ names are demangled."""

from __future__ import annotations

import dataclasses
import gzip
import re
import shutil

import pytest

from gfxbpf.client.profiles import procmaps
from gfxbpf.client.profiles.demangle import demangle
from gfxbpf.client.profiles.model import Profile, RawStack
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.writers import FORMATS, render
from gfxbpf.proto import pprof_pb2
from tests.conftest import skip_or_fail

KERNEL_MIN = 0xFFFF_8000_0000_0000


def test_raw_stack_has_no_field_for_kernel_addresses() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(RawStack)}
    assert fields == {
        "pid": "int",
        "user": "tuple[int, ...]",
        "kernel": "bool",
        "weight": "int",
        "comm": "str",
        "user_error": "str | None",
        "leaf": "str | None",
        "unwind_stop": "str | None",  # a reason (unwind.Stop), never an address
        "unwind_scanned": "bool",  # whether a stack scan found a frame
        "unwound": "bool",  # unwound from a stack copy by CFI
        "thread": "int | None",  # a thread id (--wall), never an address
        "python": "tuple[tuple[str, ...], ...]",  # Python frame names, never an address
        "tid": "int",  # the sampled thread's id (pprof's tid label), never an address
        "python_starts": "tuple[tuple[str, int], ...]",  # (name, first line): no address
    }


def _kernel_looking_text(text: str) -> list[str]:
    """Hex numbers (with or without 0x) in the kernel half of the address space."""
    hits = []
    for m in re.finditer(r"(?<![0-9a-fA-F])(?:0x)?([0-9a-fA-F]{16})(?![0-9a-fA-F])", text):
        if int(m.group(1), 16) >= KERNEL_MIN:
            hits.append(m.group(0))
    return hits


def test_no_output_holds_a_kernel_address(tmp_path) -> None:
    """Even if a kernel address slipped into RawStack.user, the symbolizer writes
    names and file offsets, never an address: every format is scanned."""
    maps = procmaps.ProcessMaps(pid=4242, mappings=[], comm="victim")
    sym = Symbolizer(cache_dir=str(tmp_path))
    sym.add_process(4242, maps)
    raw = [
        RawStack(4242, (0xFFFF_FFFF_8100_1234, 0x7F00_0000_1000), True, 9),
        RawStack(4242, (), True, 1),
    ]
    prof = sym.symbolize(raw, "samples", period_ns=10_101_010)
    for fmt in FORMATS:
        data = render(prof, fmt)
        text = (gzip.decompress(data) if fmt == "pprof" else data).decode("latin-1")
        assert not _kernel_looking_text(text), fmt
        assert "ffffffff81" not in text.lower(), fmt
    assert set(prof.stacks) == {
        ("victim", "[unknown]", "[unknown]", "[kernel]"),
        ("victim", "[kernel]"),
    }


def test_the_scan_finds_what_it_looks_for() -> None:
    assert _kernel_looking_text("x 0xffffffff81001234 y ffff888012345678;") == [
        "0xffffffff81001234",
        "ffff888012345678",
    ]
    assert _kernel_looking_text("0x00007f0000001000 [libc.so.6+0x2a1b]") == []


# The published profile.proto numbering, which pprof, Pyroscope and Parca read.
PPROF_FIELDS = {
    "Profile": {
        "sample_type": 1,
        "sample": 2,
        "mapping": 3,
        "location": 4,
        "function": 5,
        "string_table": 6,
        "drop_frames": 7,
        "keep_frames": 8,
        "time_nanos": 9,
        "duration_nanos": 10,
        "period_type": 11,
        "period": 12,
        "comment": 13,
        "default_sample_type": 14,
        "doc_url": 15,
    },
    "ValueType": {"type": 1, "unit": 2},
    "Sample": {"location_id": 1, "value": 2, "label": 3},
    "Label": {"key": 1, "str": 2, "num": 3, "num_unit": 4},
    "Mapping": {
        "id": 1,
        "memory_start": 2,
        "memory_limit": 3,
        "file_offset": 4,
        "filename": 5,
        "build_id": 6,
        "has_functions": 7,
        "has_filenames": 8,
        "has_line_numbers": 9,
        "has_inline_frames": 10,
    },
    "Location": {"id": 1, "mapping_id": 2, "address": 3, "line": 4, "is_folded": 5},
    "Line": {"function_id": 1, "line": 2, "column": 3},
    "Function": {"id": 1, "name": 2, "system_name": 3, "filename": 4, "start_line": 5},
}


@pytest.mark.parametrize("message", sorted(PPROF_FIELDS))
def test_pprof_proto_keeps_the_published_field_numbers(message: str) -> None:
    desc = pprof_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in desc.fields} == PPROF_FIELDS[message]
    assert pprof_pb2.DESCRIPTOR.package == "perftools.profiles"


def test_cpp_names_are_demangled() -> None:
    if shutil.which("c++filt") is None:
        skip_or_fail("c++filt is missing (apt-get install binutils)")
    got = demangle(["_ZN4llvm32createLowerGlobalDtorsLegacyPassEv", "main", "_Znot valid"])
    assert got == {
        "_ZN4llvm32createLowerGlobalDtorsLegacyPassEv": ("llvm::createLowerGlobalDtorsLegacyPass()")
    }


def test_profile_total() -> None:
    assert Profile(stacks={("a",): 2, ("a", "b"): 3}, unit="calls").total() == 5


def test_notes_for_unmapped_processes_and_the_depth_limit(tmp_path) -> None:
    sym = Symbolizer(cache_dir=str(tmp_path))
    sym.add_process(78, procmaps.ProcessMaps(pid=78, mappings=[], comm="mapped"))
    deep = tuple(range(0x1000, 0x1000 + 127 * 16, 16))
    raw = [
        RawStack(77, (0x1000, 0x2000), False, 3),  # never captured
        RawStack(78, deep, False, 1),
        RawStack(78, (0x1000,), False, 4),
    ]
    prof = sym.symbolize(raw, "samples")
    assert prof.stacks == {
        ("[pid 77]", "[unknown]", "[unknown]"): 3,
        ("mapped",) + ("[unknown]",) * 127: 1,
        ("mapped", "[unknown]"): 4,
    }
    text = "\n".join(prof.notes)
    assert "37.5% of the weight is from processes whose memory maps were never read" in text
    assert "12% of the user stacks are 127 frames or deeper" in text
    assert "50% of the user stacks stop before reaching the thread's start, last in" in text


def test_an_unwound_stack_that_ends_is_complete_even_unnamed(tmp_path) -> None:
    """A CFI unwind that ends with no stop reason reached the thread's first
    frame (its return address undefined), even where that frame has no name:
    Ubuntu's libc has no symbol table, so clone3 shows as [libc.so.6+0x...].
    Such stacks are not the frame-pointer walk's cut stacks; a kernel-walked
    stack of the same frames still is."""
    sym = Symbolizer(cache_dir=str(tmp_path))
    sym.add_process(78, procmaps.ProcessMaps(pid=78, mappings=[], comm="worker"))
    unwound = RawStack(78, (0x1000, 0x2000), False, 5, unwound=True)
    assert not [n for n in sym.symbolize([unwound], "samples").notes if "thread's start" in n]
    walked = dataclasses.replace(unwound, unwound=False)
    notes = sym.symbolize([walked], "samples").notes
    assert [n for n in notes if "100% of the user stacks stop before reaching" in n], notes
