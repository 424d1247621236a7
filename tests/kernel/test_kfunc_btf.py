"""A kfunc declared as libbpf-tools declares it loads with its BTF, as libbpf loads it.

tests/data/programs/task_kfunc.bpf.c calls `bpf_task_from_pid`, whose BTF
prototype leaves its parameter unnamed. The kernel checks a global FUNC's
parameters by name and refuses such BTF ("Invalid arg#1"); libbpf names
them before BPF_BTF_LOAD, and so must gfxbpf (externs.fix_ksyms_btf): the
BTF is accepted and the programs are identical to libbpf's (subprogram names
and line info included). BTF the kernel still refuses is a clear error, not
a load without BTF.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gfxbpf.bpf.btf.kinds import Func, FuncProto
from gfxbpf.bpf.externs import decls as externs
from gfxbpf.bpf.loader import LoadError, load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf
from tests.kernel.bpftool_compare import assert_loads_like_libbpf, ensure_bpffs

SOURCE = Path(__file__).resolve().parents[1] / "data" / "programs" / "task_kfunc.bpf.c"


@pytest.fixture(scope="module")
def obj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_bpf(SOURCE.read_text(), tmp_path_factory.mktemp("kfunc"), "task_kfunc")


def _kfunc_proto(spec: ObjectSpec) -> FuncProto:
    assert spec.btf is not None
    tid = spec.btf.find("bpf_task_from_pid")
    assert tid is not None
    f = spec.btf.type_by_id(tid)
    assert isinstance(f, Func)
    proto = spec.btf.type_by_id(f.type)
    assert isinstance(proto, FuncProto)
    return proto


def test_unnamed_kfunc_parameters_are_named_as_libbpf_names_them(obj_path: Path) -> None:
    spec = ObjectSpec.from_file(str(obj_path))
    assert spec.externs["bpf_task_from_pid"].kind == "kfunc"
    assert [p.name for p in _kfunc_proto(spec).params] == ["dummy_ksym"]


def test_kfunc_object_loads_with_btf_like_libbpf(obj_path: Path) -> None:
    spec = ObjectSpec.from_file(str(obj_path))
    with load(spec) as obj:
        assert obj.btf_fd >= 0 and obj.btf_error is None
    assert assert_loads_like_libbpf(str(obj_path), spec, ensure_bpffs()) == 1


def test_unsanitized_kfunc_btf_is_a_clear_error(
    obj_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the naming, the kernel refuses the BTF: the load fails, saying why."""
    monkeypatch.setattr(externs, "_name_params", lambda *_a: None)
    spec = ObjectSpec.from_file(str(obj_path))
    assert [p.name for p in _kfunc_proto(spec).params] == [""]
    with pytest.raises(LoadError) as e:
        load(spec)
    assert "the kernel refused the object's BTF" in str(e.value)
    assert "Invalid arg#1" in str(e.value)  # the kernel's reason, from its BTF log
    with load(spec, allow_no_btf=True) as obj:  # only when explicitly allowed
        assert obj.btf_fd == -1 and obj.btf_error is not None
