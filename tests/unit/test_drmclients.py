"""DRM client ids of one's own processes from a fake /proc, and how they label keys."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from gfxbpf.client import drmclients
from gfxbpf.client.cli.display import render_map
from gfxbpf.client.cli.output import DRM_CLIENT_LABEL, key_formatter
from gfxbpf.client.mapdata import MapData

FDINFO_AMD = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1089\n"
    "drm-driver:\tamdgpu\ndrm-client-id:\t42\ndrm-pdev:\t0000:03:00.0\n"
    "drm-engine-gfx:\t123456 ns\n"
)


def fake_proc(root: Path, pid: int, comm: str, fds: dict[int, tuple[str, str | None]]) -> None:
    """fds: fd -> (link target, fdinfo text or None for an unreadable one)."""
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    (d / "comm").write_text(comm + "\n")
    for fd, (target, text) in fds.items():
        os.symlink(target, d / "fd" / str(fd))
        if text is not None:
            (d / "fdinfo" / str(fd)).write_text(text)


def test_scan_finds_client_ids_of_dri_files_only(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        100,
        "vkcube",
        {
            3: ("/dev/dri/renderD128", FDINFO_AMD),
            4: ("/home/u/notes.txt", "pos:\t0\ndrm-client-id:\t7\n"),  # not a DRM file
            5: ("/dev/dri/card0", "pos:\t0\nflags:\t0\n"),  # DRM file without an id
        },
    )
    fake_proc(tmp_path, 200, "game", {9: ("/dev/dri/renderD128", FDINFO_AMD)})
    fake_proc(tmp_path, 300, "other", {3: ("/dev/dri/renderD128", None)})  # not ours
    (tmp_path / "self").mkdir()  # non-numeric entries are not processes
    found = drmclients.scan(str(tmp_path))
    assert list(found) == [42]
    assert [(c.pid, c.comm, c.driver) for c in found[42]] == [
        (100, "vkcube", "amdgpu"),
        (200, "game", "amdgpu"),
    ]


def test_scan_of_a_missing_proc_is_empty(tmp_path: Path) -> None:
    assert drmclients.scan(str(tmp_path / "nope")) == {}


def test_names_rescan_only_after_the_ttl() -> None:
    t = [0.0]
    calls = []

    def scanner() -> dict[int, list[drmclients.DrmClient]]:
        calls.append(t[0])
        return {5: [drmclients.DrmClient(5, 1234, "blender", "xe")]}

    names = drmclients.DrmClientNames(ttl=2.0, scanner=scanner, clock=lambda: t[0])
    assert names.label(5) == "5 (xe: pid 1234 blender)"
    assert names.label(6) == "6"  # someone else's client, or gone
    t[0] = 1.0
    names.label(5)
    t[0] = 2.5
    names.label(5)
    assert calls == [0.0, 2.5]


def test_drmsched_client_keys_and_histogram_groups_get_names() -> None:
    names = drmclients.DrmClientNames(
        scanner=lambda: {42: [drmclients.DrmClient(42, 100, "vkcube", "amdgpu")]}
    )
    data = MapData(
        name="client_run",
        show="log2_histogram",
        unit="ns",
        key_label=DRM_CLIENT_LABEL,
        description="",
        entries=[],
    )
    fmt = key_formatter(SimpleNamespace(program="drmsched"), data, [], names)  # type: ignore[arg-type]
    data.entries = [({"client_id": 42, "slot": 10}, 3), ({"client_id": 9, "slot": 11}, 1)]
    shown = "\n".join(render_map(data, key_format=fmt))
    assert "@client_run[42 (amdgpu: pid 100 vkcube)]:" in shown
    assert "@client_run[9]:" in shown
    assert fmt(42) == "42 (amdgpu: pid 100 vkcube)"
    assert fmt("42") == "42 (amdgpu: pid 100 vkcube)"  # a histogram group label
    assert fmt(0) == "0"
    other = MapData(
        name="run_latency",
        show="log2_histogram",
        unit="ns",
        key_label="ring",
        description="",
        entries=[],
    )
    att = SimpleNamespace(program="drmsched")
    assert key_formatter(att, other, [], names)("42") == "42"  # type: ignore[arg-type]
