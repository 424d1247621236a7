"""Externs on the live kernel: .kconfig values, __ksym variables, kfunc calls.

tests/data/programs/externs.bpf.c declares each kind (typed_ksym.bpf.c a
typed ksym). gfxbpf must load it exactly as libbpf does (bpftool_compare.py:
same xlated code, same maps, "<obj>.kconfig" included), and the running
programs must see this kernel's config, version and symbol address.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from gfxbpf.bpf.externs import decls as externs
from gfxbpf.bpf.externs import kconfig
from gfxbpf.bpf.link import tracing
from gfxbpf.bpf.link.attach import attach_raw_tracepoint
from gfxbpf.bpf.loader import LoadError, load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf
from tests.kernel.bpftool_compare import LibbpfRefused, assert_loads_like_libbpf, ensure_bpffs

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"


def _build(tmp_path: Path, name: str = "externs") -> Path:
    return compile_bpf((SOURCES / f"{name}.bpf.c").read_text(), tmp_path, name)


def test_externs_load_like_libbpf(tmp_path: Path) -> None:
    path = _build(tmp_path)
    spec = ObjectSpec.from_file(str(path))
    assert {e.kind for e in spec.externs.values()} == {"kconfig", "ksym", "kfunc"}
    assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 2


def test_programs_read_this_kernels_values(tmp_path: Path) -> None:
    spec = ObjectSpec.from_file(str(_build(tmp_path)))
    spec.set_variable("target_tgid", os.getpid())
    config, _ = kconfig.running_config()
    with load(spec) as obj:
        with (
            attach_raw_tracepoint(obj.programs["kconfig_values"].fd, "sys_enter"),
            tracing.attach_btf_traced(obj.programs["ksyms"].fd, "tp_btf sys_enter"),
        ):
            os.getppid()
        out = obj.map("out")
        got = [struct.unpack("<Q", out.lookup(i))[0] for i in range(8)]
    assert got[0] == kconfig.kernel_version()
    assert got[1] == 1  # LINUX_HAS_BPF_COOKIE on 6.18
    assert got[2] == (1 if config.get("CONFIG_BPF_SYSCALL") == "y" else 0)
    assert got[3] == int(config.get("CONFIG_HZ", "0"))
    assert got[4] == {"y": 1, "m": 2}.get(config.get("CONFIG_BPF_JIT", "n"), 0)
    assert got[5] == 0  # an unset __weak option reads 0
    hostname = config.get("CONFIG_DEFAULT_HOSTNAME", '""').strip('"').encode()
    assert got[6].to_bytes(8, "little") == hostname[:8].ljust(8, b"\0")
    assert got[7] == externs.kallsyms_address("vfs_read")  # a typeless ksym: its address


def test_typed_ksym_gets_its_btf_id(tmp_path: Path) -> None:
    """The typed ksym's ld_imm64 carries the vmlinux VAR id; whether the kernel
    then finds its address depends on CONFIG_KALLSYMS_ALL (off on this VM)."""
    path = _build(tmp_path, "typed_ksym")
    spec = ObjectSpec.from_file(str(path))
    e = spec.externs["bpf_prog_active"]
    assert e.typed and externs.resolve_ksym(e) == ("btf_id", externs.kernel_btf_id(e))
    config, _ = kconfig.running_config()
    if config.get("CONFIG_KALLSYMS_ALL") == "y":
        assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 1
        return
    with pytest.raises(LoadError) as err:
        load(spec)
    assert "failed to find the address for kernel symbol 'bpf_prog_active'" in (err.value.log or "")
    with pytest.raises(LibbpfRefused):  # libbpf gets the same refusal
        assert_loads_like_libbpf(str(path), spec, ensure_bpffs())


def test_weak_kfuncs_resolve_or_drop_out_like_libbpf(tmp_path: Path) -> None:
    """`if (kfunc)`: a missing __weak kfunc loads as 0 and its call is dead code;
    a present one gets its BTF id. Same code as libbpf's; the program runs."""
    path = _build(tmp_path, "weak_kfunc")
    spec = ObjectSpec.from_file(str(path))
    missing = spec.externs["bpf_gfx_no_such_kfunc"]
    assert missing.weak and externs.resolve_ksym(missing) == ("btf_id", 0)
    assert assert_loads_like_libbpf(str(path), spec, ensure_bpffs()) == 1
    with load(spec) as obj:
        with tracing.attach_btf_traced(obj.programs["weak_kfuncs"].fd, "tp_btf"):
            os.getppid()
        seen = int.from_bytes(obj.map(".bss").lookup(0)[:8], "little")
    assert seen == 2
