"""BTF with kinds an older kernel refuses, rewritten as libbpf rewrites it, loads here.

This kernel accepts every kind, so the test says which ones to treat as
missing: the rewritten BTF must contain none of them, be accepted by
BPF_BTF_LOAD, and the object must load with it exactly as libbpf loads the
original (bpftool_compare.py). The probes themselves must find nothing
missing on this kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfxbpf.bpf import loader
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf import sanitize as btf_sanitize
from gfxbpf.bpf.btf.kinds import KIND_DECL_TAG, KIND_ENUM64, KIND_FLOAT, KIND_TYPE_TAG
from gfxbpf.bpf.kernel.btfprobe import missing_features
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf
from tests.kernel.bpftool_compare import assert_loads_like_libbpf, ensure_bpffs

SOURCE = Path(__file__).resolve().parents[1] / "data" / "programs" / "btf_kinds.bpf.c"
ALL = frozenset(btf_sanitize.FEATURES)
REFUSED_KINDS = {KIND_FLOAT, KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64}
# Debian 12's clang 14 writes a 64-bit enum as an 8-byte ENUM, not ENUM64:
# ENUM64's rewrite is covered offline (tests/unit/test_btf_sanitize.py).
IN_OBJECT = {KIND_FLOAT, KIND_DECL_TAG, KIND_TYPE_TAG}


@pytest.fixture(scope="module")
def obj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_bpf(SOURCE.read_text(), tmp_path_factory.mktemp("kinds"), "btf_kinds")


def test_this_kernel_accepts_every_probed_kind() -> None:
    assert missing_features() == frozenset()


def test_sanitized_btf_is_accepted_by_the_kernel(obj_path: Path) -> None:
    spec = ObjectSpec.from_file(str(obj_path))
    assert spec.btf is not None
    kinds = {t.kind for t in spec.btf.types}
    assert IN_OBJECT <= kinds  # the object really has them
    assert btf_sanitize.needs_sanitizing(spec.btf, ALL)
    out = btf_sanitize.sanitize(spec.btf, ALL)
    assert not REFUSED_KINDS & {t.kind for t in out.types}
    placeholder = 1 if KIND_ENUM64 in kinds else 0  # enum64_placeholder, once
    assert len(out.types) == len(spec.btf.types) + placeholder
    fd = bpfsys.btf_load(out.to_bytes())
    os.close(fd)


def test_object_loads_with_sanitized_btf_like_libbpf(
    obj_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "missing_features", lambda: ALL)
    spec = ObjectSpec.from_file(str(obj_path))
    with loader.load(spec) as obj:
        assert obj.btf_fd >= 0 and obj.btf_error is None
    assert assert_loads_like_libbpf(str(obj_path), spec, ensure_bpffs()) == 1
