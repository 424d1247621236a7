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
    monkeypatch.setattr(perf, "_holds_cap_sys_admin", lambda: False)  # the broker's caps
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: False)  # such a kernel's answer
    assert perf.perf_event_paranoid() == level
    assert perf.perf_events_refused() == perf.admin_only_message(level)
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


def test_a_level_the_kernel_lets_pass_is_not_blamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ubuntu's 3 acts as upstream's 2 (its admin-only level is 4): where the
    kernel opens a perf event, nothing is refused for the level."""
    _level(tmp_path, monkeypatch, "3\n")
    monkeypatch.setattr(perf, "_holds_cap_sys_admin", lambda: False)
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: True)
    assert perf.perf_events_refused() is None
    assert "CAP_SYS_ADMIN" not in perf._hint(errno.EACCES)


def test_a_refused_open_asks_the_kernel_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's 3, the broker's caps: perf_event_open's refusal names the level
    after one probe of its own (whose refusal must not ask again: a broker
    once died of the recursion at start)."""
    _level(tmp_path, monkeypatch, "3\n")
    monkeypatch.setattr(perf, "_holds_cap_sys_admin", lambda: False)
    calls = []

    def refuse(*args: object) -> int:
        calls.append(args)
        return -errno.EACCES

    monkeypatch.setattr(perf, "_open", refuse)
    attr = perf.PerfEventAttr(type=perf.PERF_TYPE_SOFTWARE, config=perf.PERF_COUNT_SW_CPU_CLOCK)
    with pytest.raises(OSError) as ei:
        perf.perf_event_open(attr, 0, -1)
    assert ei.value.errno == errno.EACCES and "kernel.perf_event_paranoid is 3" in str(ei.value)
    assert len(calls) == 2  # the open, then the probe
    assert perf.perf_events_refused() == perf.admin_only_message(3)


def test_the_kernel_is_asked_for_real() -> None:
    """The probe opens a dummy event on this process, user space only: any
    level up to 2 allows it, and so does CAP_SYS_ADMIN at any level."""
    import os

    level = perf.perf_event_paranoid()
    if os.geteuid() == 0 or (level is not None and level <= 2):
        assert perf._may_open_perf_events()
    if os.geteuid() == 0 and level is not None and level <= 2:
        assert perf._may_open_without_admin() is True  # nobody, too


@pytest.mark.parametrize("opens", [True, False])
def test_a_check_run_by_root_asks_as_the_broker_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opens: bool
) -> None:
    """--check-policy runs as root, whose CAP_SYS_ADMIN opens perf events at
    every level: the kernel is asked by a child that became nobody (forked:
    it answers with the probe patched here)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("becoming nobody needs root")  # the kernel suite runs as root
    _level(tmp_path, monkeypatch, "3\n")
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: opens)
    assert perf._may_open_without_admin() is opens
    assert perf.refusing_level_for_broker() == (None if opens else 3)


def test_a_child_that_cannot_become_nobody_counts_the_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _level(tmp_path, monkeypatch, "4\n")
    monkeypatch.setattr(perf, "_holds_cap_sys_admin", lambda: True)
    monkeypatch.setattr(perf, "_may_open_without_admin", lambda: None)
    assert perf.refusing_level_for_broker() == 4


def test_an_unreadable_sysctl_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perf, "PARANOID", str(tmp_path / "absent"))
    assert perf.perf_event_paranoid() is None
    assert "CAP_SYS_ADMIN" not in perf._hint(errno.EACCES)
