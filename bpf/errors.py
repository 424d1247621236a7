"""The one base of every error gfxbpf.bpf raises on purpose, and its categories.

Each error class in bpf/ keeps the builtin base it always had (ValueError,
OSError, KeyError...), so code that catches those still works, and also
derives from one category here, so a caller can catch "anything the loader
refused" with `except GfxBpfError` without also catching real bugs (a
KeyError or TypeError from a mistake in the code).
"""

from __future__ import annotations

__all__ = ["GfxBpfError", "InputError", "KernelError", "HostError"]


class GfxBpfError(Exception):
    """Base of every error gfxbpf.bpf raises on purpose."""


class InputError(GfxBpfError):
    """What bpf/ was given is malformed, unsupported or unknown.

    A BPF object, its BTF, the catalog, a tracefs format file, a symbol
    table, or a name that none of them holds.
    """


class KernelError(GfxBpfError):
    """The kernel refused a request (bpf(2), perf_event_open, mmap...)."""


class HostError(GfxBpfError):
    """Something this host lacks: tracefs, a tracepoint, a driver."""
