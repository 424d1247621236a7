"""gfxbpf.client.profiles.fileid: what the client's caches and the perf-map
reader may open and keep (issue 26 items 8 and 10). The attacks themselves,
as real users, are in tests/kernel/test_client_attacks.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gfxbpf.client.profiles import fileid, procmaps


def _opens_without_blocking(path: Path, **kw: object) -> OSError | None:
    """open_regular(path) in a thread that must finish within 5 s: the error, or None."""
    got: list[OSError | None] = []

    def go() -> None:
        try:
            fd, _ = fileid.open_regular(str(path), **kw)  # type: ignore[arg-type]
            os.close(fd)
            got.append(None)
        except OSError as e:
            got.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(5)
    assert got, f"open_regular({path}) blocked"
    return got[0]


def test_fifo_symlink_and_directory_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real = tmp_path / "real"
    real.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert "not a regular file" in str(_opens_without_blocking(fifo))
    assert isinstance(_opens_without_blocking(link), OSError)  # ELOOP: a final symlink
    assert isinstance(_opens_without_blocking(tmp_path), OSError)
    assert _opens_without_blocking(real) is None


def test_owner_and_size_bounds(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    me = os.getuid()
    assert _opens_without_blocking(f, owners=(me,), max_size=100) is None
    assert "owned by uid" in str(_opens_without_blocking(f, owners=(me + 1,)))
    assert "larger than" in str(_opens_without_blocking(f, max_size=99))


def test_the_fd_path_reads_the_checked_file_even_after_a_swap(tmp_path: Path) -> None:
    f = tmp_path / "lib"
    f.write_bytes(b"checked")
    fd, st = fileid.open_regular(str(f))
    try:
        f.unlink()
        f.write_bytes(b"swapped")
        assert Path(fileid.open_regular_path(fd)).read_bytes() == b"checked"
        assert os.fstat(fd).st_ino == st.st_ino
    finally:
        os.close(fd)


def test_cache_key_names_the_file_not_only_its_build_id(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    ka = fileid.cache_key("abcd", os.stat(a))
    kb = fileid.cache_key("abcd", os.stat(b))
    assert ka.startswith("abcd-") and kb.startswith("abcd-") and ka != kb
    assert fileid.cache_key(None, os.stat(a)).startswith("noid-")
    before = fileid.FileId.of(os.stat(a))
    a.write_bytes(b"diff")  # same size, new content: mtime/ctime move
    os.utime(a, ns=(before.mtime_ns, before.mtime_ns))  # the owner can put mtime back...
    assert fileid.FileId.of(os.stat(a)) != before  # ...not ctime


def test_may_cache_only_the_callers_and_roots_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    assert fileid.may_cache(os.stat(f))
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(f, 4242, 4242)
    assert not fileid.may_cache(os.stat(f))


def test_perf_map_fifo_does_not_hang_capture(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"perf-{os.getpid()}.map")
    done: list[object] = []
    t = threading.Thread(
        target=lambda: done.append(procmaps.capture(os.getpid(), str(tmp_path))), daemon=True
    )
    t.start()
    t.join(10)
    assert done, "capture() blocked on a FIFO at perf-PID.map"
    maps = done[0]
    assert isinstance(maps, procmaps.ProcessMaps)
    assert maps.perf_map == [] and maps.perf_map_path is None


def _mapping_of(path: Path, inode: int | None = None) -> procmaps.Mapping:
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    ino = st.st_ino if inode is None else inode
    return procmaps.Mapping(0x1000, 0x2000, "r-xp", 0, dev, ino, str(path))


def test_a_process_files_are_read_through_its_root_when_it_holds_them(tmp_path: Path) -> None:
    """A container (own mount namespace, pivot_root): its paths mean its root's files."""
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"host")
    root = tmp_path / "root"
    inside = Path(f"{root}{lib}")
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"container")
    m = _mapping_of(inside)
    m = procmaps.Mapping(m.start, m.end, m.perms, m.offset, m.dev, m.inode, str(lib))
    maps = procmaps.ProcessMaps(1, [m], root=str(root))
    assert maps.local_path(m) == str(inside)
    assert procmaps.ProcessMaps(1, [m]).local_path(m) == str(lib)  # no root: the path as is


def test_a_chroot_in_its_own_namespace_is_read_at_our_path(tmp_path: Path) -> None:
    """unshare -m + chroot: the kernel writes the namespace's path, which is ours
    (and /proc/PID/root + it names nothing); our file is taken only if it is
    the mapped one, same device and inode."""
    lib = tmp_path / "chroot" / "usr" / "lib.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"chroot's")
    m = _mapping_of(lib)
    root = str(tmp_path / "chroot")
    assert procmaps.ProcessMaps(1, [m], root=root).local_path(m) == str(lib)
    other = _mapping_of(lib, inode=lib.stat().st_ino + 1)  # not the mapped file
    assert procmaps.ProcessMaps(1, [other], root=root).local_path(other) == root + str(lib)


def test_a_chroot_in_its_own_namespace_seen_from_another_chroot(tmp_path: Path) -> None:
    """The same, read by a client that is itself chrooted (the Debian 13 leg of
    CI): the kernel writes paths from the namespace's root, which the client
    cannot open; /proc/PID/root's target has the same prefix, cut off."""
    proc_root = tmp_path / "proc-root"  # stands for /proc/PID/root: the process's root
    lib = proc_root / "usr" / "lib.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"chroot's")
    st = lib.stat()
    link = "/host/var/tmp/u/root"  # where its root lies in the namespace's paths
    m = procmaps.Mapping(0x1000, 0x2000, "r-xp", 0, "00:00", st.st_ino, f"{link}/usr/lib.so")
    maps = procmaps.ProcessMaps(1, [m], root=str(proc_root), root_link=link)
    assert maps.local_path(m) == str(lib)
    assert procmaps.ProcessMaps(1, [m], root=str(proc_root), root_link="/").local_path(m) == (
        f"{proc_root}{link}/usr/lib.so"  # no prefix to cut: reported as unreadable later
    )
