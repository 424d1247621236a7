"""The one disk cache (client/profiles/diskcache.py) under both the symbol
and the unwind tables: a table is loaded only from the caller's own folder,
not writable by others, and only from the caller's own file (issue 35 item
11: the symbol cache's load checked neither, so another user who could
write the folder named libz's frames with hers). Run as root, the test
plants what another user (uid NOBODY) would."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import pytest

from gfxbpf.client.profiles import diskcache, symtab
from gfxbpf.client.profiles.unwind import cache as unwind_cache
from gfxbpf.client.profiles.unwind.compiled import NO_RULE, FileTable

NOBODY = 65534
SEGMENTS = ((0, 0, 0x1000),)
TABLE = symtab.SymbolTable.build(SEGMENTS, [(0x10, 4, "zz_mallory")])
UNWIND = FileTable(SEGMENTS, array("I", [0x10, 0x20]), array("H", [1, 0]), [NO_RULE, NO_RULE],
                   array("I", [0x10]), array("I", [0x20]), "planted")  # fmt: skip

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="plants files as another uid (root)")


def _both_load(folder: Path, key: str) -> tuple[object, object]:
    return symtab.load(str(folder), key), unwind_cache.load(str(folder), key)


def test_the_callers_own_folder_and_file_load(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    symtab.store(str(folder), "sym", TABLE)
    unwind_cache.store(str(folder), "unw", UNWIND)
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert symtab.load(str(folder), "sym") == TABLE
    assert unwind_cache.load(str(folder), "unw") is not None


@needs_root
def test_a_folder_another_user_owns_or_may_write_is_not_used(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "k").write_bytes(TABLE.encode())
    os.chown(theirs, NOBODY, NOBODY)
    assert _both_load(theirs, "k") == (None, None)  # main: the symbol table loaded
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "k").write_bytes(TABLE.encode())
    os.chmod(shared, 0o777)
    assert _both_load(shared, "k") == (None, None)
    symtab.store(str(shared), "k2", TABLE)
    assert not (shared / "k2").exists(), "a table was written where others may write"


@needs_root
def test_a_file_another_user_planted_or_linked_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    symtab.store(str(folder), "ok", TABLE)
    planted = folder / "planted"
    planted.write_bytes(TABLE.encode())
    os.chown(planted, NOBODY, NOBODY)
    assert _both_load(folder, "planted") == (None, None)
    (folder / "link").symlink_to(folder / "ok")
    assert _both_load(folder, "link") == (None, None)
    os.mkfifo(folder / "fifo")
    assert _both_load(folder, "fifo") == (None, None)  # no hang
    assert symtab.load(str(folder), "ok") == TABLE


def test_prune_keeps_the_most_recently_used(tmp_path: Path) -> None:
    for i, key in enumerate(("a", "b", "c")):
        diskcache.store(str(tmp_path), key, b"x" * 100)
        os.utime(tmp_path / key, ns=(i * 10**9, i * 10**9))
    assert diskcache.load(str(tmp_path), "a") == b"x" * 100  # used now: newest
    diskcache.prune(str(tmp_path), limit=200)
    assert sorted(os.listdir(tmp_path)) == ["a", "c"]
