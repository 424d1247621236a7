"""Crafted ELF files for the attacks on an administrator's client (issue 35
items 2 to 4): a small x86-64 shared object, built byte by byte, whose
.eh_frame says what the attacker wants. Its one function at CODE_OFFSET
spins rdi times (`dec %rdi; jnz; ret`), so a process that maps the file
executable and calls it is sampled inside the crafted table.
"""

from __future__ import annotations

import struct

CODE_OFFSET = 0x1000
SPIN = bytes.fromhex("48ffcf75fbc3")  # 1: dec %rdi; jnz 1b; ret
_EH_OFFSET = 0x2000
# CIE: version 1, "zR", code align 1, data align -8, RA r16, FDEs absolute
# udata4 (0x03); CFA = rsp + 8, RA at CFA - 8.
_CIE_BODY = b"\0\0\0\0" + b"\x01zR\0" + b"\x01\x78\x10" + b"\x01\x03" + b"\x0c\x07\x08\x90\x01"


def _entry(body: bytes) -> bytes:
    body += b"\0" * (-(len(body) + 4) % 4)  # DW_CFA_nop padding to 4 bytes
    return struct.pack("<I", len(body)) + body


def eh_frame(fdes: list[tuple[int, int, bytes]]) -> bytes:
    """One CIE, then an FDE (start, size, instructions) each, then the terminator."""
    out = bytearray(_entry(_CIE_BODY))
    for start, size, code in fdes:
        # CIE pointer: from this field back to the CIE at offset 0.
        out += _entry(struct.pack("<III", len(out) + 4, start, size) + b"\0" + code)
    return bytes(out) + b"\0\0\0\0"


def many_fdes(n: int) -> list[tuple[int, int, bytes]]:
    """n small FDEs, each with instructions of its own (nothing to share)."""
    out = []
    for i in range(n):
        # advance_loc4 by i, def_cfa_offset 16: a distinct row per FDE
        code = b"\x04" + struct.pack("<I", i % 0xFFFF + 1) + b"\x0e\x10"
        out.append((CODE_OFFSET + 16 + 4 * i, 4, code))
    return out


def shared_object(eh: bytes, debuglink: str | None = None) -> bytes:
    """The whole file: ELF header, one R+X PT_LOAD of everything, the code,
    .eh_frame (no .eh_frame_hdr), .gnu_debuglink if given, section headers."""
    sections: list[tuple[str, int, int, bytes]] = [  # name, type, flags, contents
        (".text", 1, 0x6, SPIN),
        (".eh_frame", 1, 0x2, eh),
    ]
    if debuglink is not None:
        name = debuglink.encode() + b"\0"
        name += b"\0" * (-len(name) % 4)
        sections.append((".gnu_debuglink", 1, 0, name + struct.pack("<I", 0)))
    names = b"\0" + b"".join(s[0].encode() + b"\0" for s in sections) + b".shstrtab\0"
    body = bytearray(b"\0" * CODE_OFFSET)
    placed = []
    for name, typ, flags, data in sections:
        at = _EH_OFFSET if name == ".eh_frame" else len(body)
        body += b"\0" * (at - len(body))
        placed.append((names.index(name.encode() + b"\0"), typ, flags, at, data))
        body += data
    strtab_at = len(body)
    body += names
    shoff = len(body) + (-len(body) % 8)
    body += b"\0" * (shoff - len(body))
    shdr = struct.Struct("<IIQQQQIIQQ")
    body += b"\0" * shdr.size
    for name_at, typ, flags, at, data in placed:
        body += shdr.pack(name_at, typ, flags, at, at, len(data), 0, 0, 1, 0)
    body += shdr.pack(names.index(b".shstrtab\0"), 3, 0, 0, strtab_at, len(names), 0, 0, 1, 0)
    shnum = len(placed) + 2
    size = len(body)
    ehdr = struct.pack(
        "<4sBBBB8xHHIQQQIHHHHHH",
        b"\x7fELF", 2, 1, 1, 0,  # 64-bit, little-endian, version 1, System V
        3, 62, 1, 0, 64, shoff,  # ET_DYN, x86-64, version, entry, phoff, shoff
        0, 64, 56, 1, shdr.size, shnum, shnum - 1,
    )  # fmt: skip
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, size, size, 0x1000)  # PT_LOAD, R+X
    body[: len(ehdr) + len(phdr)] = ehdr + phdr
    return bytes(body)


def symbol_bomb(n: int, name_bytes: int) -> bytes:
    """A file whose .symtab names n functions, each at a different offset of
    one name_bytes-long string: decoded one by one they take about
    n * name_bytes / 2 bytes of memory (the file: n * 24 + name_bytes)."""
    base = shared_object(eh_frame([]))
    strtab = b"\0" + b"A" * name_bytes + b"\0"
    sym = struct.Struct("<IBBHQQ")
    step = max(name_bytes // n, 1)
    entries = sym.pack(0, 0, 0, 0, 0, 0) + b"".join(
        sym.pack(1 + (i * step) % name_bytes, 0x12, 0, 1, CODE_OFFSET, 6) for i in range(n)
    )  # STB_GLOBAL | STT_FUNC, in section 1 (.text)
    return _with_sections(base, [(".symtab", 2, entries, sym.size), (".strtab", 3, strtab, 0)])


def _with_sections(elf: bytes, extra: list[tuple[str, int, bytes, int]]) -> bytes:
    """elf (as shared_object writes it) with more sections appended: a new
    section name table, the old headers copied, .symtab linked to the next."""
    shdr = struct.Struct("<IIQQQQIIQQ")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", elf, 0x3C)
    old = [list(shdr.unpack_from(elf, shoff + i * shdr.size)) for i in range(shnum)]
    names_at, names_size = old[shstrndx][4], old[shstrndx][5]
    names = elf[names_at : names_at + names_size]
    body = bytearray(elf[:shoff])
    rows = old[:shstrndx]
    for name, typ, data, entsize in extra:
        at = len(body) + (-len(body) % 8)
        body += b"\0" * (at - len(body)) + data
        link = len(rows) + 1 if typ == 2 else 0  # .symtab -> the .strtab after it
        rows.append([len(names), typ, 0, 0, at, len(data), link, 1, 8, entsize])
        names += name.encode() + b"\0"
    names_row = [len(names), 3, 0, 0, len(body), 0, 0, 0, 1, 0]
    names += b".shstrtab\0"
    names_row[5] = len(names)
    body += names
    rows.append(names_row)
    new_shoff = len(body) + (-len(body) % 8)
    body += b"\0" * (new_shoff - len(body))
    for r in rows:
        body += shdr.pack(*r)
    struct.pack_into("<Q", body, 0x28, new_shoff)
    struct.pack_into("<HH", body, 0x3C, len(rows), len(rows) - 1)
    return bytes(body)
