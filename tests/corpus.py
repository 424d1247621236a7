"""The conformance corpus: BPF objects embedded in Debian's libbpf-tools binaries.

Each libbpf-tools binary is a libbpf skeleton: its whole BPF ELF object sits
inside the executable as bytes. This module finds those images (an ELF header
whose e_machine is EM_BPF) at test time, so no third-party object is ever
committed here.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass

EM_BPF = 247
_ELF_MAGIC = b"\x7fELF"
# e_ident (16) e_type e_machine e_version e_entry e_phoff e_shoff e_flags
# e_ehsize e_phentsize e_phnum e_shentsize e_shnum e_shstrndx
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SHT_NOBITS = 8


@dataclass(frozen=True)
class EmbeddedObject:
    tool: str  # the binary's basename
    index: int  # nth BPF image in that binary
    data: bytes

    @property
    def name(self) -> str:
        """libbpf-style object name: the tool, numbered when a binary holds several."""
        return self.tool if self.index == 0 else f"{self.tool}{self.index}"


def _image_size(blob: bytes, at: int) -> int | None:
    """The length of the BPF ELF image starting at `at`, or None if it is not one."""
    if at + _EHDR.size > len(blob):
        return None
    (
        ident,
        _typ,
        machine,
        _ver,
        _entry,
        _phoff,
        shoff,
        _fl,
        ehsize,
        _pe,
        _pn,
        shentsize,
        shnum,
        _,
    ) = _EHDR.unpack_from(blob, at)
    # 64-bit (class 2), little-endian (data 1), BPF machine, sane headers.
    if ident[4] != 2 or ident[5] != 1 or machine != EM_BPF or ehsize != _EHDR.size:
        return None
    if shentsize != _SHDR.size or not shnum or shnum > 65535:
        return None
    end = shoff + shnum * shentsize
    if at + end > len(blob):
        return None
    for i in range(shnum):
        fields = _SHDR.unpack_from(blob, at + shoff + i * shentsize)
        sh_type, sh_offset, sh_size = fields[1], fields[4], fields[5]
        if sh_type != _SHT_NOBITS:
            end = max(end, sh_offset + sh_size)
    return end if at + end <= len(blob) else None


def extract_bpf_objects(blob: bytes, tool: str = "obj") -> list[EmbeddedObject]:
    """Every embedded BPF ELF image in `blob` (an executable's bytes), in file order."""
    out: list[EmbeddedObject] = []
    at = blob.find(_ELF_MAGIC, 1)  # offset 0 is the executable's own header
    while at >= 0:
        size = _image_size(blob, at)
        if size is not None:
            out.append(EmbeddedObject(tool, len(out), blob[at : at + size]))
            at = blob.find(_ELF_MAGIC, at + size)
        else:
            at = blob.find(_ELF_MAGIC, at + 1)
    return out


def libbpf_tools_binaries() -> list[str]:
    """The executables Debian's libbpf-tools installs (symlinked aliases once)."""
    r = subprocess.run(["dpkg", "-L", "libbpf-tools"], capture_output=True, text=True)
    if r.returncode != 0:
        return []
    seen: set[str] = set()
    out: list[str] = []
    for path in r.stdout.split():
        if "/bin/" not in path and "/sbin/" not in path:
            continue
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return sorted(out)


def corpus() -> list[EmbeddedObject]:
    """Every BPF object embedded in the installed libbpf-tools binaries."""
    out: list[EmbeddedObject] = []
    for path in libbpf_tools_binaries():
        with open(path, "rb") as f:
            out += extract_bpf_objects(f.read(), os.path.basename(path))
    return out
