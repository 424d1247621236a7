"""The library a memory profile probes in its target: the C library the
process maps (host memory), or its libcuda (device memory, --cuda)."""

from __future__ import annotations

import os
import re
import subprocess

from gfxbpf.client import libcuda
from gfxbpf.client.errors import UsageError

# glibc's libc.so.6 (Debian, RHEL), and a versioned libc-2.31.so of older builds.
_LIBC = re.compile(r"libc(\.so\.\d+|-\d+\.\d+\.so)$")


def is_libc(path: str) -> bool:
    return bool(_LIBC.fullmatch(os.path.basename(path)))


def find_libc(pid: int) -> str:
    """The C library process pid maps (a COMMAND held before its exec maps
    gfxclient's own, which a dynamically linked COMMAND loads too)."""
    for mapped in libcuda.mapped_files(pid):
        if is_libc(mapped):
            return mapped
    raise UsageError(
        f"process {pid} maps no C library (libc.so.6): a statically linked program's "
        "allocations cannot be probed"
    )


def find_cuda(pid: int, children: bool, held: bool) -> str:
    """The libcuda of process pid (or, with children, of a descendant); a COMMAND
    held before its exec has none yet: the one the dynamic loader would load."""
    if not held:
        return libcuda.find_libcuda_in_tree(pid, children)
    path = _ldconfig_libcuda()
    if path is None:
        raise UsageError(
            "--memory --cuda: the dynamic loader knows no libcuda.so.1 (ldconfig -p), so "
            "the one COMMAND will load cannot be known before it runs: profile it with "
            "--pid PID once it has initialised CUDA"
        )
    return path


def _ldconfig_libcuda() -> str | None:
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.stdout.splitlines():
            name, _, path = line.strip().partition(" => ")
            if name.startswith("libcuda.so.1 ") and "x86-64" in name:
                return path.strip()
    return None
