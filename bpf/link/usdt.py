"""USDT probes: `.note.stapsdt` notes of a binary, and the maps libbpf's usdt.bpf.h reads.

A program built with <bpf/usdt.bpf.h> (BPF_USDT) finds how to fetch each
argument in the `__bpf_usdt_specs` array map, by a spec id: the BPF cookie
of its uprobe (LINUX_HAS_BPF_COOKIE) or, on kernels without cookies, the
`__bpf_usdt_ip_to_spec_id` hash map keyed by the probe's address. This module
parses the notes (x86-64 argument syntax: "-4@%edi", "8@-16(%rbp)", "4@$5"),
encodes specs in the header's struct layout, fills both maps and attaches
one uprobe per probe site. Layout facts: libbpf's usdt.bpf.h and usdt.c.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from gfxbpf.bpf.errors import InputError
from gfxbpf.bpf.link import attach, bpflink
from gfxbpf.bpf.maps import Map
from gfxbpf.elf.notes import NT_STAPSDT, Note
from gfxbpf.elf.reader import ElfError, open_elf

NOTE_SECTION = ".note.stapsdt"
BASE_SECTION = ".stapsdt.base"
SPECS_MAP = "__bpf_usdt_specs"
IP_MAP = "__bpf_usdt_ip_to_spec_id"

ARG_CONST, ARG_REG, ARG_REG_DEREF = 0, 1, 2  # enum __bpf_usdt_arg_type
MAX_ARGS = 12  # BPF_USDT_MAX_ARG_CNT
_ARG_SPEC = struct.Struct("<QIh?b")  # val_off, arg_type, reg_off, arg_signed, arg_bitshift
_ARG_SPEC_SIZE = 16  # padded to its u64 alignment
SPEC_SIZE = 208  # args[12], u64 usdt_cookie at 192, short arg_cnt at 200, padded to 8

# Offsets of the registers in x86-64 struct pt_regs, by every name a note may use.
_PT_REGS = {
    ("rip",): 128,
    ("rax", "eax", "ax", "al"): 80,
    ("rbx", "ebx", "bx", "bl"): 40,
    ("rcx", "ecx", "cx", "cl"): 88,
    ("rdx", "edx", "dx", "dl"): 96,
    ("rsi", "esi", "si", "sil"): 104,
    ("rdi", "edi", "di", "dil"): 112,
    ("rbp", "ebp", "bp", "bpl"): 32,
    ("rsp", "esp", "sp", "spl"): 152,
    ("r8", "r8d", "r8w", "r8b"): 72,
    ("r9", "r9d", "r9w", "r9b"): 64,
    ("r10", "r10d", "r10w", "r10b"): 56,
    ("r11", "r11d", "r11w", "r11b"): 48,
    ("r12", "r12d", "r12w", "r12b"): 24,
    ("r13", "r13d", "r13w", "r13b"): 16,
    ("r14", "r14d", "r14w", "r14b"): 8,
    ("r15", "r15d", "r15w", "r15b"): 0,
}
REG_OFFSETS = {name: off for names, off in _PT_REGS.items() for name in names}

_ARG_RE = re.compile(
    r"^(?P<size>-?\d+)@(?:"
    r"\$(?P<const>-?(?:0x[0-9a-fA-F]+|\d+))"
    r"|%(?P<reg>[a-z0-9]+)"
    r"|(?P<off>-?(?:0x[0-9a-fA-F]+|\d+))?\(%(?P<base>[a-z0-9]+)\)"
    r")$"
)


class UsdtError(ValueError, InputError):
    """A binary, probe or argument gfxbpf cannot attach to (says which and why)."""


@dataclass(frozen=True)
class ArgSpec:
    val_off: int
    arg_type: int
    reg_off: int
    signed: bool
    bitshift: int


@dataclass(frozen=True)
class Probe:
    provider: str
    name: str
    pc: int  # link-time address of the probe's nop
    semaphore: int  # link-time address of its semaphore, 0 if none
    args: str
    file_offset: int = 0
    semaphore_offset: int = 0  # the semaphore's file offset (uprobe ref_ctr_offset)


def parse_arg(text: str) -> ArgSpec:
    """One x86-64 argument: SIZE@$CONST, SIZE@%REG or SIZE@OFF(%REG)."""
    m = _ARG_RE.match(text)
    if m is None:
        raise UsdtError(f"USDT argument {text!r}: unsupported syntax (SIB addressing?)")
    size = int(m["size"])
    if abs(size) not in (1, 2, 4, 8):
        raise UsdtError(f"USDT argument {text!r}: size {size} is not 1, 2, 4 or 8")
    shift, signed = 64 - abs(size) * 8, size < 0
    if m["const"] is not None:
        return ArgSpec(int(m["const"], 0) & (2**64 - 1), ARG_CONST, 0, signed, shift)
    reg = m["reg"] or m["base"]
    if reg not in REG_OFFSETS:
        raise UsdtError(f"USDT argument {text!r}: unknown register %{reg}")
    if m["reg"] is not None:
        return ArgSpec(0, ARG_REG, REG_OFFSETS[reg], signed, shift)
    off = int(m["off"], 0) if m["off"] else 0
    return ArgSpec(off & (2**64 - 1), ARG_REG_DEREF, REG_OFFSETS[reg], signed, shift)


def parse_args(text: str) -> list[ArgSpec]:
    args = [parse_arg(a) for a in text.split()]
    if len(args) > MAX_ARGS:
        raise UsdtError(f"USDT probe has {len(args)} arguments, more than {MAX_ARGS}")
    return args


def encode_spec(args: list[ArgSpec], cookie: int = 0) -> bytes:
    """struct __bpf_usdt_spec, as usdt.bpf.h declares it."""
    out = bytearray(SPEC_SIZE)
    for i, a in enumerate(args):
        _ARG_SPEC.pack_into(
            out, i * _ARG_SPEC_SIZE, a.val_off, a.arg_type, a.reg_off, a.signed, a.bitshift
        )
    struct.pack_into("<Qh", out, MAX_ARGS * _ARG_SPEC_SIZE, cookie, len(args))
    return bytes(out)


def _note_probes(notes: list[Note]) -> list[tuple[int, int, int, str, str, str]]:
    """(pc, base, semaphore, provider, name, args) of each stapsdt note."""
    out = []
    for note in notes:
        if note.owner != b"stapsdt" or note.type != NT_STAPSDT:
            continue
        desc = note.desc
        if len(desc) < 24:
            raise UsdtError("truncated .note.stapsdt entry")
        pc, base, sema = struct.unpack_from("<QQQ", desc)
        parts = desc[24:].split(b"\0")
        if len(parts) < 3:
            raise UsdtError("a .note.stapsdt entry lacks provider, name or arguments")
        prov, name, args = (p.decode("utf-8", "replace") for p in parts[:3])
        out.append((pc, base, sema, prov, name, args))
    return out


def read_probes(path: str) -> list[Probe]:
    """Every USDT probe of an ELF binary, with the file offset a uprobe takes."""
    try:
        fd, elf = open_elf(path)
    except ElfError as e:
        raise UsdtError(str(e)) from None
    try:
        notes = elf.notes(NOTE_SECTION)
    finally:
        os.close(fd)
    if not notes:
        return []
    base_sec = elf.section(BASE_SECTION)
    segments = elf.loads()

    def file_offset(addr: int, what: str) -> int:
        seg = next((s for s in segments if s.vaddr <= addr < s.vaddr + s.filesz), None)
        if seg is None:
            raise UsdtError(f"{path}: {what} at {addr:#x} is in no loadable segment")
        return int(addr - seg.vaddr + seg.offset)

    out = []
    for pc, base, sema, prov, name, args in _note_probes(notes):
        if base and base_sec is not None:  # prelinked: the notes' base moved with the text
            pc += base_sec.addr - base
        off = file_offset(pc, f"probe {prov}:{name}")
        sema_off = file_offset(sema, f"the semaphore of {prov}:{name}") if sema else 0
        out.append(Probe(prov, name, pc, sema, args, off, sema_off))
    return out


class UsdtAttachment(attach.Attachment):
    """The uprobes of one USDT probe's sites; close() detaches and frees the spec ids."""

    def __init__(self, description: str, specs: Map, spec_ids: list[int]) -> None:
        super().__init__(description)
        self.specs = specs
        self.spec_ids = spec_ids
        self.parts: list[attach.Attachment] = []

    def fds(self) -> list[int]:
        return [fd for p in self.parts for fd in p.fds()]

    def _detach(self) -> None:
        for p in self.parts:
            p.close()
        self.parts = []
        _free_ids(self.specs, self.spec_ids)


_IN_USE: dict[int, set[int]] = {}  # spec ids taken, by specs map fd


def _alloc_ids(specs: Map, n: int) -> list[int]:
    used = _IN_USE.setdefault(specs.fileno(), set())
    free = [i for i in range(specs.max_entries) if i not in used][:n]
    if len(free) < n:
        raise UsdtError(f"{SPECS_MAP} is full ({specs.max_entries} specs)")
    used.update(free)
    return free


def _free_ids(specs: Map, ids: Iterable[int]) -> None:
    _IN_USE.get(specs.fileno(), set()).difference_update(ids)


def has_probe(path: str, provider: str, name: str) -> bool:
    """Whether the binary at path has a site of USDT probe provider:name."""
    return any((p.provider, p.name) == (provider, name) for p in read_probes(os.path.abspath(path)))


def attach_usdt(
    prog_fd: int,
    specs: Map,
    path: str,
    provider: str,
    name: str,
    *,
    pid: int = -1,
    cookie: int = 0,
    ip_map: Map | None = None,
    multi: bool = False,
) -> UsdtAttachment:
    """Attach a BPF_USDT program to every site of provider:name in the binary at path.

    specs (and ip_map, for kernels without BPF cookies; only for non-PIE
    binaries here) are the object's `__bpf_usdt_specs` / `__bpf_usdt_ip_to_spec_id`
    maps. cookie is what bpf_usdt_cookie() returns. multi: one uprobe_multi
    link for all sites (CAP_BPF + CAP_PERFMON suffice; the program must be
    loaded with BPF_TRACE_UPROBE_MULTI), else one perf uprobe per site (the
    uprobe PMU wants CAP_SYS_ADMIN on recent kernels).
    """
    spath = os.path.abspath(path)
    if specs.value_size != SPEC_SIZE:
        raise UsdtError(f"{SPECS_MAP} holds {specs.value_size}-byte values, not {SPEC_SIZE}")
    sites = [p for p in read_probes(spath) if (p.provider, p.name) == (provider, name)]
    if not sites:
        raise UsdtError(f"{spath} has no USDT probe {provider}:{name}")
    ids = _alloc_ids(specs, len(sites))
    att = UsdtAttachment(f"usdt {spath}:{provider}:{name}", specs, ids)
    try:
        for site, spec_id in zip(sites, ids, strict=True):
            specs.update(spec_id, encode_spec(parse_args(site.args), cookie))
            if ip_map is not None and _is_exec(spath):
                ip_map.update(site.pc, struct.pack("<I", spec_id))
        if multi:
            att.parts.append(_attach_multi(prog_fd, spath, sites, ids, pid, att.description))
        else:
            att.parts += [
                _attach_one(prog_fd, spath, s, i, pid) for s, i in zip(sites, ids, strict=True)
            ]
    except BaseException:
        att.close()
        raise
    return att


def _attach_one(prog_fd: int, path: str, site: Probe, spec_id: int, pid: int) -> attach.Attachment:
    # A semaphore-guarded probe fires only while the kernel raises it (ref_ctr_offset).
    return attach.attach_uprobe(
        prog_fd,
        path,
        offset=site.file_offset,
        pid=pid,
        cookie=spec_id,
        ref_ctr_offset=site.semaphore_offset,
    )


def _attach_multi(
    prog_fd: int, path: str, sites: list[Probe], ids: list[int], pid: int, what: str
) -> attach.Attachment:
    try:
        fd = bpflink.link_create_uprobe_multi(
            prog_fd,
            path,
            [s.file_offset for s in sites],
            cookies=ids,
            pid=pid,
            ref_ctr_offsets=[s.semaphore_offset for s in sites],
        )
    except OSError as e:
        raise attach.AttachError(e.errno or errno.EINVAL, f"attaching {what}: {e}") from None
    return attach.LinkAttachment(what, fd)


def _is_exec(path: str) -> bool:
    """A non-PIE executable: its probes' addresses are the same in every process."""
    with open(path, "rb") as f:
        hdr = f.read(18)
    return len(hdr) == 18 and struct.unpack_from("<H", hdr, 16)[0] == 2  # ET_EXEC
