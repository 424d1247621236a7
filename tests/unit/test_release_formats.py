"""Every GPU program's knobs from every stored release's format files, and a
release that lacks a field the program reads makes it unavailable, naming it.

The expected offsets below are the kernel sources' layouts (as recorded in
tests/data/formats/README.md), written out independently of the stored files.
"""

from __future__ import annotations

import pytest

from gfxbpf.bpf.link import tracefs
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import FIELD_ABSENT, load_catalog
from gfxbpf.catalog.objects import read_object
from tests.release_formats import LACKS, RELEASES_DIR, RUNS, exists_in, reader_for, releases

CATALOG = load_catalog()
# fence needs only dma_fence (core kernel), so no release tree lacks it.
GPU_PROGRAMS = ("drmsched", "xe", "xid", "vblank", "vmabind", "amdgpu")


def test_the_release_trees_are_the_documented_ones() -> None:
    assert releases() == ["6.10", "6.11", "6.16", "6.17", "6.18", "drm-no-time", "nvidia-580"]
    readme = (RELEASES_DIR.parent / "README.md").read_text()
    for r in releases():
        assert f"releases/{r}/" in readme, f"README does not say where {r} comes from"


@pytest.mark.parametrize("release", releases())
def test_stored_layouts_are_c_struct_layouts(release: str) -> None:
    """Each field is naturally aligned and none overlaps the next: what the
    compiler gives the kernel's TP_STRUCT__entry on a 64-bit machine."""
    for path in sorted((RELEASES_DIR / release).glob("*/*")):
        fmt = tracefs.parse_format(path.read_text())
        assert fmt.name == path.name
        end = 8
        for f in fmt.event_fields.values():
            assert f.offset % min(f.size, 8) == 0, (path, f.name)
            assert f.offset >= end, (path, f.name)
            end = f.offset + f.size


def _prepare(name: str, release: str):
    entry = CATALOG.get(name)
    return instance.prepare(
        entry,
        read_object(entry),
        instance.Params(),
        exists=exists_in(release),
        read_format=reader_for(release),
    )


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda k: f"{k[1]}@{k[0]}")
def test_knobs_fill_from_each_release(key: tuple[str, str]) -> None:
    release, name = key
    want_variant, knobs = RUNS[key]
    entry = CATALOG.get(name)
    assert instance.availability(entry, exists_in(release), reader_for(release)) is None
    spec, variant = _prepare(name, release)
    assert variant == want_variant
    assert {k: spec.get_variable(k) for k in knobs} == knobs
    # Every field (and size) of the variant was written, none left at a guess.
    written = {k for f in entry.fields_for(variant) for k in (f.knob, f.size_knob) if k}
    assert written == set(knobs)


@pytest.mark.parametrize("key", sorted(LACKS), ids=lambda k: f"{k[1]}@{k[0]}")
def test_a_release_lacking_a_field_is_unavailable_naming_it(key: tuple[str, str]) -> None:
    release, name = key
    entry = CATALOG.get(name)
    reason = instance.availability(entry, exists_in(release), reader_for(release))
    assert reason is not None
    assert reason.startswith(f"needs {entry.requires}: ")
    assert LACKS[key] in reason
    with pytest.raises(instance.FieldMissing, match=LACKS[key]):
        _prepare(name, release)


ABSENT = [(r, n) for r in releases() for n in GPU_PROGRAMS if (r, n) not in RUNS | LACKS.keys()]


@pytest.mark.parametrize("key", ABSENT, ids=lambda k: f"{k[1]}@{k[0]}")
def test_programs_without_their_events_say_what_they_need(key: tuple[str, str]) -> None:
    release, name = key
    entry = CATALOG.get(name)
    reason = instance.availability(entry, exists_in(release), reader_for(release))
    assert reason is not None and "does not exist on this kernel" in reason
    assert entry.requires and reason.startswith(f"needs {entry.requires}: ")


def test_vmabind_reads_a_u32_size_on_kernels_that_had_one() -> None:
    # Older i915_trace.h declared __field(u32, size) (then flags at 36).
    stored = (RELEASES_DIR.parent / "i915" / "i915_vma_bind").read_text()
    old = stored.replace(
        "field:u64 size;\toffset:32;\tsize:8;", "field:u32 size;\toffset:32;\tsize:4;"
    )
    old = old.replace("field:unsigned flags;\toffset:40;", "field:unsigned flags;\toffset:36;")
    assert old != stored

    def read(system: str, event: str) -> tracefs.EventFormat:
        text = old if event == "i915_vma_bind" else old.replace("i915_vma_bind", event)
        return tracefs.parse_format(text)

    entry = CATALOG.get("vmabind")
    spec, _ = instance.prepare(
        entry, read_object(entry), instance.Params(), exists=lambda s, e: True, read_format=read
    )
    assert spec.get_variable("off_bind_size") == 32
    assert spec.get_variable("size_bind_size") == 4


def test_drmsched_runs_without_client_id_counting_client_0() -> None:
    # A 6.17-style kernel whose events lack client_id (an optional field).
    def read(system: str, event: str) -> tracefs.EventFormat:
        text = (RELEASES_DIR / "6.17" / system / event).read_text()
        lines = [ln for ln in text.splitlines() if " client_id;" not in ln]
        return tracefs.parse_format("\n".join(lines))

    entry = CATALOG.get("drmsched")
    assert instance.availability(entry, exists_in("6.17"), read) is None
    spec, variant = instance.prepare(
        entry, read_object(entry), instance.Params(), exists=exists_in("6.17"), read_format=read
    )
    assert variant == "6.17+"
    assert spec.get_variable("off_q_client") == FIELD_ABSENT
    assert spec.get_variable("off_r_client") == FIELD_ABSENT
    assert spec.get_variable("off_q_context") == 24  # the others as usual
