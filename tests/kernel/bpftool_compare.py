"""One mechanism to check that gfxbpf loads what libbpf loads.

`bpftool prog loadall` (libbpf) and gfxbpf.bpf each load an object; each
program's xlated instructions (as bpftool dumps them, map ids masked) and the
names of the maps it uses must be identical. test_conformance.py runs it over
the catalog, test_corpus.py over the libbpf-tools corpus, test_core_conformance.py
over the CO-RE test objects.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import skip_or_fail

BPFFS = "/sys/fs/bpf"
_MAP_ID = re.compile(r"map\[id:\d+\]")


class LibbpfRefused(Exception):
    """bpftool (libbpf) could not load the object: nothing to compare against."""


def ensure_bpffs() -> str:
    if shutil.which("bpftool") is None:
        skip_or_fail("bpftool is not installed (apt-get install bpftool)")
    if not os.path.ismount(BPFFS):
        # As systemd mounts it: a plain mount is one every user may pin in,
        # which every broker started later in the suite reports (host_check).
        subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", BPFFS], check=True)
    return BPFFS


def bpftool_json(*args: str) -> object:
    out = subprocess.run(["bpftool", "-j", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def xlated(prog_id: int) -> list[str]:
    """bpftool's dump of the kernel's translated code, map ids masked."""
    insns = bpftool_json("prog", "dump", "xlated", "id", str(prog_id))
    assert isinstance(insns, list) and insns, f"empty xlated dump for prog {prog_id}"
    return [_MAP_ID.sub("map[id:*]", i["disasm"]) for i in insns]


def map_names(prog_id: int) -> set[str]:
    info = bpftool_json("prog", "show", "id", str(prog_id))
    assert isinstance(info, dict)
    names = set()
    for mid in info.get("map_ids", []):
        m = bpftool_json("map", "show", "id", str(mid))
        assert isinstance(m, dict)
        names.add(m["name"])
    return names


def _bpftool_loadall(path: str, pin_dir: str) -> dict[str, int]:
    """Program ids by kernel name, as libbpf loaded them; LibbpfRefused if it could not."""
    r = subprocess.run(
        ["bpftool", "prog", "loadall", path, pin_dir], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise LibbpfRefused(r.stderr.strip().splitlines()[0] if r.stderr.strip() else "failed")
    theirs: dict[str, int] = {}
    for pin in os.listdir(pin_dir):
        info = bpftool_json("prog", "show", "pinned", os.path.join(pin_dir, pin))
        assert isinstance(info, dict)
        theirs[info["name"]] = info["id"]
    return theirs


def libbpf_load(path: str | os.PathLike[str], prefix: str) -> tuple[str, dict[str, int]]:
    """Load every program of the object with libbpf (bpftool), pinned under a new folder of
    the BPF filesystem: (that folder, which the caller removes; the programs' ids by name)."""
    pin_dir = tempfile.mkdtemp(prefix=prefix, dir=ensure_bpffs())
    os.rmdir(pin_dir)  # bpftool creates it
    try:
        return pin_dir, _bpftool_loadall(os.fspath(path), pin_dir)
    except BaseException:
        shutil.rmtree(pin_dir, ignore_errors=True)
        raise


def _shown_name(prog_id: int) -> str:
    info = bpftool_json("prog", "show", "id", str(prog_id))
    assert isinstance(info, dict)
    return str(info["name"])


def bpftool_loadall_count(path: str, bpffs: str) -> int:
    """How many programs libbpf loads from `path` (LibbpfRefused if it cannot)."""
    pin_dir = tempfile.mkdtemp(prefix="gfxtest_", dir=bpffs)
    os.rmdir(pin_dir)
    try:
        return len(_bpftool_loadall(path, pin_dir))
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)


def assert_loads_like_libbpf(path: str, spec: ObjectSpec, bpffs: str) -> int:
    """Load `path` with bpftool and `spec` with gfxbpf; assert identical code and map names.

    Returns the number of programs compared. Raises LibbpfRefused when libbpf
    itself cannot load the object (callers decide whether that is a failure).
    """
    pin_dir = tempfile.mkdtemp(prefix=f"gfxtest_{spec.name}_", dir=bpffs)
    os.rmdir(pin_dir)  # bpftool creates it
    try:
        theirs = _bpftool_loadall(path, pin_dir)
        with load(spec) as obj:
            # Names as bpftool shows them (the BTF name when the kernel's is cut to 15).
            ours = {_shown_name(p.id): p.id for p in obj.programs.values()}
            assert set(ours) == set(theirs), (
                f"programs: ours {sorted(ours)}, libbpf {sorted(theirs)}"
            )
            for name, our_id in ours.items():
                assert xlated(our_id) == xlated(theirs[name]), f"{spec.name}: {name} differs"
                ours_m, theirs_m = map_names(our_id), map_names(theirs[name])
                assert ours_m == theirs_m, (
                    f"{name}: maps {sorted(ours_m)}, libbpf {sorted(theirs_m)}"
                )
            # Every map carries libbpf's name (global data maps: "<obj>.rodata" ...).
            for m in obj.maps.values():
                assert bpfsys.map_info(m.fileno()).name == m.name
        return len(ours)
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)


def libbpf_loads_usdt_for_uprobe_multi() -> bool:
    """Whether bpftool's libbpf loads SEC("usdt") programs for uprobe_multi links.

    libbpf 1.3 and later do (expected_attach_type BPF_TRACE_UPROBE_MULTI)
    where the kernel has uprobe_multi links (Linux 6.6): Debian 13's bpftool
    (libbpf 1.5). libbpf 1.1 (Debian 12's) loads them with attach type 0. The
    kernel then resolves bpf_get_attach_cookie to a different helper, so the
    translated code differs with the attach type.
    """
    info = bpftool_json("version")
    assert isinstance(info, dict)
    libbpf = tuple(int(x) for x in str(info["libbpf_version"]).split(".")[:2])
    kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    return libbpf >= (1, 3) and kernel >= (6, 6)
