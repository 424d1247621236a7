"""What a refused perf_event_open says (bpf/link/perf.py): at Debian's and
Ubuntu's added paranoid levels CAP_PERFMON is not enough, and the message
must say that rather than suggest the capability the broker already holds."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gfxbpf.bpf.link import perf


def _level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = tmp_path / "perf_event_paranoid"
    path.write_text(text)
    monkeypatch.setattr(perf, "PARANOID", str(path))


@pytest.mark.parametrize("level", [3, 4])
def test_admin_only_levels_name_cap_sys_admin_and_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    _level(tmp_path, monkeypatch, f"{level}\n")
    assert perf.perf_event_paranoid() == level
    for err in (errno.EACCES, errno.EPERM):
        hint = perf._hint(err)
        assert f"kernel.perf_event_paranoid is {level}" in hint
        assert "only CAP_SYS_ADMIN" in hint and "CAP_PERFMON is not enough" in hint
        assert "sets it to 2" in hint


@pytest.mark.parametrize("text", ["2\n", "-1\n", "", "x"])
def test_upstream_levels_keep_the_plain_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    _level(tmp_path, monkeypatch, text)
    assert perf._hint(errno.EACCES) == (
        " (needs CAP_PERFMON or root, or a lower kernel.perf_event_paranoid)"
    )


def test_an_unreadable_sysctl_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perf, "PARANOID", str(tmp_path / "absent"))
    assert perf.perf_event_paranoid() is None
    assert "CAP_SYS_ADMIN" not in perf._hint(errno.EACCES)
