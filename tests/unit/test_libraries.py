"""broker.libraries: a library is opened only where the caller could open it."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfxbpf.broker.request import libraries as L
from tests.conftest import skip_or_fail

ALICE, BOB = 54321, 54322  # uids nothing on this host runs as


def _tree(tmp_path: Path) -> Path:
    """tmp/pub/lib.so (readable by all) and tmp/priv (0700, owner bob)/lib.so."""
    os.chmod(tmp_path, 0o755)
    for name, mode in (("pub", 0o755), ("priv", 0o700)):
        d = tmp_path / name
        d.mkdir()
        (d / "lib.so").write_bytes(b"\x7fELF")
        os.chmod(d / "lib.so", 0o644)
        os.chmod(d, mode)
    os.chown(tmp_path / "priv", BOB, BOB)
    return tmp_path


@pytest.fixture
def tree() -> Iterator[Path]:
    if os.geteuid() != 0:
        skip_or_fail("needs root (to chown test files)")
    # Not pytest's tmp_path: its parents are private, and every component counts.
    base = Path(tempfile.mkdtemp(prefix="gfxbpf-libraries-", dir="/tmp"))
    try:
        yield _tree(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_missing_and_hidden_are_one_answer(tree: Path) -> None:
    for path in ("priv/lib.so", "priv/missing.so", "pub/missing.so", "pub"):
        with pytest.raises(L.Unreachable):
            L.resolve_as(str(tree / path), ALICE, [ALICE])
    real, _ = L.resolve_as(str(tree / "priv/lib.so"), BOB, [BOB])
    assert real == str(tree / "priv/lib.so")


def test_symlinks_are_followed_with_the_callers_rights(tree: Path) -> None:
    (tree / "pub/into-priv.so").symlink_to(tree / "priv/lib.so")
    (tree / "pub/rel.so").symlink_to("../pub/lib.so")
    with pytest.raises(L.Unreachable):
        L.resolve_as(str(tree / "pub/into-priv.so"), ALICE, [ALICE])
    assert L.resolve_as(str(tree / "pub/rel.so"), ALICE, [ALICE])[0] == str(tree / "pub/lib.so")
    (tree / "pub/loop").symlink_to("loop")
    with pytest.raises(L.Unreachable):
        L.resolve_as(str(tree / "pub/loop"), ALICE, [ALICE])


def test_groups_and_open_as(tree: Path) -> None:
    os.chown(tree / "priv", 0, 4242)
    os.chmod(tree / "priv", 0o750)
    with pytest.raises(L.Unreachable):
        L.open_as(str(tree / "priv/lib.so"), ALICE, [ALICE])
    fd, real = L.open_as(str(tree / "priv/lib.so"), ALICE, [ALICE, 4242])
    try:
        assert real == str(tree / "priv/lib.so") and L.from_fd(fd) == real
    finally:
        os.close(fd)


def _acl(*entries: tuple[int, int, int]) -> L.Acl:
    return list(entries)


def test_acl_rules() -> None:
    st = os.stat_result((0o100640, 0, 0, 1, BOB, 77, 0, 0, 0, 0))
    base = [(0x01, 6, 0), (0x04, 4, 0), (0x20, 0, 0)]
    # A named user entry grants, capped by the mask.
    assert L.permitted(st, _acl(*base, (0x02, 4, ALICE), (0x10, 4, 0)), ALICE, frozenset(), 4)
    assert not L.permitted(st, _acl(*base, (0x02, 4, ALICE), (0x10, 0, 0)), ALICE, frozenset(), 4)
    # A named user entry that grants nothing denies, even where other would grant.
    deny = [(0x01, 6, 0), (0x04, 4, 0), (0x02, 0, ALICE), (0x10, 4, 0), (0x20, 4, 0)]
    assert not L.permitted(st, _acl(*deny), ALICE, frozenset(), 4)
    assert L.permitted(st, _acl(*deny), BOB + 1, frozenset(), 4)
    # Groups: the owning group, or a named one.
    assert L.permitted(st, _acl(*base, (0x10, 4, 0)), ALICE, frozenset({77}), 4)
    assert L.permitted(st, _acl(*base, (0x08, 4, 99), (0x10, 4, 0)), ALICE, frozenset({99}), 4)
    assert not L.permitted(st, _acl(*base), ALICE, frozenset(), 4)


def test_a_posix_acl_on_disk_is_honoured(tree: Path) -> None:
    # user::rwx group::r-x other::r-x, and mallory (ALICE) named with no rights.
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 0, ALICE), (0x04, 5, 0xFFFFFFFF)]
    entries += [(0x10, 5, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)]
    raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(tree / "pub", "system.posix_acl_access", raw)
    except OSError as e:
        skip_or_fail(f"no POSIX ACLs on /tmp: {e.strerror}")
    with pytest.raises(L.Unreachable):
        L.resolve_as(str(tree / "pub/lib.so"), ALICE, [ALICE])
    assert L.resolve_as(str(tree / "pub/lib.so"), BOB, [BOB])[0] == str(tree / "pub/lib.so")


def test_from_fd_refuses_what_is_not_at_its_path(tmp_path: Path) -> None:
    f = tmp_path / "gone.so"
    f.write_bytes(b"\x7fELF")
    fd = os.open(f, os.O_RDONLY)
    try:
        f.unlink()
        with pytest.raises(L.LibraryError, match="no longer at"):
            L.from_fd(fd)
    finally:
        os.close(fd)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(L.LibraryError, match="not a regular file"):
            L.from_fd(fd)
    finally:
        os.close(fd)
