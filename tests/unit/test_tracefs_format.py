"""tracefs format parsing and lookup, offline: stored GPU formats and fake trees."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.link.tracefs import (
    FormatError,
    TracefsError,
    TracepointNotFound,
    event_exists,
    event_id,
    parse_format,
    read_format,
    tracefs_root,
)

FORMATS = Path(__file__).resolve().parent.parent / "data" / "formats"

# (field, type, offset, size, signed, data_loc) per event, from the kernel's trace headers.
EXPECTED: dict[str, list[tuple[str, str, int, int, bool, bool]]] = {
    "i915/i915_vma_bind": [
        ("obj", "struct drm_i915_gem_object *", 8, 8, False, False),
        ("vm", "struct i915_address_space *", 16, 8, False, False),
        ("offset", "u64", 24, 8, False, False),
        ("size", "u64", 32, 8, False, False),
        ("flags", "unsigned", 40, 4, False, False),
    ],
    "i915/i915_vma_unbind": [
        ("obj", "struct drm_i915_gem_object *", 8, 8, False, False),
        ("vm", "struct i915_address_space *", 16, 8, False, False),
        ("offset", "u64", 24, 8, False, False),
        ("size", "u64", 32, 8, False, False),
    ],
    "dma_fence/dma_fence_emit": [
        ("driver", "__data_loc char[]", 8, 4, False, True),
        ("timeline", "__data_loc char[]", 12, 4, False, True),
        ("context", "unsigned int", 16, 4, False, False),
        ("seqno", "unsigned int", 20, 4, False, False),
    ],
    "dma_fence/dma_fence_signaled": [
        ("driver", "__data_loc char[]", 8, 4, False, True),
        ("timeline", "__data_loc char[]", 12, 4, False, True),
        ("context", "unsigned int", 16, 4, False, False),
        ("seqno", "unsigned int", 20, 4, False, False),
    ],
    "gpu_scheduler/drm_sched_job_queue": [
        ("name", "__data_loc char[]", 8, 4, False, True),
        ("job_count", "u32", 12, 4, False, False),
        ("hw_job_count", "int", 16, 4, True, False),
        ("dev", "__data_loc char[]", 20, 4, False, True),
        ("fence_context", "u64", 24, 8, False, False),
        ("fence_seqno", "u64", 32, 8, False, False),
        ("client_id", "u64", 40, 8, False, False),
    ],
    "gpu_scheduler/drm_sched_job_done": [
        ("fence_context", "u64", 8, 8, False, False),
        ("fence_seqno", "u64", 16, 8, False, False),
    ],
    "gpu_scheduler/drm_run_job": [
        ("entity", "struct drm_sched_entity *", 8, 8, False, False),
        ("fence", "struct dma_fence *", 16, 8, False, False),
        ("name", "__data_loc char[]", 24, 4, False, True),
        ("id", "uint64_t", 32, 8, False, False),
        ("job_count", "u32", 40, 4, False, False),
        ("hw_job_count", "int", 44, 4, True, False),
        ("dev", "__data_loc char[]", 48, 4, False, True),
    ],
    "gpu_scheduler/drm_sched_process_job": [
        ("fence", "struct dma_fence *", 8, 8, False, False),
    ],
}
EXPECTED["gpu_scheduler/drm_sched_job_run"] = EXPECTED["gpu_scheduler/drm_sched_job_queue"]

COMMON = [
    ("common_type", "unsigned short", 0, 2, False),
    ("common_flags", "unsigned char", 2, 1, False),
    ("common_preempt_count", "unsigned char", 3, 1, False),
    ("common_pid", "int", 4, 4, True),
]

# One field line exactly as the kernel prints it.
KERNEL_FIELD_LINE = re.compile(r"^\tfield:[^;\t]+;\toffset:\d+;\tsize:\d+;\tsigned:[01];$")

SCHED_EXEC = (
    "name: sched_process_exec\n"
    "ID: 365\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n"
    "\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n"
    "\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;\n"
    "\n"
    'print fmt: "filename=%s pid=%d old_pid=%d", __get_str(filename), REC->pid, REC->old_pid\n'
)


def test_every_stored_format_is_expected() -> None:
    # releases/ holds per-release trees (tests/unit/test_release_formats.py).
    stored = {f"{p.parent.name}/{p.name}" for p in FORMATS.glob("*/*") if p.is_file()}
    assert stored == set(EXPECTED)


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_stored_gpu_format(rel: str) -> None:
    text = (FORMATS / rel).read_text()
    # The stored text keeps the kernel's exact syntax.
    field_lines = [ln for ln in text.splitlines() if "field:" in ln]
    assert field_lines and all(KERNEL_FIELD_LINE.match(ln) for ln in field_lines)
    assert text.splitlines()[2] == "format:"
    assert text.splitlines()[-1].startswith("print fmt: ")

    fmt = parse_format(text)
    assert fmt.name == rel.split("/")[1]
    assert fmt.id > 0
    assert list(fmt.fields)[:4] == [c[0] for c in COMMON]
    for name, typ, off, size, signed in COMMON:
        f = fmt.fields[name]
        assert (f.type, f.offset, f.size, f.signed, f.is_common) == (typ, off, size, signed, True)
    got = [
        (f.name, f.type, f.offset, f.size, f.signed, f.is_data_loc)
        for f in fmt.event_fields.values()
    ]
    assert got == EXPECTED[rel]
    assert not any(f.is_common for f in fmt.event_fields.values())
    # A C struct: increasing, non-overlapping, naturally aligned.
    end = 8
    for f in fmt.event_fields.values():
        assert f.offset >= end and f.offset % min(f.size, 8) == 0
        end = f.offset + f.size
    for f in fmt.event_fields.values():
        assert f.array_len == (0 if f.is_data_loc else None)
    assert "REC->" in fmt.print_fmt or "__get_str" in fmt.print_fmt


def test_parse_live_style_text_and_arrays() -> None:
    fmt = parse_format(SCHED_EXEC)
    assert (fmt.name, fmt.id) == ("sched_process_exec", 365)
    assert fmt.fields["filename"].is_data_loc and fmt.fields["filename"].array_len == 0
    assert fmt.fields["pid"].signed and fmt.fields["pid"].type == "pid_t"
    assert fmt.print_fmt.startswith('"filename=%s')
    text = (
        "name: x\nID: 7\nformat:\n"
        "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
        "\tfield:unsigned long args[];\toffset:24;\tsize:0;\tsigned:0;\n"
        "\tfield:__rel_loc char[] msg;\toffset:24;\tsize:4;\tsigned:0;\n"
        "\tfield:u32 old;\toffset:28;\tsize:4;\n"  # very old kernels had no signed:
    )
    f = parse_format(text).fields
    assert (f["prev_comm"].type, f["prev_comm"].array_len) == ("char[16]", 16)
    assert (f["args"].type, f["args"].array_len, f["args"].size) == ("unsigned long[]", 0, 0)
    assert f["msg"].is_rel_loc and not f["msg"].is_data_loc
    assert f["old"].signed is False


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "no 'name:'"),
        ("garbage\n\x00\xff", "no 'name:'"),
        ("name: x\nformat:\n\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n", "no 'ID:'"),
        ("name: x\nID: 1\n", "no fields"),
        ("name: ../x\nID: 1\n", "bad event name"),
        ("name: x\nID: -1\n", "bad ID"),
        ("name: x\nID: 99999999999\n", "bad ID"),
        ("name: x\nID: 1\n\tfield:int a;\toffset:8;\n", "cannot parse field"),
        ("name: x\nID: 1\n\tfield:int;\toffset:8;\tsize:4;\tsigned:1;\n", "has no type"),
        ("name: x\nID: 1\n\tfield:int a-b;\toffset:8;\tsize:4;\tsigned:1;\n", "bad field name"),
        ("name: x\nID: 1\n\tfield:int a;\toffset:-8;\tsize:4;\tsigned:1;\n", "out of range"),
        ("name: x\nID: 1\n\tfield:int a;\toffset:8;\tsize:99999999;\tsigned:1;\n", "out of range"),
        (
            "name: x\nID: 1\n\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n"
            "\tfield:int a;\toffset:12;\tsize:4;\tsigned:1;\n",
            "declared twice",
        ),
    ],
)
def test_bad_format_text(text: str, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        parse_format(text)


def test_huge_inputs_are_refused() -> None:
    with pytest.raises(FormatError, match="longer than"):
        parse_format("name: x\n" + " " * (tracefs.MAX_FORMAT_BYTES + 1))
    many = "".join(
        f"\tfield:int f{i};\toffset:{8 + 4 * i};\tsize:4;\tsigned:1;\n"
        for i in range(tracefs.MAX_FIELDS + 1)
    )
    with pytest.raises(FormatError, match="more than"):
        parse_format("name: x\nID: 1\n" + many)
    with pytest.raises(FormatError):
        parse_format(b"name: x\n")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../etc", "x y", "i915:x", "é", "a\0b", "ev\n"])
def test_names_validated_before_paths(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid tracepoint"):
        event_id("sched", bad, root=str(tmp_path))
    with pytest.raises(ValueError, match="invalid tracepoint"):
        event_exists(bad, "x", root=str(tmp_path))
    with pytest.raises(ValueError, match="invalid tracepoint"):
        read_format(bad, "x", root=str(tmp_path))


def _fake_tree(root: Path) -> None:
    for rel in EXPECTED:
        d = root / "events" / rel
        d.mkdir(parents=True)
        text = (FORMATS / rel).read_text()
        (d / "format").write_text(text)
        (d / "id").write_text(f"{parse_format(text).id}\n")


def test_lookups_in_a_fake_tree(tmp_path: Path) -> None:
    _fake_tree(tmp_path)
    root = str(tmp_path)
    assert event_exists("i915", "i915_vma_bind", root=root)
    assert not event_exists("i915", "i915_vma_nothing", root=root)
    assert event_id("i915", "i915_vma_bind", root=root) == 1712
    fmt = read_format("gpu_scheduler", "drm_sched_job_run", root=root)
    assert fmt.fields["fence_seqno"].offset == 32
    with pytest.raises(TracepointNotFound) as ei:
        event_id("xe", "xe_vma_bind", root=root)
    assert "tracepoint xe:xe_vma_bind does not exist on this kernel" in str(ei.value)
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(TracepointNotFound):
        read_format("xe", "xe_vma_bind", root=root)
    (tmp_path / "events" / "i915" / "i915_vma_bind" / "id").write_text("banana\n")
    with pytest.raises(TracefsError, match="not an event id"):
        event_id("i915", "i915_vma_bind", root=root)
    (tmp_path / "events" / "i915" / "i915_vma_unbind" / "format").write_text("name: x\n")
    with pytest.raises(FormatError, match="i915_vma_unbind/format"):
        read_format("i915", "i915_vma_unbind", root=root)


def _mounts(tmp_path: Path, lines: list[str]) -> str:
    p = tmp_path / "mounts"
    p.write_text("".join(line + "\n" for line in lines))
    return str(p)


def test_tracefs_root_from_mounts(tmp_path: Path) -> None:
    spaced = tmp_path / "trace fs"
    (spaced / "events").mkdir(parents=True)
    m = _mounts(
        tmp_path,
        [
            "proc /proc proc rw 0 0",
            f"nodev {str(spaced).replace(' ', chr(92) + '040')} tracefs rw,relatime 0 0",
        ],
    )
    assert tracefs_root(m) == str(spaced)


def test_tracefs_root_debugfs_fallback(tmp_path: Path) -> None:
    dbg = tmp_path / "debug"
    (dbg / "tracing" / "events").mkdir(parents=True)
    m = _mounts(
        tmp_path,
        [f"nodev {tmp_path / 'gone'} tracefs rw 0 0", f"debugfs {dbg} debugfs rw 0 0"],
    )
    assert tracefs_root(m) == str(dbg / "tracing")


def test_tracefs_not_mounted(tmp_path: Path) -> None:
    m = _mounts(tmp_path, ["proc /proc proc rw 0 0", "sysfs /sys sysfs rw 0 0"])
    with pytest.raises(TracefsError) as ei:
        tracefs_root(m)
    assert ei.value.errno == errno.ENOENT
    assert "tracefs is not mounted" in str(ei.value)
    assert "mount -t tracefs nodev /sys/kernel/tracing" in str(ei.value)
    with pytest.raises(TracefsError, match="cannot read"):
        tracefs_root(str(tmp_path / "no-such-mounts"))


def test_permission_denied_as_nobody() -> None:
    """Root cannot be denied, so check the message from an unprivileged child."""
    if os.geteuid() != 0:
        pytest.skip("covered by test_tracefs_permission_denied")
    # pytest's tmp_path sits under a 0700 directory: use one nobody can walk.
    base = Path(tempfile.mkdtemp(prefix="gfxbpf-tracefs-"))
    try:
        os.chmod(base, 0o755)
        t = base / "t"
        (t / "events").mkdir(parents=True, mode=0o755)
        os.chmod(t / "events", 0o700)
        m = _mounts(base, [f"nodev {t} tracefs rw 0 0"])
        os.chmod(m, 0o644)
        err, msg = _tracefs_root_as_nobody(m)
    finally:
        shutil.rmtree(base)
    assert err == errno.EACCES
    assert "permission denied" in msg


def _tracefs_root_as_nobody(m: str) -> tuple[int, str]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to nobody, report through the pipe
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                tracefs_root(m)
                msg = "no error"
            except TracefsError as e:
                msg = f"{e.errno}|{e}"
            os.write(w, msg.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    err, _, msg = out.decode().partition("|")
    return int(err), msg
