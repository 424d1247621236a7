"""Every error class of gfxbpf.bpf derives from GfxBpfError, in one category,
and keeps the builtin base callers already catch it by."""

from __future__ import annotations

import errno

import pytest

from gfxbpf.bpf.btf.facade import BtfError
from gfxbpf.bpf.errors import GfxBpfError, HostError, InputError, KernelError
from gfxbpf.bpf.link.attach import AttachError
from gfxbpf.bpf.link.tracefs import FormatError, TracefsError, TracepointNotFound
from gfxbpf.bpf.loader import LoadError
from gfxbpf.bpf.ringbuf import RingBufferError
from gfxbpf.bpf.specs import ObjectError, UnsupportedError
from gfxbpf.bpf.symbols import SymbolError
from gfxbpf.bpf.syscall import BpfError
from gfxbpf.catalog.entries import CatalogError, CatalogKeyError
from gfxbpf.catalog.instance import CatalogMismatch, FieldMissing, ParameterError, Unavailable

CASES = [
    (BtfError, ValueError, InputError),
    (SymbolError, ValueError, InputError),
    (ObjectError, ValueError, InputError),
    (UnsupportedError, ValueError, InputError),
    (CatalogError, ValueError, InputError),
    (CatalogKeyError, KeyError, InputError),
    (FormatError, ValueError, InputError),
    (LoadError, Exception, KernelError),
    (AttachError, OSError, KernelError),
    (RingBufferError, OSError, KernelError),
    (BpfError, OSError, KernelError),
    (TracefsError, OSError, HostError),
    (TracepointNotFound, OSError, HostError),
    (Unavailable, Exception, HostError),
    (FieldMissing, Exception, HostError),
    (ParameterError, ValueError, InputError),
    (CatalogMismatch, ValueError, InputError),
]


@pytest.mark.parametrize(("cls", "builtin", "category"), CASES, ids=lambda c: c.__name__)
def test_error_keeps_its_base_and_has_one_category(
    cls: type[Exception], builtin: type[Exception], category: type[GfxBpfError]
) -> None:
    assert issubclass(cls, builtin)
    assert issubclass(cls, category) and issubclass(cls, GfxBpfError)
    others = {InputError, KernelError, HostError} - {category}
    assert not any(issubclass(cls, o) for o in others)


def test_os_errors_still_carry_errno() -> None:
    e = BpfError(errno.EPERM, "BPF_PROG_LOAD")
    assert e.errno == errno.EPERM and e.command == "BPF_PROG_LOAD"
    assert "BPF_PROG_LOAD failed" in str(e)
    try:
        raise e
    except GfxBpfError as caught:
        assert caught is e
    a = AttachError(errno.ENOENT, "no such tracepoint")
    assert a.errno == errno.ENOENT and isinstance(a, KernelError)


def test_catalog_key_error_keeps_its_message() -> None:
    assert str(CatalogKeyError("no program 'x'")) == "no program 'x'"
