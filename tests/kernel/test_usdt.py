"""USDT: a BPF_USDT program (libbpf's usdt.bpf.h) counts exact hits of a probe
in a small C program built here with <sys/sdt.h>, and reads its arguments
from a register and from the stack, with the cookie it was attached with."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gfxbpf.bpf.consts import BPF_TRACE_UPROBE_MULTI
from gfxbpf.bpf.link import usdt
from gfxbpf.bpf.loader import LoadedObject, load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf, skip_or_fail
from tests.kernel import brokerenv
from tests.kernel.bpftool_compare import (
    assert_loads_like_libbpf,
    ensure_bpffs,
    libbpf_loads_usdt_for_uprobe_multi,
    xlated,
)

SOURCES = Path(__file__).resolve().parents[1] / "data" / "programs"
HITS = 250


def _target(tmp_path: Path) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        skip_or_fail("no C compiler (apt-get install gcc)")
    out = tmp_path / "usdt_target"
    r = subprocess.run(
        [cc, "-O1", "-o", str(out), str(SOURCES / "usdt_target.c")], capture_output=True, text=True
    )
    if r.returncode and "sys/sdt.h" in r.stderr:
        skip_or_fail("<sys/sdt.h> is missing (apt-get install systemtap-sdt-dev)")
    assert r.returncode == 0, r.stderr
    return out


def _spec(tmp_path: Path) -> tuple[Path, ObjectSpec]:
    obj = compile_bpf((SOURCES / "usdt.bpf.c").read_text(), tmp_path, "usdt")
    return obj, ObjectSpec.from_file(str(obj))


def _run_attached(target: Path, obj: LoadedObject, probe: str, done: str, **attach: Any) -> None:
    """Start the target, attach `probe` to it, let it run its HITS rounds and check
    its last line (`done N`: how often its gated probe saw the semaphore raised)."""
    proc = subprocess.Popen(
        [str(target), str(HITS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        with usdt.attach_usdt(
            obj.programs[probe].fd,
            obj.map(usdt.SPECS_MAP),
            str(target),
            "gfxtest",
            probe,
            pid=proc.pid,
            **attach,
        ):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == done
            assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_usdt_object_loads_like_libbpf(tmp_path: Path) -> None:
    obj, spec = _spec(tmp_path)
    assert spec.programs["tick"].attach_kind == "usdt"
    bpffs = ensure_bpffs()
    if libbpf_loads_usdt_for_uprobe_multi():
        # As the broker loads them too (catalog/instance.py: use_uprobe_multi).
        for prog in spec.programs.values():
            prog.expected_attach_type = BPF_TRACE_UPROBE_MULTI
    assert assert_loads_like_libbpf(str(obj), spec, bpffs) == 2


def test_usdt_attach_type_changes_the_translated_cookie_helper(tmp_path: Path) -> None:
    # Why conformance must follow libbpf's choice: the same program loaded
    # both ways calls a different bpf_get_attach_cookie implementation.
    _, spec = _spec(tmp_path)
    with load(spec) as plain:
        perf = xlated(plain.programs["tick"].id)
    for prog in spec.programs.values():
        prog.expected_attach_type = BPF_TRACE_UPROBE_MULTI
    with load(spec) as multi:
        um = xlated(multi.programs["tick"].id)
    assert any("bpf_get_attach_cookie_trace" in i for i in perf), perf
    assert any("bpf_get_attach_cookie_uprobe_multi" in i for i in um), um


def test_usdt_counts_exact_hits_and_reads_arguments(tmp_path: Path) -> None:
    target = _target(tmp_path)
    (site,) = [p for p in usdt.read_probes(str(target)) if p.name == "tick"]
    assert site.provider == "gfxtest" and len(usdt.parse_args(site.args)) == 2
    assert site.semaphore and site.semaphore_offset  # raised while attached: harmless
    _, spec = _spec(tmp_path)
    with load(spec) as obj:
        # gated's semaphore stays down, so its probe never fires here.
        _run_attached(target, obj, "tick", "done 0\n", cookie=0xC0FFEE, ip_map=obj.map(usdt.IP_MAP))
        bss = obj.map(".bss").lookup(0)

    def var(name: str) -> int:
        v = spec.maps[".bss"].variables[name]
        return int.from_bytes(bss[v.offset : v.offset + v.size], "little", signed=True)

    assert var("hits") == HITS
    assert var("sum_first") == HITS * (HITS + 1) // 2  # i = 1..N, from %eax
    assert var("sum_second") == -7 * HITS  # from 8(%rsp), sign kept
    assert var("cookie") == 0xC0FFEE


@pytest.mark.parametrize("multi", [False, True], ids=["perf-uprobe", "uprobe-multi"])
def test_usdt_semaphore_is_raised_while_attached(tmp_path: Path, multi: bool) -> None:
    """A probe guarded by its semaphore fires only while the kernel raises it
    (uprobe ref_ctr_offset, or the uprobe_multi link's ref_ctr_offsets); the
    program counts every firing."""
    target = _target(tmp_path)
    _, spec = _spec(tmp_path)
    if multi:  # a uprobe_multi link wants the program loaded for it
        spec.programs["gated"].expected_attach_type = BPF_TRACE_UPROBE_MULTI
    with load(spec) as obj:
        _run_attached(target, obj, "gated", f"done {HITS}\n", multi=multi)
        bss = obj.map(".bss").lookup(0)
    v = spec.maps[".bss"].variables["gated_hits"]
    assert int.from_bytes(bss[v.offset : v.offset + v.size], "little") == HITS


def test_usdt_multi_needs_only_the_brokers_capabilities() -> None:
    """As the service user with exactly CAP_BPF + CAP_PERFMON (the unit's
    setpriv line): the perf uprobe PMU is refused, a uprobe_multi link with
    the semaphore's ref_ctr_offset attaches and counts every firing."""
    workdir = brokerenv.shared_dir()
    try:
        target = _target(workdir)
        obj = compile_bpf((SOURCES / "usdt.bpf.c").read_text(), workdir, "usdt")
        for p in (workdir, target, obj):
            p.chmod(0o755)
        helper = Path(__file__).with_name("usdt_unpriv.py")
        cmd = brokerenv.unit_exec_argv(f"{brokerenv.VENV_PYTHON} {helper} {obj} {target} {HITS}")
        r = subprocess.run(
            cmd, env=brokerenv.BASE_ENV, cwd="/", capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["perf"] in (errno.EPERM, errno.EACCES), out  # needs CAP_SYS_ADMIN
        assert out["target"] == f"done {HITS}" and out["gated_hits"] == HITS, out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
