"""elf/relocatable.py, the BPF objects' reader on pyelftools: what it reads
agrees with the bytes and with pyelftools' own view of the tables; corrupt
ranges, names and entries are ElfErrors (pyelftools alone would read short);
a compressed section is passed through as stored; and pyelftools stays out
of a process until an object is read."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import ObjectError
from gfxbpf.elf.reader import ElfError
from gfxbpf.elf.relocatable import read_relocatable

OBJECT = Path(__file__).resolve().parents[2] / "catalog" / "programs" / "syscount.bpf.o"
SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr


def _image() -> bytes:
    return OBJECT.read_bytes()


def _shdr_at(image: bytes, index: int) -> int:
    shoff, = struct.unpack_from("<Q", image, 0x28)  # fmt: skip
    return shoff + index * SHDR.size


def _patch(image: bytes, index: int, field: int, value: int) -> bytes:
    """The image with one field of section index's header replaced."""
    at = _shdr_at(image, index)
    row = list(SHDR.unpack_from(image, at))
    row[field] = value
    out = bytearray(image)
    SHDR.pack_into(out, at, *row)
    return bytes(out)


def test_sections_symbols_and_relocations_match_the_bytes() -> None:
    image = _image()
    obj = read_relocatable(image, "syscount")
    assert obj.machine == 247 and obj.is64 and obj.little_endian
    for sec in obj.sections[1:]:
        raw = SHDR.unpack_from(image, _shdr_at(image, sec.index))
        assert (sec.type, sec.offset, sec.size, sec.link, sec.info) == (
            raw[1], raw[4], raw[5], raw[6], raw[7])  # fmt: skip
        if sec.type != 8:  # NOBITS has no bytes
            assert sec.data == image[sec.offset : sec.offset + sec.size]
    symtab = next(s for s in obj.sections if s.type == 2)
    assert len(obj.symbols) == symtab.size // 24 and obj.symbols[0][1] == ""
    with open(OBJECT, "rb") as f:  # pyelftools' own view of the tables
        peer = ELFFile(f)
        symbols = [(s.name, s["st_value"], s["st_size"]) for s in peer.get_section_by_name(
            ".symtab").iter_symbols()]  # fmt: skip
        rels = {s.name: [(r["r_offset"], r["r_info_sym"], r["r_info_type"])
                         for r in s.iter_relocations()]
                for s in peer.iter_sections() if s["sh_type"] == "SHT_REL"}  # fmt: skip
    assert [(s[1], s[2], s[3]) for s in obj.symbols] == symbols
    assert {s.name: obj.rels(s) for s in obj.sections if s.type == 9} == rels and rels


def test_a_section_past_the_end_is_an_error() -> None:
    image = _image()
    text = next(s for s in read_relocatable(image, "x").sections if s.size and s.type == 1)
    bad = _patch(image, text.index, 4, len(image) - 4)  # sh_offset
    with pytest.raises(ElfError, match="runs past the end"):
        read_relocatable(bad, "x")
    with pytest.raises(ObjectError, match="runs past the end"):
        ObjectSpec.parse(bad, "x")


def test_a_symbol_name_past_the_strings_is_an_error() -> None:
    image = bytearray(_image())
    symtab = next(s for s in read_relocatable(bytes(image), "x").sections if s.type == 2)
    struct.pack_into("<I", image, symtab.offset + 24, 1 << 30)  # symbol #1's st_name
    with pytest.raises(ObjectError, match="symbol #1: name offset .* past the string table"):
        ObjectSpec.parse(bytes(image), "x")


def test_a_partial_relocation_entry_is_an_error() -> None:
    image = _image()
    rel = next(s for s in read_relocatable(image, "x").sections if s.type == 9)
    with pytest.raises(ObjectError, match="partial entry"):
        ObjectSpec.parse(_patch(image, rel.index, 5, rel.size - 3), "x")  # sh_size


def test_a_compressed_section_is_passed_through_not_inflated() -> None:
    image = _image()
    sec = next(s for s in read_relocatable(image, "x").sections if s.name == ".BTF")
    got = read_relocatable(_patch(image, sec.index, 2, sec.flags | 0x800), "x")  # SHF_COMPRESSED
    assert got.sections[sec.index].data == sec.data


def test_random_corruption_is_an_object_error_and_nothing_else() -> None:
    image = _image()
    shoff = _shdr_at(image, 0)
    rng = random.Random(11)
    for _ in range(150):
        junk = bytearray(image)
        for _ in range(6):
            junk[rng.randrange(shoff, len(junk))] = rng.randrange(256)
        try:
            ObjectSpec.parse(bytes(junk), "junk")
        except ObjectError:
            pass  # anything else fails the test


def test_pyelftools_is_imported_only_when_an_object_is_read() -> None:
    code = (
        "import sys, gfxbpf.bpf.object, gfxbpf.elf.relocatable, gfxbpf.bpf.mapids; "
        "print('elftools' in sys.modules); "
        f"gfxbpf.bpf.object.ObjectSpec.from_file({str(OBJECT)!r}); "
        "print('elftools' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
