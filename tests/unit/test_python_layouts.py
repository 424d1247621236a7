"""catalog/python/layouts.py against CPython's own headers and binaries.

- The host's headers (python3-dev, which tools/setup.sh installs) are measured
  again with tools/python_layouts.py (gcc, -DPy_BUILD_CORE, offsetof) and must
  give that release's entry exactly; so must pyenv's headers where this
  machine has them, and the headers in GFXBPF_PYTHON_ROOTS chroots.
- For 3.13+, the _Py_DebugOffsets CPython compiled into a real binary (pyenv's
  libpython3.13, the chroots' python3.13/3.14/3.15, the host's python3 on Debian 13)
  must agree with the table.
- The free-threaded build of tools/python_freethreaded.sh, where this machine
  has it (its cache): its headers with its pyconfig.h give the FREE_THREADED
  entry, and its binary's _Py_DebugOffsets agree with that entry.
These prove the numbers are the headers' numbers for the releases measured
here; a different patch release is covered only by the debug-offsets check
(3.13+) and the live walks (tests/unit/test_python_live_walk.py).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gfxbpf.catalog.python import debug_offsets as debug_table
from gfxbpf.catalog.python.layouts import (
    FREE_THREADED,
    LAYOUTS,
    NONE,
    PyLayout,
    all_layouts,
    layout_for,
)
from gfxbpf.client.profiles.python.discover import debug_offsets, python_file
from gfxbpf.client.profiles.python.strings import STATE_BITS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import python_layouts  # noqa: E402

ROOTS = [r for r in os.environ.get("GFXBPF_PYTHON_ROOTS", "").split(":") if r]
PYENV = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
# tools/python_freethreaded.sh's cache: Python-X.Y.Z/Include and build/{pyconfig.h,python}
FT_CACHE = os.environ.get("GFXBPF_PYFT_CACHE", "/var/cache/gfxbpf/python3.13t")
FT_BUILT = os.path.isfile(os.path.join(FT_CACHE, "build", "python"))


def _host_include() -> str:
    out = subprocess.run(
        ["/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _includes() -> list[str]:
    found = [_host_include()]
    found += sorted(glob.glob(os.path.join(PYENV, "versions/3.*/include/python3.*")))
    for root in ROOTS:
        found += sorted(glob.glob(os.path.join(root, "usr/include/python3.*")))
    return [d for d in found if python_layouts.header_version(d) in LAYOUTS]


def test_the_host_headers_are_measured() -> None:
    assert _includes()[0] == _host_include(), "python3-dev (tools/setup.sh) must be installed"


def _ft_headers() -> list[tuple[str, str | None]]:
    if not FT_BUILT:
        return []
    return [(d, os.path.join(FT_CACHE, "build")) for d in glob.glob(f"{FT_CACHE}/Python-*/Include")]


@pytest.mark.parametrize("include,pyconfig", [(d, None) for d in _includes()] + _ft_headers())
def test_measured_headers_give_the_table(include: str, pyconfig: str | None) -> None:
    values = python_layouts.measure(include, pyconfig=pyconfig)
    hexv = int(values["PY_VERSION_HEX"])
    ft = bool(values.get("free_threaded"))
    assert ft == (pyconfig is not None), values
    lay = layout_for((hexv >> 24, (hexv >> 16) & 0xFF), ft)
    assert lay is not None, f"no layout for {values['PY_VERSION']}"
    for name in python_layouts.layout_fields(lay.version):
        assert getattr(lay, name) == values[name], (name, values["PY_VERSION"])
    kind_shift, kind_mask, compact, ascii_bit = STATE_BITS[lay.version]
    assert values["state_kind"] == kind_mask << kind_shift
    assert (values["state_compact"], values["state_ascii"]) == (compact, ascii_bit)
    if lay.version >= (3, 13):
        want = {k[6:]: v for k, v in values.items() if k.startswith("debug.")}
        assert debug_table.FIELDS[lay.version] == want


def _debug_binaries() -> list[str]:
    found = [os.path.realpath("/usr/bin/python3")]
    found += sorted(glob.glob(os.path.join(PYENV, "versions/3.1[3-9]*/lib/libpython3.*.so.1.0")))
    for root in ROOTS:
        found += sorted(glob.glob(os.path.join(root, "usr/bin/python3.1[3-9]")))
    if FT_BUILT:
        found.append(os.path.join(FT_CACHE, "build", "python"))
    return found


@pytest.mark.parametrize("binary", _debug_binaries())
def test_debug_offsets_in_real_binaries_agree(binary: str) -> None:
    found = debug_offsets(binary)
    name = os.path.basename(binary)
    if name.startswith("python3.") and int(name.split(".")[1]) < 13:
        assert found is None, "before 3.13 _PyRuntime has no _Py_DebugOffsets"
        return
    assert found is not None, binary
    hexv = found["version"]
    pf = python_file(binary)
    assert pf is not None and pf.debug_offsets_ok, binary
    assert pf.free_threaded == binary.startswith(FT_CACHE), binary
    lay = layout_for((hexv >> 24, (hexv >> 16) & 0xFF), pf.free_threaded)
    assert lay is not None
    assert {k: v for k, v in found.items() if k != "version"} == {
        k: getattr(lay, k) for k in debug_table.FIELDS[lay.version] if k != "version"
    }


def test_every_release_from_3_9_to_3_15_has_a_layout() -> None:
    assert sorted(LAYOUTS) == [(3, v) for v in range(9, 16)]
    for v, lay in LAYOUTS.items():
        assert lay.version == v and lay.source and not lay.free_threaded
    assert sorted(FREE_THREADED) == [(3, 13)]
    for v, lay in FREE_THREADED.items():
        assert lay.version == v and lay.source and lay.free_threaded
    # py_layouts' slots (gfx_python.h GFX_PY_LAYOUTS): defaults, then free-threaded
    assert all_layouts() == [*(LAYOUTS[v] for v in sorted(LAYOUTS)), FREE_THREADED[(3, 13)]]
    assert len(all_layouts()) <= 16


def _layout_id(lay: PyLayout) -> str:
    return ".".join(map(str, lay.version)) + ("t" if lay.free_threaded else "")


@pytest.mark.parametrize("lay", all_layouts(), ids=_layout_id)
def test_fields_present_only_where_the_release_has_them(lay: PyLayout) -> None:
    v = lay.version
    assert (lay.frame_kind, lay.frame_instr_kind) == (
        (0, 0) if v <= (3, 10) else (1, 1) if v <= (3, 12) else (1, 2)
    )
    assert (lay.cframe_current_frame != NONE) == (v in ((3, 11), (3, 12)))
    assert (lay.frame_is_entry != NONE) == (v == (3, 11))
    assert (lay.frame_owner != NONE) == (v >= (3, 11))
    assert (lay.code_qualname != NONE) == (lay.code_adaptive != NONE) == (v >= (3, 11))
    assert lay.owner_cstack == (3 if v >= (3, 12) else 0xFF)
    assert lay.frame_code_tag_mask == (3 if v >= (3, 14) else 0)


def test_pack_is_the_version_then_every_field_as_u32() -> None:
    lay = LAYOUTS[(3, 11)]
    raw = lay.pack()
    assert len(raw) == 4 * 28
    assert raw[:4] == (3 << 8 | 11).to_bytes(4, "little")
    assert raw[4:8] == lay.runtime_interp_head.to_bytes(4, "little")
    assert raw[-4:] == lay.bytes_data.to_bytes(4, "little")
    assert LAYOUTS[(3, 9)].pack()[4 * 6 : 4 * 7] == b"\xff\xff\xff\xff"  # cframe: NONE
