"""tests/corpus.py finds BPF ELF images embedded in an executable's bytes."""

from __future__ import annotations

from pathlib import Path

from tests.corpus import extract_bpf_objects

CATALOG_OBJECT = Path(__file__).resolve().parents[2] / "catalog" / "programs" / "syscount.bpf.o"


def test_finds_embedded_objects_exactly() -> None:
    obj = CATALOG_OBJECT.read_bytes()
    host = b"\x7fELF" + b"\0" * 60  # the executable's own header: never a match
    blob = host + b"junk\x7fELFnot-an-elf" + obj + b"\0" * 13 + obj + b"tail"
    found = extract_bpf_objects(blob, "tool")
    assert [f.data for f in found] == [obj, obj]
    assert [f.name for f in found] == ["tool", "tool1"]


def test_ignores_non_bpf_elf_images() -> None:
    obj = bytearray(CATALOG_OBJECT.read_bytes())
    obj[18:20] = (62).to_bytes(2, "little")  # EM_X86_64
    assert extract_bpf_objects(b"\0" * 8 + bytes(obj), "tool") == []


def test_truncated_image_is_not_returned() -> None:
    obj = CATALOG_OBJECT.read_bytes()
    assert extract_bpf_objects(b"\0" * 8 + obj[: len(obj) // 2], "tool") == []
