"""Knobs from stored GPU format files, variant choice, clear unavailability (no kernel)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gfxbpf.bpf.link import tracefs
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import read_object

FORMATS = Path(__file__).resolve().parent.parent / "data" / "formats"
CATALOG = load_catalog()
# drm_sched_job and drm_run_job are two events of one class (same layout).
ALIASES = {("gpu_scheduler", "drm_sched_job"): ("gpu_scheduler", "drm_run_job")}


def stored_format(system: str, event: str) -> tracefs.EventFormat:
    system, event = ALIASES.get((system, event), (system, event))
    return tracefs.parse_format((FORMATS / system / event).read_text())


def exists_only(*present: str):
    return lambda system, event: f"{system}/{event}" in present


def test_vmabind_knobs_come_from_the_i915_format_file() -> None:
    entry = CATALOG.get("vmabind")
    spec, variant = instance.prepare(
        entry,
        read_object(entry),
        instance.Params(),
        exists=lambda s, e: True,
        read_format=stored_format,
    )
    assert variant is None
    bind = stored_format("i915", "i915_vma_bind").fields
    assert bind["vm"].offset == 16 and bind["size"].offset == 32
    assert spec.get_variable("off_bind_vm") == 16
    assert spec.get_variable("off_bind_size") == 32
    assert spec.get_variable("off_unbind_vm") == 16


def test_a_moved_field_moves_the_knob() -> None:
    entry = CATALOG.get("vmabind")
    text = (FORMATS / "i915" / "i915_vma_bind").read_text()
    moved = text.replace("offset:16;", "offset:48;")  # a future kernel moves `vm`

    def reader(system: str, event: str) -> tracefs.EventFormat:
        if event == "i915_vma_bind":
            return tracefs.parse_format(moved)
        return stored_format(system, event)

    spec, _ = instance.prepare(
        entry, read_object(entry), instance.Params(), exists=lambda s, e: True, read_format=reader
    )
    assert spec.get_variable("off_bind_vm") == 48


def test_a_missing_field_names_the_tracepoint_and_field() -> None:
    entry = CATALOG.get("vmabind")
    text = (FORMATS / "i915" / "i915_vma_bind").read_text().replace(" vm;", " address_space;")

    def reader(system: str, event: str) -> tracefs.EventFormat:
        if event == "i915_vma_bind":
            return tracefs.parse_format(text)
        return stored_format(system, event)

    with pytest.raises(instance.FieldMissing, match=r"i915:i915_vma_bind has no field 'vm'"):
        instance.prepare(
            entry,
            read_object(entry),
            instance.Params(),
            exists=lambda s, e: True,
            read_format=reader,
        )


def test_drmsched_picks_the_variant_whose_events_exist() -> None:
    entry = CATALOG.get("drmsched")
    new = exists_only(
        "gpu_scheduler/drm_sched_job_queue",
        "gpu_scheduler/drm_sched_job_run",
        "gpu_scheduler/drm_sched_job_done",
    )
    legacy = exists_only(
        "gpu_scheduler/drm_sched_job",
        "gpu_scheduler/drm_run_job",
        "gpu_scheduler/drm_sched_process_job",
    )
    assert instance.choose_variant(entry, new) == "6.17+"
    assert instance.choose_variant(entry, legacy) == "legacy"
    spec, variant = instance.prepare(
        entry, read_object(entry), instance.Params(), exists=legacy, read_format=stored_format
    )
    assert variant == "legacy"
    run = stored_format("gpu_scheduler", "drm_run_job").fields
    assert spec.get_variable("off_lr_fence") == run["fence"].offset
    with pytest.raises(instance.Unavailable, match="gpu_scheduler:.*does not exist"):
        instance.choose_variant(entry, exists_only())


def test_vmabind_unavailable_message_is_for_people() -> None:
    reason = instance.availability(CATALOG.get("vmabind"), exists_only())
    assert reason == (
        "needs an Intel GPU on the i915 driver (the i915:i915_vma_bind tracepoint): "
        "tracepoint i915:i915_vma_bind does not exist on this kernel: "
        "the i915 driver must be loaded (an Intel GPU, modprobe i915)"
    )


def test_scope_knobs_are_written() -> None:
    entry = CATALOG.get("ucalls")
    spec, _ = instance.prepare(
        entry, read_object(entry), instance.Params(uid=1001, pid=4242), exists=lambda s, e: True
    )
    assert spec.get_variable("target_uid") == 1001
    assert spec.get_variable("target_pid") == 4242
    with pytest.raises(instance.ParameterError):
        instance.prepare(
            CATALOG.get("vmabind"),
            read_object(CATALOG.get("vmabind")),
            instance.Params(uid=5),
            exists=lambda s, e: True,
            read_format=stored_format,
        )


def test_a_knob_the_object_lacks_is_a_catalog_mismatch() -> None:
    entry = dataclasses.replace(CATALOG.get("ucalls"), uid_knob="no_such_knob")
    with pytest.raises(instance.CatalogMismatch) as ei:
        instance.prepare(
            entry, read_object(entry), instance.Params(uid=5), exists=lambda s, e: True
        )
    assert isinstance(ei.value, ValueError) and isinstance(ei.value.__cause__, KeyError)
    assert str(ei.value) == str(ei.value.__cause__)  # the broker's message is unchanged
    assert "has no global variable 'no_such_knob'" in str(ei.value)


@pytest.mark.parametrize("release", ["6.1.0-56-amd64", "6.5.13"])
def test_uprobe_programs_are_refused_before_linux_6_6_with_the_reason(release: str) -> None:
    """Before 6.6 there are no uprobe_multi links (tests/kernel/test_stock_kernels.py
    shows 6.1's EINVAL): the broker says so instead of passing the bare errno on."""
    for name in ("ucalls", "cuda", "cudakernels", "memstacks"):
        with pytest.raises(instance.Unavailable, match=f"'{name}'.*Linux 6.6.*{release}"):
            instance.require_uprobe_multi(CATALOG.get(name), release)
    for name in ("stackcopy", "offcpu", "profile", "syscount"):  # perf events, tracepoints
        instance.require_uprobe_multi(CATALOG.get(name), release)


@pytest.mark.parametrize("release", ["6.6.0", "6.12.117+deb12-amd64", "6.18.44-fc-v657"])
def test_uprobe_programs_are_taken_from_linux_6_6(release: str) -> None:
    instance.require_uprobe_multi(CATALOG.get("ucalls"), release)


def _host(tmp: Path, monkeypatch: pytest.MonkeyPatch, level: int, cap_eff: int) -> None:
    """A kernel at perf_event_paranoid level, this process with CapEff cap_eff."""
    from gfxbpf.bpf.link import perf

    (tmp / "paranoid").write_text(f"{level}\n")
    (tmp / "status").write_text(f"Name:\tpython3\nCapEff:\t{cap_eff:016x}\n")
    monkeypatch.setattr(perf, "PARANOID", str(tmp / "paranoid"))
    monkeypatch.setattr(perf, "STATUS", str(tmp / "status"))
    # Debian's kernel at 3: perf_event_open refuses a process without CAP_SYS_ADMIN
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: level < 3)


BROKER_CAPS = 1 << 38 | 1 << 39  # CAP_PERFMON, CAP_BPF


def test_perf_programs_are_unavailable_at_debians_level_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 3 perf_event_open asks for CAP_SYS_ADMIN: the broker says so in
    `gfxclient list` and refuses before loading, instead of a bare EACCES."""
    _host(tmp_path, monkeypatch, 3, BROKER_CAPS)
    for name in ("stackcopy", "profile", "cgroupcpu", "clonecount"):
        reason = instance.availability(CATALOG.get(name), lambda s, e: True)
        assert reason and f"'{name}' attaches through perf events" in reason
        assert "kernel.perf_event_paranoid is 3" in reason and "CAP_SYS_ADMIN" in reason
    with pytest.raises(instance.Unavailable, match="perf_event_paranoid is 3"):
        entry = CATALOG.get("stackcopy")
        instance.prepare(entry, read_object(entry), instance.Params(), exists=lambda s, e: True)
    # BPF links need no perf event: tp_btf, raw tracepoints.
    for name in ("offcpu", "syscount", "execsnoop"):
        assert instance.availability(CATALOG.get(name), lambda s, e: True) is None
    # execsnoop's build for kernels without BTF is on a tracepoint: it does.
    instance.require_perf_events(CATALOG.get("execsnoop"), "btf")
    with pytest.raises(instance.Unavailable, match="'execsnoop' attaches through perf events"):
        instance.require_perf_events(CATALOG.get("execsnoop"), "tracefs")


@pytest.mark.parametrize(("level", "cap_eff"), [(2, BROKER_CAPS), (-1, 0), (3, 1 << 21)])
def test_perf_programs_are_available_where_the_kernel_lets_this_process_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: int, cap_eff: int
) -> None:
    """Upstream's levels, or CAP_SYS_ADMIN (root's tests, bench) at 3."""
    _host(tmp_path, monkeypatch, level, cap_eff)
    assert instance.availability(CATALOG.get("stackcopy"), lambda s, e: True) is None
    instance.require_perf_events(CATALOG.get("clonecount"), None)
