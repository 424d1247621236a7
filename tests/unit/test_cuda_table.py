"""The cuda function table against the gcc-built libcuda stand-in, its cookies,
and the client's side: finding libcuda in a memory map, per-process figures."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench import cuda_standin as cs
from gfxbpf.bpf import symbols
from gfxbpf.catalog import cuda_api, function_tables, memory_api
from gfxbpf.catalog import entries as catalog
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.client import libcuda
from gfxbpf.client.cli import connecting, cuda_view
from gfxbpf.client.errors import UsageError
from gfxbpf.client.mapdata import MapData

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the stand-in")


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the stand-in")
    tmp = tmp_path_factory.mktemp("cudalib")
    return {
        "new": cs.build_library(tmp / "new"),
        "old": cs.build_library(tmp / "old", old_driver=True),
    }


def test_table_is_well_formed() -> None:
    names = [f.name for f in cuda_api.FUNCTIONS]
    assert len(names) == len(set(names)) <= function_tables.MAX_TABLE
    for f in cuda_api.FUNCTIONS:
        if f.role == "copy":
            assert f.direction in cuda_api.DIRECTIONS and f.arg != function_tables.NO_ARG
        elif f.role in ("alloc", "free"):
            assert f.arg != function_tables.NO_ARG and not f.direction
        else:
            assert f.arg == function_tables.NO_ARG
    assert load_catalog().get("cuda").function_table == "cuda"
    assert catalog.function_table("cuda") is cuda_api.FUNCTIONS


def test_cookie_packs_index_role_and_argument() -> None:
    i = cuda_api.index_of("cuMemcpyPeerAsync")
    c = function_tables.cookie(i, cuda_api.FUNCTIONS[i])
    assert (c & 0xFF, c >> 8 & 0xFF, c >> 16 & 0xFF) == (i, function_tables.ROLES["copy"], 4)
    with pytest.raises(ValueError):
        function_tables.cookie(64, cuda_api.FUNCTIONS[0])


def test_roles_match_the_bpf_programs() -> None:
    """Every role is numbered as the programs that take it number it (cuda,
    memstacks), and each program's roles are the table's."""
    programs = Path(__file__).resolve().parents[2] / "catalog/programs"
    defined: dict[str, int] = {}
    for name in ("cuda", "memstacks"):
        src = (programs / f"{name}.bpf.c").read_text()
        roles = {m[0].lower(): int(m[1]) for m in re.findall(r"#define ROLE_(\w+) (\d+)", src)}
        assert all(function_tables.ROLES[r] == n for r, n in roles.items()), name
        defined.update(roles)
    assert defined == function_tables.ROLES


@needs_gcc
def test_every_table_function_resolves_in_the_standin(libs: dict[str, Path]) -> None:
    idx = symbols.index_for(libs["new"])
    for f in cuda_api.FUNCTIONS:
        assert idx.offset(f.name) > 0, f.name
    device = [f.name for i, f in enumerate(memory_api.FUNCTIONS) if memory_api.is_device(i)]
    for name in device:  # memstacks' device memory functions (--memory --cuda)
        assert idx.offset(name) > 0, name
    # ... and the stand-in exports no cu* function the tables lack.
    exported = {n for n in idx.names() if n.startswith("cu")}
    assert exported == {f.name for f in cuda_api.FUNCTIONS} | set(device)


@needs_gcc
def test_old_driver_lacks_exactly_the_variants(libs: dict[str, Path]) -> None:
    idx = symbols.index_for(libs["old"])
    lacking = {f.name for f in cuda_api.FUNCTIONS if not idx.has(f.name)}
    assert lacking == cs.OLD_DRIVER_LACKS and "cuLaunchKernel" not in lacking


def test_truth_of_the_script() -> None:
    t = cs.truth(cs.SCRIPT)
    mib = 1 << 20
    assert (t.live, t.peak, t.allocs, t.frees, t.errors) == (8 * mib, 9 * mib, 5, 3, 1)
    assert t.bytes_by_direction["htod"] == 7 * 4096 + 3 * 1000  # the failed copy is not counted
    assert t.calls["cuMemcpyHtoD_v2"] == 8
    old = cs.truth(cs.SCRIPT, absent=cs.OLD_DRIVER_LACKS)
    assert "cuLaunchKernel_ptsz" not in old.calls and old.bytes_by_direction["dtoh"] == 5 * 2048


MAPS = """\
55d0c000-55d0d000 r--p 00000000 08:01 1 /usr/bin/python3.12
7f00-7f01 r-xp 00000000 08:01 2 /opt/torch/nvidia/cu13/lib/libcudart.so.13
7f02-7f03 r-xp 00000000 08:01 3 /usr/local/nvidia/lib64/libcuda.so.580.159.04
7f04-7f05 rw-p 00000000 00:00 0 [heap]
"""


def test_find_libcuda_in_maps(tmp_path: Path) -> None:
    m = tmp_path / "maps"
    m.write_text(MAPS)
    assert libcuda.find_libcuda(1, str(m)) == "/usr/local/nvidia/lib64/libcuda.so.580.159.04"
    m.write_text("\n".join(ln for ln in MAPS.splitlines() if "libcuda.so" not in ln))
    with pytest.raises(UsageError, match="has no libcuda mapped"):
        libcuda.find_libcuda(1, str(m))  # libcudart is not the driver
    m.write_text("7f02-7f03 r-xp 0 08:01 3 /usr/lib/libcuda.so.1 (deleted)\n")
    with pytest.raises(UsageError, match="replaced since it was loaded"):
        libcuda.find_libcuda(1, str(m))
    with pytest.raises(UsageError, match="no process 7"):
        libcuda.find_libcuda(7, str(tmp_path / "absent"))


def test_processes_sum_by_role_and_direction() -> None:
    launch, htod = cuda_api.index_of("cuLaunchKernel"), cuda_api.index_of("cuMemcpyHtoD_v2")
    sync = cuda_api.index_of("cuCtxSynchronize")
    snap = {
        "calls": MapData("calls", entries=[
            ({"tgid": 5, "function": launch}, 7), ({"tgid": 5, "function": htod}, 2),
            ({"tgid": 6, "function": sync}, 1), ({"tgid": 6, "function": 99}, 1),
        ]),
        "bytes": MapData("bytes", entries=[({"tgid": 5, "function": htod}, 8192)]),
        "time_ns": MapData("time_ns", entries=[({"tgid": 6, "function": sync}, 5000)]),
        "memory": MapData("memory", show="table", entries=[
            (5, {"live": 10, "peak": 20, "allocs": 2, "frees": 1, "untracked": 0}),
        ]),
    }  # fmt: skip
    views = {pid: v.summary() for pid, v in cuda_view.processes(snap).items()}
    assert views[5]["launches"] == 7
    assert views[5]["copies"]["htod"] == {"calls": 2, "bytes": 8192}
    assert views[5]["memory"]["peak"] == 20
    assert views[6]["sync_ns"] == 5000 and views[6]["sync_calls"] == 1
    assert views[6]["launches"] == 0  # index 99 is no table function: ignored


def test_dump_keys_name_the_function() -> None:
    i = cuda_api.index_of("cuMemAlloc_v2")
    assert cuda_view.key_text({"tgid": 7, "function": i}) == "tgid=7, function=cuMemAlloc_v2"
    assert cuda_view.key_text({"function": i, "slot": 3}) == "slot=3, function=cuMemAlloc_v2"
    assert cuda_view.key_text(7) == "7"
    assert cuda_view.key_text(str(i)) == "cuMemAlloc_v2"  # a histogram label


def test_cli_names_the_cuda_program_as_the_view_does() -> None:
    # gfxclient imports cuda_view only when the program is this one.
    assert connecting.CUDA_PROGRAM == libcuda.PROGRAM
