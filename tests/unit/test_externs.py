"""Externs offline: .kconfig layout and encoding, kernel version, config parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfxbpf.bpf.btf.facade import Datasec, Var
from gfxbpf.bpf.externs import kconfig
from gfxbpf.bpf.externs.decls import ExternError, encode_kconfig
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import UnsupportedError
from tests.conftest import compile_bpf

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> ObjectSpec:
    tmp = tmp_path_factory.mktemp("externs")
    obj = compile_bpf((SOURCES / "externs.bpf.c").read_text(), tmp, "externs")
    return ObjectSpec.from_file(str(obj))


def test_kinds_and_weakness(spec: ObjectSpec) -> None:
    kinds = {n: (e.kind, e.weak) for n, e in spec.externs.items()}
    assert kinds["LINUX_KERNEL_VERSION"] == ("kconfig", False)
    assert kinds["CONFIG_HZ"] == ("kconfig", True)
    assert kinds["vfs_read"] == ("ksym", False)
    assert not spec.externs["vfs_read"].typed  # `const void`: an address
    assert kinds["bpf_rcu_read_lock"] == ("kfunc", False)


def test_kconfig_layout_is_libbpfs(spec: ObjectSpec) -> None:
    # Larger alignment first, then smaller size, then name.
    order = sorted(
        (e for e in spec.externs.values() if e.kind == "kconfig"), key=lambda e: e.offset
    )
    assert [e.name for e in order] == [
        "CONFIG_BPF_JIT",  # enum, 4 bytes
        "CONFIG_HZ",
        "LINUX_KERNEL_VERSION",
        "CONFIG_BPF_SYSCALL",  # bools, 1 byte
        "CONFIG_GFXBPF_NOT_AN_OPTION",
        "LINUX_HAS_BPF_COOKIE",
        "CONFIG_DEFAULT_HOSTNAME",  # char[16]
    ]
    assert [e.offset for e in order] == [0, 4, 8, 12, 13, 14, 15]
    m = spec.maps[".kconfig"]
    assert (m.name, m.value_size, m.freeze) == ("externs.kconfig", 31, True)


def test_kconfig_values_are_not_knobs(spec: ObjectSpec) -> None:
    with pytest.raises(ValueError, match="loader fills it from this kernel"):
        spec.set_variable("CONFIG_HZ", 100)


def test_btf_is_fixed_for_the_kernel(spec: ObjectSpec) -> None:
    assert spec.btf is not None
    for ds in spec.btf.datasecs():
        if ds.name in (".kconfig", ".ksyms"):
            assert isinstance(ds, Datasec) and ds.size > 0
            for si in ds.secinfos:
                var = spec.btf.type_by_id(si.type)
                assert isinstance(var, Var) and var.linkage == 1  # no extern linkage left


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("LINUX_KERNEL_VERSION", "397868", (397868).to_bytes(4, "little")),
        ("CONFIG_HZ", "0x100", (256).to_bytes(4, "little")),
        ("CONFIG_BPF_SYSCALL", "y", b"\x01"),
        ("CONFIG_BPF_SYSCALL", "m", b"\x01"),
        ("CONFIG_BPF_JIT", "m", (2).to_bytes(4, "little")),
        ("CONFIG_BPF_JIT", "n", (0).to_bytes(4, "little")),
        ("CONFIG_DEFAULT_HOSTNAME", '"(none)"', b"(none)".ljust(16, b"\0")),
        ("CONFIG_DEFAULT_HOSTNAME", '"' + "x" * 40 + '"', b"x" * 15 + b"\0"),
        ("CONFIG_HZ", None, bytes(4)),  # weak and unset: zero
    ],
)
def test_encode(spec: ObjectSpec, name: str, value: str | None, expected: bytes) -> None:
    assert spec.btf is not None
    assert encode_kconfig(spec.btf, spec.externs[name], value) == expected


@pytest.mark.parametrize(
    "name, value, why",
    [
        ("LINUX_KERNEL_VERSION", None, "not set in this kernel's config"),
        ("CONFIG_HZ", "fast", "not an integer"),
        ("CONFIG_BPF_JIT", "maybe", "not a tristate"),
    ],
)
def test_encode_refuses(spec: ObjectSpec, name: str, value: str | None, why: str) -> None:
    assert spec.btf is not None
    with pytest.raises(ExternError, match=why):
        encode_kconfig(spec.btf, spec.externs[name], value)


def test_kernel_version_and_config_parsing() -> None:
    assert kconfig.kernel_version("6.18.44-fc-v669") == (6 << 16) + (18 << 8) + 44
    assert kconfig.kernel_version("4.19.300") == (4 << 16) + (19 << 8) + 255  # patch capped
    assert kconfig.kernel_version("6.1") == (6 << 16) + (1 << 8)
    with pytest.raises(kconfig.KconfigError):
        kconfig.kernel_version("linux")
    text = '# comment\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C="s"\nCONFIG_D=0x10\n'
    assert kconfig.parse_config(text) == {"CONFIG_A": "y", "CONFIG_C": '"s"', "CONFIG_D": "0x10"}


def test_unknown_undefined_symbol_is_refused(tmp_path: Path) -> None:
    src = """#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
extern int not_an_extern_kind;
SEC("raw_tp/sys_enter") int p(void *ctx) { return not_an_extern_kind; }
"""
    obj = compile_bpf(src, tmp_path, "bad")
    with pytest.raises(
        UnsupportedError, match="neither a __kconfig or __ksym variable nor a kfunc"
    ):
        ObjectSpec.from_file(str(obj))


def test_inspect_shows_externs_and_how_they_resolve(
    spec: ObjectSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from gfxbpf.bpf.__main__ import main

    obj = compile_bpf((SOURCES / "externs.bpf.c").read_text(), tmp_path, "externs")
    assert main(["inspect", "--json", str(obj)]) == 0
    ext = json.loads(capsys.readouterr().out)["externs"]
    assert set(ext) == set(spec.externs)
    assert ext["LINUX_KERNEL_VERSION"]["value"] == str(kconfig.kernel_version())
    assert ext["LINUX_KERNEL_VERSION"]["from"] == "computed"
    assert ext["vfs_read"] == {
        "kind": "ksym",
        "weak": False,
        "typed": False,
        "resolves_to": "kernel address (from /proc/kallsyms)",
    }
    assert ext["bpf_rcu_read_lock"]["kind"] == "kfunc"
    assert main(["inspect", str(obj)]) == 0
    text = capsys.readouterr().out
    assert "externs (as they resolve on this kernel):" in text
    assert "CONFIG_GFXBPF_NOT_AN_OPTION  kconfig __weak" in text
