"""CO-RE against the running kernel: gfxbpf loads the code libbpf loads.

tests/data/core/core_kernel.bpf.o carries every common relocation kind
against this kernel's vmlinux BTF (field offsets through pointers and an
anonymous struct, a flavoured struct, guarded missing fields and enumerators
whose poisoned reads the verifier prunes, bitfields, type ids and sizes).
Loaded by `bpftool prog loadall` (libbpf) and by gfxbpf.bpf, each program's
translated code must be identical, map ids aside.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from gfxbpf.bpf.core.relo import CoreKind
from gfxbpf.bpf.corerelo import relocate
from gfxbpf.bpf.kernel.vmlinux import kernel_target
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import skip_or_fail
from tests.kernel.bpftool_compare import libbpf_load, xlated
from tests.kernel.core_libbpf_log import gfxbpf_decisions, libbpf_decisions

pytestmark = pytest.mark.kernel

OBJECT = Path(__file__).resolve().parent.parent / "data" / "core" / "core_kernel.bpf.o"


def test_core_object_loads_with_libbpf_code() -> None:
    spec = ObjectSpec.from_file(str(OBJECT))
    core = relocate(spec, kernel_target())
    kinds = {r.kind_name for r in core.records}
    # The object really exercises CO-RE here: resolved, poisoned and existence kinds.
    assert {"byte_off", "field_exists", "lshift_u64", "target_type_id"} <= kinds
    assert any(r.result and r.result.poison for r in core.records)
    assert any(r.result and not r.result.poison and r.result.new_val != r.result.orig_val
               for r in core.records)  # fmt: skip
    pin_dir, theirs = libbpf_load(OBJECT, prefix="gfxtest_core_")
    try:
        with load(spec) as obj:
            ours = {p.name[:15]: p.id for p in obj.programs.values()}
            assert set(ours) == set(theirs) == {"core_fields", "core_kinds"}
            for name, our_id in ours.items():
                mine, libbpf = xlated(our_id), xlated(theirs[name])
                assert mine == libbpf, f"program {name} differs from libbpf's"
                # Poisoned reads sat in dead code: the verifier removed them.
                assert not any("195896080" in line for line in mine)
    finally:
        shutil.rmtree(pin_dir, ignore_errors=True)


def test_poisoned_reachable_read_is_refused_with_its_helper_number(tmp_path: Path) -> None:
    """An unguarded read of a field this kernel lacks fails verification, naming the poison."""
    from gfxbpf.bpf.loader import LoadError
    from tests.conftest import compile_bpf

    src = """
    #include <linux/bpf.h>
    #include <bpf/bpf_helpers.h>
    #include <bpf/bpf_core_read.h>
    char LICENSE[] SEC("license") = "GPL";
    struct task_struct { int gfxbpf_no_such_field; } __attribute__((preserve_access_index));
    long out;
    SEC("raw_tracepoint/sys_enter") int p(void *ctx) {
        struct task_struct *t = (void *)bpf_get_current_task();
        out = BPF_CORE_READ(t, gfxbpf_no_such_field);
        return 0;
    }
    """
    path = compile_bpf(src, tmp_path, "poison")
    spec = ObjectSpec.from_file(str(path))
    with pytest.raises(LoadError) as exc:
        load(spec).close()
    assert "195896080" in (exc.value.log or "")


@pytest.mark.parametrize("name", ["core_kernel", "core_kinds"])
def test_every_relocation_decided_as_libbpf_decides(name: str) -> None:
    """Each relocation's patch (value, load size, or poison) equals the one libbpf logs.

    core_kinds.bpf.o's local types differ from the kernel's on purpose
    (fields it lacks, other bitfields, an enumerator it has not), so this
    covers the poisoning paths against real vmlinux BTF too.
    """
    if shutil.which("bpftool") is None:
        skip_or_fail("bpftool is not installed (apt-get install bpftool)")
    path = OBJECT.with_name(f"{name}.bpf.o")
    spec = ObjectSpec.from_file(str(path))
    mine = gfxbpf_decisions(relocate(spec, kernel_target()))
    theirs = libbpf_decisions(str(path))
    assert theirs is not None, "libbpf stopped before CO-RE"
    assert len(mine) >= 30
    assert mine == theirs


def _as_type_matches(data: bytes, spec: ObjectSpec, names: tuple[str, ...]) -> bytes:
    """The object with its TYPE_EXISTS records on `names` turned into TYPE_MATCHES (kind 12)."""
    assert spec.btf is not None and spec.btf_ext is not None
    sec = ELFFile(io.BytesIO(data)).get_section_by_name(".BTF.ext")
    start, end = sec["sh_offset"], sec["sh_offset"] + sec["sh_size"]
    out = bytearray(data)
    flipped = 0
    for records in spec.btf_ext.core_relos.values():
        for r in records:
            if r.kind == CoreKind.TYPE_EXISTS and spec.btf.name_of(r.type_id) in names:
                raw = struct.pack("<IIII", r.insn_off, r.type_id, r.access_str_off, r.kind)
                at = bytes(out).find(raw, start, end)
                assert at >= 0
                struct.pack_into("<I", out, at + 12, CoreKind.TYPE_MATCHES)
                flipped += 1
    assert flipped == len(names)
    return bytes(out)


def test_type_matches_decided_as_libbpf_decides(tmp_path: Path) -> None:
    data = OBJECT.read_bytes()
    patched = tmp_path / "core_matches.bpf.o"
    patched.write_bytes(
        _as_type_matches(data, ObjectSpec.parse(data), ("list_head", "task_struct"))
    )
    spec = ObjectSpec.from_file(str(patched))
    core = relocate(spec, kernel_target())
    got = {r.local: r.result.new_val for r in core.records if r.kind_name == "type_matches"}  # type: ignore[union-attr]
    assert got == {"struct list_head": 1, "struct task_struct": 0}
    assert gfxbpf_decisions(core) == libbpf_decisions(str(patched))


def test_broker_privileges_suffice_for_core(tmp_path: Path) -> None:
    """As the service user with only CAP_BPF+CAP_PERFMON, CO-RE resolves and loads libbpf's code.

    The broker reads /sys/kernel/btf itself (libbpf's enumeration of BTF
    objects by id would need CAP_SYS_ADMIN).
    """
    from tests.kernel.brokerenv import (
        BASE_ENV,
        BROKER_USER,
        VENV_PYTHON,
        ensure_user,
        shared_dir,
    )

    uid, gid = ensure_user(BROKER_USER)
    d = shared_dir(tmp_path / "shared")
    obj = d / OBJECT.name
    shutil.copyfile(OBJECT, obj)
    os.chmod(obj, 0o644)
    caps = "+bpf,+perfmon"
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups"]
    argv += [f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}", f"--bounding-set=-all,{caps}"]
    argv += ["--", VENV_PYTHON, "-m", "gfxbpf.bpf", "load", str(obj)]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        env=dict(BASE_ENV),
    )
    assert proc.stdout is not None and proc.stdin is not None
    pin_dir = ""
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        ours = json.loads(line)["programs"]
        pin_dir, theirs = libbpf_load(OBJECT, prefix="gfxtest_core_")
        assert set(ours) == {"core_fields", "core_kinds"}
        for name, our_id in ours.items():
            assert xlated(our_id) == xlated(theirs[name]), f"program {name} differs"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        if pin_dir:
            shutil.rmtree(pin_dir, ignore_errors=True)
