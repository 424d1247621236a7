"""The one ELF layer (gfxbpf.elf): a file read by fd and the same bytes in
memory agree with each other and with pyelftools' own view; notes and symbol
entries decode; corrupt input is an ElfError and nothing else."""

from __future__ import annotations

import array
import os
import random
import struct
import sys

import pytest
from elftools.elf.elffile import ELFFile

from gfxbpf.elf import notes
from gfxbpf.elf.reader import PT_LOAD, SHT_NOBITS, ElfError, ElfFile, open_elf
from gfxbpf.elf.symbols import SymbolFormatError, SymbolTable, layout

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
FILES = [LIBC, os.path.realpath(sys.executable)]


@pytest.mark.parametrize("path", FILES)
def test_fd_and_memory_agree_with_pyelftools(path: str) -> None:
    fd, on_disk = open_elf(path)
    try:
        with open(path, "rb") as f:
            image = f.read()
        in_memory = ElfFile(image, path)
        assert on_disk.sections == in_memory.sections
        assert on_disk.segments == in_memory.segments
        assert on_disk.build_id() == in_memory.build_id() is not None
        text = on_disk.section(".text")
        assert text is not None and on_disk.data(text) == in_memory.data(text)
        with open(path, "rb") as f:
            peer = ELFFile(f)
            names = [(s.name, s["sh_offset"], s["sh_size"]) for s in peer.iter_sections()]
            loads = [(s["p_offset"], s["p_vaddr"]) for s in peer.iter_segments()
                     if s["p_type"] == "PT_LOAD"]  # fmt: skip
            nobits = {s.name for s in peer.iter_sections() if s["sh_type"] == "SHT_NOBITS"}
        assert [(s.name, s.offset, s.size) for s in on_disk.sections] == names
        assert [(p.offset, p.vaddr) for p in on_disk.loads()] == loads
        assert {s.name for s in on_disk.sections if s.type == SHT_NOBITS} == nobits
        assert all(p.type == PT_LOAD for p in on_disk.loads())
    finally:
        os.close(fd)


def test_notes_decode_build_id_and_stapsdt() -> None:
    def note(owner: bytes, kind: int, desc: bytes) -> bytes:
        name = owner + b"\0"
        pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
        return struct.pack("<III", len(name), len(desc), kind) + pad(name) + pad(desc)

    area = note(b"stapsdt", 3, b"\1" * 24 + b"p\0n\0-4@%edi\0") + note(b"GNU", 3, b"\xab\xcd")
    got = list(notes.iter_notes(area, "<"))
    assert [(n.owner, n.type) for n in got] == [(b"stapsdt", 3), (b"GNU", 3)]
    assert notes.build_id(area, "<") == "abcd"
    assert list(notes.iter_notes(area[:-3], "<"))[-1].owner == b"stapsdt"  # truncated: stops


def test_symbol_entries_refuse_a_name_outside_the_strings() -> None:
    entry, pos = layout(True, "<")
    fields = (pos[0], pos[1], pos[3], pos[4], pos[5])
    good = entry.pack(1, 0x12, 0, 1, 0x10, 4)
    table = SymbolTable(".symtab", good, b"\0f\0", entry, fields, array.array("H"))
    assert table.symbols() == [(0, "f", 0x10, 4, 2, 1, 0, 1)]
    assert table.function_ranges() == {(0x10, 4, "f")}
    bad = SymbolTable(".symtab", entry.pack(99, 0, 0, 0, 0, 0), b"\0f\0", entry, fields,
                      array.array("H"))  # fmt: skip
    with pytest.raises(SymbolFormatError, match="past the string table"):
        bad.symbols()


def test_corrupt_images_are_elf_errors() -> None:
    with open(LIBC, "rb") as f:
        image = f.read(1 << 16)  # the headers at the end are cut off
    with pytest.raises(ElfError, match="truncated or corrupt"):
        ElfFile(image, "cut")
    with pytest.raises(ElfError, match="not an ELF file"):
        ElfFile(b"\x7fELX" + bytes(60), "x")
    rng = random.Random(7)
    with open(os.path.realpath(sys.executable), "rb") as f:
        head = bytearray(f.read(4096))
    for _ in range(200):
        junk = bytearray(head)
        for _ in range(8):
            junk[rng.randrange(16, 64)] = rng.randrange(256)
        try:
            ElfFile(bytes(junk), "junk")
        except ElfError:
            pass  # anything else fails the test
