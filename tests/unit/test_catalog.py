"""Offline tests of the program catalog, its objects and their build."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from gfxbpf.bpf.asm import SLOT
from gfxbpf.broker.replies import catalog_map_description
from gfxbpf.catalog import entries as cat
from gfxbpf.catalog import objects as catobj

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "catalog" / "programs"
SIDE_OBJECTS = (
    "bench/bench.bpf.o",
    "tests/data/objects/probe_write_user.bpf.o",
    "tests/data/objects/trace_printk.bpf.o",
)
BUILD = ROOT / "tools" / "build_bpf.py"

EXPECTED = {
    "cudakernels",
    "vmabind",
    "fence",
    "drmsched",
    "execsnoop",
    "syscount",
    "clonecount",
    "ucalls",
    "xid",
    "xe",
    "vblank",
    "amdgpu",
    "cuda",
    "profile",
    "ustacks",
    "stackcopy",
    "ustackcopy",
    "offcpu",
    "cgroupcpu",
    "offwake",
    "locks",
    "memstacks",
}

# Default knob values, from the kernel's trace headers (newest layouts) and this
# machine's 6.18 sched_process_exec format.
KNOB_DEFAULTS = {
    "vmabind": {
        "off_bind_vm": 16,
        "off_bind_size": 32,
        "size_bind_size": 8,
        "off_unbind_vm": 16,
        "off_unbind_size": 32,
        "size_unbind_size": 8,
    },
    "fence": {
        "off_emit_driver": 8,
        "off_emit_timeline": 12,
        "off_emit_context": 16,
        "size_emit_context": 4,
        "off_emit_seqno": 20,
        "size_emit_seqno": 4,
        "off_init_driver": 8,
        "off_init_timeline": 12,
        "off_init_context": 16,
        "off_init_seqno": 20,
        "off_sig_context": 16,
        "off_sig_seqno": 20,
    },
    "drmsched": {
        "off_q_name": 8,
        "off_q_context": 24,
        "off_q_seqno": 32,
        "off_r_name": 8,
        "off_r_context": 24,
        "off_r_seqno": 32,
        "off_d_context": 8,
        "off_d_seqno": 16,
        "off_lq_fence": 16,
        "off_lq_name": 24,
        "off_lr_fence": 16,
        "off_lr_name": 24,
        "off_ld_fence": 8,
        "off_q_client": 40,
        "off_r_client": 40,
    },
    "xid": {"off_dev": 8, "off_code": 12, "off_msg": 16},
    "xe": {
        "off_x_dev": 8,
        "off_x_fence": 40,
        "off_r_dev": 8,
        "off_r_fence": 40,
        "off_f_fence": 40,
        "off_t_dev": 8,
        "off_b_vm": 24,
        "off_b_start": 40,
        "off_b_end": 48,
        "off_u_vm": 24,
        "off_u_start": 40,
        "off_u_end": 48,
    },
    "vblank": {"off_crtc": 8, "off_seq": 12, "off_time": 16},
    "amdgpu": {
        "off_cs_context": 16,
        "size_cs_context": 8,
        "off_cs_seqno": 24,
        "size_cs_seqno": 8,
        "off_cs_ring": 40,
        "off_run_context": 16,
        "size_run_context": 8,
        "off_run_seqno": 24,
        "size_run_seqno": 8,
        "off_run_ring": 32,
        "off_sig_context": 16,
        "size_sig_context": 4,
        "off_sig_seqno": 20,
        "size_sig_seqno": 4,
        "off_map_start": 16,
        "off_map_last": 24,
        "off_unmap_start": 16,
        "off_unmap_last": 24,
    },
    "execsnoop": {"off_pid": 12, "off_filename": 8, "target_uid": 0xFFFFFFFF},
    "syscount": {"target_uid": 0xFFFFFFFF},
    "cgroupcpu": {},
    "clonecount": {"target_uid": 0xFFFFFFFF},
    "ucalls": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "cuda": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "profile": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "ustacks": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "stackcopy": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "ustackcopy": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "memstacks": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF, "sample_bytes": 0},
    "cudakernels": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
    "offcpu": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF, "min_block_us": 1000},
    "offwake": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF, "min_block_us": 1000},
    "locks": {"target_uid": 0xFFFFFFFF, "target_pid": 0xFFFFFFFF},
}

needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")

BPF_FUNC_TRACE_PRINTK = 6
BPF_FUNC_PROBE_WRITE_USER = 36


@pytest.fixture(scope="module")
def catalog() -> cat.Catalog:
    return cat.load_catalog()


def _elf(path: Path) -> ELFFile:
    return ELFFile(io.BytesIO(path.read_bytes()))


def _symbols_in(elf: ELFFile, section: str) -> dict[str, int]:
    """name -> st_value of the symbols defined in one section."""
    index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == section)
    out: dict[str, int] = {}
    for sec in elf.iter_sections():
        if isinstance(sec, SymbolTableSection):
            for sym in sec.iter_symbols():
                if sym["st_shndx"] == index and sym.name:
                    out[sym.name] = sym["st_value"]
    return out


def _btf_struct_names(data: bytes) -> set[str]:
    """Names of the STRUCT types in raw .BTF bytes (a minimal walk)."""
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from(
        "<HBBIIIII", data
    )
    assert magic == 0xEB9F
    strings = data[hdr_len + str_off :]
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    names: set[str] = set()
    # kind -> (fixed trailing bytes, bytes per vlen item)
    trailing = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8)}
    trailing |= {14: (4, 0), 15: (0, 12), 17: (4, 0), 19: (0, 12)}
    while pos < end:
        name_off, info, _size = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind == 4:
            names.add(strings[name_off : strings.index(b"\0", name_off)].decode())
        fixed, per = trailing.get(kind, (0, 0))
        pos += 12 + fixed + per * vlen
    return names


def test_catalog_parses(catalog: cat.Catalog) -> None:
    assert set(catalog.names()) == EXPECTED
    syscount = catalog.get("syscount")
    assert syscount.scopes == ("self", "system", "job")
    assert syscount.uid_knob == "target_uid"
    # Scope job: the uid knob and the job's cgroup (gfx_cgroup.h).
    for name in ("syscount", "profile", "stackcopy"):
        assert catalog.get(name).cgroup_knob == "target_cgroup"
        assert "job" in catalog.get(name).scopes
    assert catalog.get("cgroupcpu").scopes == ("system",)
    assert syscount.attach == (cat.Attach("sys_enter", "raw_tracepoint", "sys_enter"),)
    assert syscount.map("counts").show == "counter"
    ucalls = catalog.get("ucalls")
    assert ucalls.pid_knob == "target_pid"
    assert {a.kind for a in ucalls.attach_for(None)} == {"uprobe", "uretprobe"}
    # Its process tree's fork hook: one build per variant.
    assert {a.kind for a in ucalls.attach if a.variant} == {"tp_btf", "tracepoint"}
    assert (ucalls.children_knob, ucalls.tree_map) == ("follow_children", "tree")
    assert not ucalls.map("tree").visible
    assert all(a.target is None for a in ucalls.attach_for(None))
    assert [p.name for p in ucalls.parameters] == ["pid", "library", "functions"]
    assert ucalls.parameters[2].type == "list[str]"
    profile = catalog.get("profile")
    assert profile.attach_for(None) == (cat.Attach("profile_sample", "perf_event"),)
    assert [p.name for p in profile.parameters] == ["frequency", "pid"]
    assert not any(p.required for p in profile.parameters)
    assert profile.map("stacks").visible  # user addresses only: BPF_F_USER_STACK
    ustacks = catalog.get("ustacks")
    assert [p.name for p in ustacks.parameters] == ["pid", "library", "functions"]
    assert not ustacks.map("entry_ts").visible
    # GPU events that carry no submitter run only system-wide; submissions
    # (drmsched's queue, amdgpu's CS ioctl) run in the submitter: self filters them.
    for name in ("vmabind", "fence", "xid", "xe", "vblank"):
        assert catalog.get(name).scopes == ("system",)
    for name in ("drmsched", "amdgpu"):
        assert catalog.get(name).scopes == ("self", "system")
        assert catalog.get(name).uid_knob == "target_uid"


def test_drmsched_variants(catalog: cat.Catalog) -> None:
    p = catalog.get("drmsched")
    assert p.variants == ("6.17+", "legacy")
    new = {a.target for a in p.attach_for("6.17+")}
    assert new == {
        "gpu_scheduler/drm_sched_job_queue",
        "gpu_scheduler/drm_sched_job_run",
        "gpu_scheduler/drm_sched_job_done",
    }
    assert {a.program for a in p.attach_for("legacy")} == {
        "legacy_queue",
        "legacy_run",
        "legacy_done",
    }
    # Fields follow their tracepoint's variant; no knob belongs to both.
    assert {f.knob for f in p.fields_for("legacy")} == {
        "off_lq_fence",
        "off_lq_name",
        "off_lr_fence",
        "off_lr_name",
        "off_ld_fence",
    }
    assert all(f.variant == "6.17+" for f in p.fields_for("6.17+"))


def test_get_unknown_lists_known_names(catalog: cat.Catalog) -> None:
    with pytest.raises(KeyError) as ei:
        catalog.get("nosuch")
    msg = str(ei.value)
    assert "nosuch" in msg and "syscount" in msg and "vmabind" in msg
    assert "nosuch" not in catalog and "fence" in catalog
    with pytest.raises(KeyError, match="no map 'nope'"):
        catalog.get("fence").map("nope")


def test_objects_exist_and_hashes_match(catalog: cat.Catalog) -> None:
    for entry in catalog:
        path = catobj.object_path(entry)
        assert path.is_file(), path
        # The installed object (package data) is the committed one.
        assert path.read_bytes() == (PROGRAMS / entry.object).read_bytes(), entry.name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256, entry.name
        assert catobj.read_object(entry) == path.read_bytes()


def test_read_object_refuses_wrong_hash(catalog: cat.Catalog) -> None:
    entry = catalog.get("syscount")
    wrong = cat.Program(**{**entry.__dict__, "sha256": "0" * 64})
    with pytest.raises(cat.CatalogError, match="syscount.*sha256"):
        catobj.read_object(wrong)


def test_every_object_map_is_declared(catalog: cat.Catalog) -> None:
    declared_anywhere = {p.object for p in catalog}
    # Every built object belongs to a catalog entry.
    assert {p.name for p in PROGRAMS.glob("*.bpf.o")} == declared_anywhere
    for entry in catalog:
        maps = set(_symbols_in(_elf(catobj.object_path(entry)), ".maps"))
        assert maps, entry.name
        assert maps == {m.name for m in entry.maps}, entry.name
        assert catobj.check_object(entry) == []


def test_check_object_reports_mismatches(catalog: cat.Catalog) -> None:
    entry = catalog.get("clonecount")
    broken = cat.Program(
        **{
            **entry.__dict__,
            "maps": (),
            "uid_knob": "no_such_knob",
            "attach": (cat.Attach("enter_clone", "raw_tracepoint", "sys_enter"),),
        }
    )
    problems = "\n".join(catobj.check_object(broken))
    assert "map 'counts' is in the object but not in the catalog" in problems
    assert "knob 'no_such_knob'" in problems
    assert "not a raw_tracepoint" in problems


def test_check_object_survives_corrupt_objects(catalog: cat.Catalog) -> None:
    entry = catalog.get("syscount")
    good = catobj.object_path(entry).read_bytes()
    bad_shoff = good[:40] + b"\xff" * 8 + good[48:]  # section headers far past EOF
    for data in (b"", b"\x7fELF", good[:200], good[: len(good) // 2], bad_shoff):
        problems = catobj.check_object(entry, data)
        assert problems and "not a readable ELF object" in problems[0]


def test_knob_defaults(catalog: cat.Catalog) -> None:
    for entry in catalog:
        elf = _elf(catobj.object_path(entry))
        section = elf.get_section_by_name(".rodata")
        if section is None:  # a program with no knob at all (cgroupcpu)
            assert not KNOB_DEFAULTS[entry.name] and not entry.knobs, entry.name
            continue
        rodata = section.data()
        syms = _symbols_in(elf, ".rodata")
        values = {k: struct.unpack_from("<I", rodata, off)[0] for k, off in syms.items()}
        for knob, want in KNOB_DEFAULTS[entry.name].items():
            assert values[knob] == want, (entry.name, knob)
        for f in entry.fields:  # size knobs default to the documented widths
            if f.size_knob:
                want = KNOB_DEFAULTS[entry.name].get(f.size_knob, 4)
                assert values[f.size_knob] == want, (entry.name, f.size_knob)


def test_event_type_is_in_btf(catalog: cat.Catalog) -> None:
    entry = catalog.get("execsnoop")
    m = entry.map("events")
    assert m.show == "events" and m.event_type == "exec_event"
    btf = _elf(catobj.object_path(entry)).get_section_by_name(".BTF").data()
    assert "exec_event" in _btf_struct_names(btf)


def _helper_calls(path: Path) -> list[tuple[str, int, int]]:
    """(section, instruction index, helper id) of every helper call."""
    out = []
    for sec in _elf(path).iter_sections():
        if not sec["sh_flags"] & 0x4:  # SHF_EXECINSTR
            continue
        code = sec.data()
        assert len(code) % 8 == 0
        i = 0
        while i < len(code):
            op, regs, _off, imm = SLOT.unpack_from(code, i)
            if op == 0x85 and regs >> 4 == 0:  # call, src 0: a helper
                out.append((sec.name, i // 8, imm))
            i += 16 if op == 0x18 else 8  # ld_imm64 takes two slots
    return out


def test_no_forbidden_helper_calls(catalog: cat.Catalog) -> None:
    for entry in catalog:
        calls = _helper_calls(catobj.object_path(entry))
        assert calls, entry.name  # the scan does see the helper calls
        bad = [c for c in calls if c[2] in (BPF_FUNC_TRACE_PRINTK, BPF_FUNC_PROBE_WRITE_USER)]
        assert bad == [], entry.name


@needs_clang
def test_helper_scan_finds_trace_printk(tmp_path: Path) -> None:
    src = tmp_path / "bad.bpf.c"
    src.write_text(
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n"
        'SEC("tracepoint/sched/sched_process_exec") int p(void *ctx)\n'
        '{ bpf_printk("x"); return 0; }\nchar LICENSE[] SEC("license") = "GPL";\n'
    )
    obj = tmp_path / "bad.bpf.o"
    subprocess.run(
        ["clang", "-O2", "-target", "bpf", "-I/usr/include/x86_64-linux-gnu"]
        + ["-c", str(src), "-o", str(obj)],
        check=True,
        timeout=120,
    )
    calls = _helper_calls(obj)
    assert [h for sec, _, h in calls if sec.startswith("tracepoint/")] == [BPF_FUNC_TRACE_PRINTK]


def test_no_checkout_path_in_objects() -> None:
    paths = {str(ROOT), str(ROOT.resolve())}
    for obj in [*PROGRAMS.glob("*.bpf.o"), *(ROOT / side for side in SIDE_OBJECTS)]:
        data = obj.read_bytes()
        for p in paths:
            # As a directory of a file name, or a whole string (a compilation
            # directory): a checkout at /gfxbpf is also a substring of the
            # legitimate relative name catalog/programs/gfxbpf.h.
            assert f"{p}/".encode() not in data, obj.name
            assert b"\0" + p.encode() + b"\0" not in data, obj.name
        # The relative source path is there instead.
        assert str(obj.relative_to(ROOT).parent).encode() + b"/" in data, obj.name


def _load_build_tool():
    spec = importlib.util.spec_from_file_location("build_bpf", BUILD)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_bpf"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_rewrite_sha256_touches_only_hash_lines() -> None:
    build = _load_build_tool()
    text = (
        "# header comment\n"
        "[[program]]\n"
        'name = "a"\n'
        'sha256 = "old"   # keep me\n'
        'object = "a.bpf.o"\n'
        "[[program.map]]\n"
        'name = "m"\n'
        'sha256 = "not a program key"\n'
        "[[program]]\n"
        'name = "b"\n'
        'object = "b.bpf.o"\n'
    )
    new, missing = build.rewrite_sha256(
        text, {"a.bpf.o": "1" * 64, "b.bpf.o": "2" * 64, "c.bpf.o": "3"}
    )
    assert missing == ["c.bpf.o"]
    assert f'sha256 = "{"1" * 64}"   # keep me\n' in new
    assert 'sha256 = "not a program key"' in new
    assert new.index(f'sha256 = "{"2" * 64}"') > new.index('object = "b.bpf.o"')
    assert new.replace(f'"{"1" * 64}"', '"old"').replace(f'sha256 = "{"2" * 64}"\n', "") == text


def _committed_compiler() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import bpf_toolchains

    ref = bpf_toolchains.committed(bpf_toolchains.load(ROOT / "catalog" / "toolchains.toml"))
    assert ref is not None, "catalog/toolchains.toml names no committed toolchain"
    return ref.compiler


def _clang_version() -> str:
    out = subprocess.run(["clang", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0].strip()


@needs_clang
def test_build_check_reproduces_objects() -> None:
    r = subprocess.run(
        [sys.executable, str(BUILD), "--check"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clang version" in r.stdout
    for obj in PROGRAMS.glob("*.bpf.o"):
        assert f"{obj.name} ok" in r.stdout
    for side in SIDE_OBJECTS:  # bench/'s programs and the audit's test objects
        assert f"{side} ok" in r.stdout
    # The answer names how: byte for byte with the committed objects' compiler
    # (Debian 12), against this compiler's recorded sha256s with another (Debian 13).
    n = len(list(PROGRAMS.glob("*.bpf.o")))
    if _clang_version() == _committed_compiler():
        assert "rebuilt byte for byte" in r.stdout and "MISMATCH" not in r.stderr
        assert int(r.stdout.split(" rebuilt byte for byte")[0].rsplit(" ", 1)[1]) >= n
    else:
        assert "match the sha256 recorded for it from the same sources" in r.stdout, r.stdout


def _partial_checkout(where: Path) -> Path:
    """The catalog's sources, objects and records, and tools/: enough to build."""
    (where / "catalog").mkdir(parents=True)
    shutil.copytree(PROGRAMS, where / "catalog" / "programs")
    for name in ("catalog.toml", "toolchains.toml"):
        shutil.copy(ROOT / "catalog" / name, where / "catalog" / name)
    shutil.copytree(ROOT / "tools", where / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    return where


def _check(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(tree / "tools" / "build_bpf.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_clang
def test_build_is_independent_of_checkout_path(tmp_path: Path) -> None:
    # A checkout elsewhere builds the same bytes as the committed objects.
    other = _partial_checkout(tmp_path / "some" / "other checkout")
    r = _check(other, "--check")
    assert r.returncode == 0, r.stdout + r.stderr


@needs_clang
def test_build_check_names_a_differing_object(tmp_path: Path) -> None:
    other = _partial_checkout(tmp_path / "co")
    obj = other / "catalog" / "programs" / "syscount.bpf.o"
    obj.write_bytes(obj.read_bytes() + b"\0")
    r = _check(other, "--check")
    assert r.returncode != 0
    assert "syscount.bpf.o" in r.stderr and "clonecount.bpf.o" not in r.stderr


# --- validation of broken catalogs ----------------------------------------

GOOD = """
[[program]]
name = "demo"
object = "demo.bpf.o"
sha256 = "{sha}"
description = "demo"
scopes = ["self", "system"]
uid_knob = "target_uid"

[[program.attach]]
program = "handler"
kind = "tracepoint"
target = "sched/sched_process_exec"

[[program.field]]
knob = "off_pid"
tracepoint = "sched/sched_process_exec"
field = "pid"

[[program.map]]
name = "counts"
visible = true
show = "counter"
unit = "count"
key_label = "pid"
description = "d"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "programs").mkdir(exist_ok=True)
    (tmp_path / "programs" / "demo.bpf.o").write_bytes(b"\x7fELF")
    path = tmp_path / "catalog.toml"
    path.write_text(text.replace("{sha}", "a" * 64))
    return path


def test_a_table_lists_its_metrics_and_the_broker_says_so(tmp_path: Path) -> None:
    table = GOOD.replace('show = "counter"\nunit = "count"', 'show = "table"')
    assert cat.load_catalog(_write(tmp_path, table)).get("demo").map("counts").metrics is None
    listed = table.replace('description = "d"', 'description = "d"\nmetrics = ["n"]')
    m = cat.load_catalog(_write(tmp_path, listed)).get("demo").map("counts")
    assert m.metrics == ("n",)
    desc = catalog_map_description(m)
    assert desc.metrics_listed and list(desc.metrics) == ["n"]
    none = table.replace('description = "d"', 'description = "d"\nmetrics = []')
    m = cat.load_catalog(_write(tmp_path, none)).get("demo").map("counts")
    desc = catalog_map_description(m)
    assert m.metrics == () and desc.metrics_listed and not desc.metrics


def test_minimal_catalog_loads(tmp_path: Path) -> None:
    c = cat.load_catalog(_write(tmp_path, GOOD))
    p = c.get("demo")
    assert catobj.object_path(p) == tmp_path / "programs" / "demo.bpf.o"
    assert p.fields[0].variant is None
    assert p.fields[0].optional is False
    assert p.knobs == ("target_uid", "off_pid")


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        (
            'description = "demo"',
            'description = "demo"\ncolour = "red"',
            "\"demo\": field 'colour': unknown key",
        ),
        (
            'kind = "tracepoint"',
            'kind = "tracepoint"\nflags = 1',
            "[[program.attach]] #1: field 'flags': unknown key",
        ),
        ('object = "demo.bpf.o"', 'object = "missing.bpf.o"', "\"demo\": field 'object': "),
        ('object = "demo.bpf.o"', 'object = "../demo.bpf.o"', "\"demo\": field 'object': "),
        (
            'scopes = ["self", "system"]',
            'scopes = ["everyone"]',
            "field 'scopes': \"everyone\" is not one of",
        ),
        ('uid_knob = "target_uid"\n', "", "scope 'self' needs a uid_knob"),
        (
            'scopes = ["self", "system"]',
            'scopes = ["self", "job"]',
            "scope 'job' needs a uid_knob and a cgroup_knob",
        ),
        (
            'show = "counter"',
            'show = "pie"',
            "[[program.map]] #1: field 'show': \"pie\" is not one of",
        ),
        ('unit = "count"', 'unit = "furlongs"', "[[program.map]] #1: field 'unit': \"furlongs\""),
        ('unit = "count"\n', "", "[[program.map]] #1: field 'unit': missing"),
        ('show = "counter"', 'show = "events"', "[[program.map]] #1: field 'event_type': missing"),
        (
            'description = "d"',
            'description = "d"\nmetrics = ["polls"]',
            "[[program.map]] #1: field 'metrics': only a map with show = 'table' lists",
        ),
        (
            'show = "counter"\nunit = "count"',
            'show = "table"\nmetrics = ["polls", "polls"]',
            "field 'metrics': a member is listed twice",
        ),
        (
            'show = "counter"\nunit = "count"',
            'show = "table"\nmetrics = ["a-b"]',
            "field 'metrics': \"a-b\" is not a C identifier",
        ),
        (
            "visible = true",
            'visible = "yes"',
            "[[program.map]] #1: field 'visible': expected true or false",
        ),
        ('name = "counts"', 'name = "a_very_long_map_name"', "longer than 15"),
        (
            'kind = "tracepoint"',
            'kind = "kprobe"',
            "[[program.attach]] #1: field 'kind': \"kprobe\" is not one of",
        ),
        (
            'kind = "tracepoint"',
            'kind = "uprobe"',
            "[[program.attach]] #1: field 'target': a uprobe takes no target",
        ),
        (
            'target = "sched/sched_process_exec"\n',
            "",
            "[[program.attach]] #1: field 'target': missing",
        ),
        ('target = "sched/sched_process_exec"', 'target = "sched"', "is not 'system/event'"),
        (
            'field = "pid"',
            'field = "pid"\nvariant = "old"',
            "[[program.field]] #1: field 'variant': \"old\"",
        ),
        (
            'field = "pid"',
            'field = "pid"\noptional = 1',
            "[[program.field]] #1: field 'optional': expected true or false",
        ),
        (
            'tracepoint = "sched/sched_process_exec"',
            'tracepoint = "sched/sched_switch"',
            "[[program.field]] #1: field 'tracepoint': \"sched/sched_switch\" is not an attach",
        ),
        ('knob = "off_pid"', 'knob = "target_uid"', 'knob "target_uid" is assigned more than once'),
        ('sha256 = "{sha}"', 'sha256 = "abc"', '"demo": field \'sha256\': "abc" is not 64'),
        ('name = "demo"', 'name = "Demo!"', "field 'name': \"Demo!\" must be lowercase"),
        (
            'program = "handler"',
            "program = 3",
            "[[program.attach]] #1: field 'program': expected a C identifier",
        ),
        ('description = "d"\n', "", "[[program.map]] #1: field 'description': missing"),
    ],
)
def test_broken_catalogs(tmp_path: Path, old: str, new: str, expect: str) -> None:
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(cat.CatalogError) as ei:
        cat.load_catalog(path)
    assert expect in str(ei.value)
    # One problem (no follow-on ones), naming the file.
    assert len(ei.value.problems) == 1, ei.value.problems
    assert ei.value.problems[0].startswith(f"{path}: [[program]] #1 ")


def test_duplicate_program_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(cat.CatalogError, match="#2 \"demo\": field 'name': declared twice"):
        cat.load_catalog(_write(tmp_path, GOOD + GOOD))
    with pytest.raises(cat.CatalogError, match="TOML syntax error"):
        cat.load_catalog(_write(tmp_path, GOOD + "\n[[program]\n"))
    with pytest.raises(cat.CatalogError, match="top level: field 'programs': unknown key"):
        cat.load_catalog(_write(tmp_path, GOOD.replace("[[program]]", "[[programs]]", 1)))
    with pytest.raises(cat.CatalogError, match="cannot read the catalog"):
        cat.load_catalog(tmp_path / "nope.toml")


def test_unnamed_program_is_labelled_by_position(tmp_path: Path) -> None:
    with pytest.raises(cat.CatalogError, match=r"\[\[program\]\] #2: field 'name': missing"):
        cat.load_catalog(_write(tmp_path, GOOD + GOOD.replace('name = "demo"\n', "", 1)))


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = (
        GOOD.replace('description = "demo"', 'description = "demo"\ncolour = "red"', 1)
        .replace('unit = "count"', 'unit = "furlongs"', 1)
        .replace("visible = true", "visible = true\nsize = 3", 1)
    )
    with pytest.raises(cat.CatalogError) as ei:
        cat.load_catalog(_write(tmp_path, text + GOOD.replace('name = "demo"', 'name = "Demo!"')))
    got = [p.split(": ", 1)[1] for p in ei.value.problems]
    assert [g.split(": field ")[0] for g in got] == [
        '[[program]] #1 "demo"',
        '[[program]] #1 "demo" [[program.map]] #1',
        '[[program]] #1 "demo" [[program.map]] #1',
        '[[program]] #2 "Demo!"',
    ], got
    assert str(ei.value).count("\n") == 3


def test_ambiguous_field_variant(tmp_path: Path) -> None:
    text = GOOD.replace(
        'target = "sched/sched_process_exec"',
        'target = "sched/sched_process_exec"\nvariant = "a"\n\n[[program.attach]]\n'
        'program = "handler2"\nkind = "tracepoint"\ntarget = "sched/sched_process_exec"\n'
        'variant = "b"',
    )
    with pytest.raises(
        cat.CatalogError, match=r"\[\[program.field\]\] #1: field 'variant': .* several variants"
    ):
        cat.load_catalog(_write(tmp_path, text))
    c = cat.load_catalog(
        _write(tmp_path, text.replace('field = "pid"', 'field = "pid"\nvariant = "b"'))
    )
    assert c.get("demo").variants == ("a", "b")
    assert c.get("demo").fields_for("a") == ()


def test_tp_btf_attach_kind(tmp_path: Path) -> None:
    """A BTF-typed tracepoint names its tracepoint, like a raw one (no tracefs)."""
    text = GOOD.replace('kind = "tracepoint"', 'kind = "tp_btf"', 1).replace(
        'target = "sched/sched_process_exec"', 'target = "sched_process_exec"', 1
    )
    text = text[: text.index("[[program.field]]")] + text[text.index("[[program.map]]") :]
    p = cat.load_catalog(_write(tmp_path, text)).get("demo")
    assert p.attach == (cat.Attach("handler", "tp_btf", "sched_process_exec"),)
    bad = text.replace('target = "sched_process_exec"', 'target = "sched/x"', 1)
    with pytest.raises(cat.CatalogError, match="not a tracepoint name"):
        cat.load_catalog(_write(tmp_path, bad))


def test_only_a_usdt_probe_may_be_optional(tmp_path: Path) -> None:
    """optional on an attach: a USDT probe that older builds of a library lack."""
    bad = GOOD.replace(
        'target = "sched/sched_process_exec"',
        'target = "sched/sched_process_exec"\noptional = true',
    )
    with pytest.raises(cat.CatalogError, match="only a usdt probe may be optional"):
        cat.load_catalog(_write(tmp_path, bad))
    refused = cat.load_catalog().get("cudakernels")
    assert [a.target for a in refused.attach if a.optional] == ["gfxcupti:refused"]


def test_an_optional_probe_the_library_lacks_is_left_out() -> None:
    """A library without the probe (here /bin/true): nothing to attach, no
    error, and the maps are never asked for; a required one fails."""
    from gfxbpf.bpf.link.usdt import SPEC_SIZE, SPECS_MAP, UsdtError
    from gfxbpf.catalog import instance

    asked: list[str] = []

    class Specs:
        value_size = SPEC_SIZE

    class Object:
        def map(self, name: str) -> Specs:
            asked.append(name)
            return Specs()

    class Inst:
        entry = cat.load_catalog().get("cudakernels")
        obj = Object()

    params = instance.Params(library="/bin/true")
    probe = cat.Attach("cupti_refused", "usdt", "gfxcupti:refused", optional=True)
    assert instance._attach_usdt(Inst(), -1, probe, params, None) is None  # type: ignore[arg-type]
    assert asked == []
    required = cat.Attach("cupti_refused", "usdt", "gfxcupti:refused")
    with pytest.raises(UsdtError, match="has no USDT probe gfxcupti:refused"):
        instance._attach_usdt(Inst(), -1, required, params, None)  # type: ignore[arg-type]
    assert asked == [SPECS_MAP]
