"""Where gfxclient keeps its gRPC tokens (gfxbpf.client.tokens.cache_dir), issue
26 item 9: a squatted /tmp/gfxbpf-<uid> must not lock the user out. The attack
as real users against a real broker is in tests/kernel/test_client_attacks.py;
here the directories are made by root and chowned to a uid that is not ours."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from gfxbpf.client import tokens

OTHER = 4242  # a uid that is neither ours nor root's


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(a sticky, world-writable tmp like /tmp; a home of ours), XDG_RUNTIME_DIR unset."""
    if os.getuid() != 0:
        pytest.skip("needs root to make another user's directories")
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    home.mkdir(mode=0o755)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GFXBPF_TOKEN_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp, home


def test_home_comes_before_a_squatted_tmp(dirs: tuple[Path, Path]) -> None:
    tmp, home = dirs
    squat = tmp / f"gfxbpf-{os.getuid()}"
    squat.mkdir(mode=0o700)
    os.chown(squat, OTHER, OTHER)
    got = tokens.cache_dir()
    assert got == home / ".cache" / "gfxbpf" / "tokens"
    assert (os.stat(got).st_mode & 0o777) == 0o700
    cache = tokens.TokenCache(got, clock=lambda: 1000.0)
    cache.put("k", "t", 5000)
    assert tokens.TokenCache(clock=lambda: 1000.0).get("k") == "t"


def test_no_home_falls_back_to_tmp_and_a_squat_there_means_no_cache(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp, home = dirs
    (home / "file").write_text("")
    monkeypatch.setenv("HOME", str(home / "file"))  # no usable home
    assert tokens.cache_dir() == tmp / f"gfxbpf-{os.getuid()}"
    os.chown(tmp / f"gfxbpf-{os.getuid()}", OTHER, OTHER)
    assert tokens.cache_dir() is None


def test_a_folder_others_could_rename_from_is_not_used(dirs: tuple[Path, Path]) -> None:
    _, home = dirs
    os.chmod(home, 0o777)  # anyone may move ~/.cache away and put theirs there
    assert tokens.cache_dir() != home / ".cache" / "gfxbpf" / "tokens"
    os.chmod(home, 0o755)
    os.chown(home, OTHER, OTHER)  # a home folder of another user's
    assert tokens.cache_dir() != home / ".cache" / "gfxbpf" / "tokens"
    os.chown(home, 0, 0)
    assert tokens.cache_dir() == home / ".cache" / "gfxbpf" / "tokens"
