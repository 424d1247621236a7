"""The profile output formats round-trip: what is written reads back to the
same stacks and weights, by each format's own reader (or its schema)."""

from __future__ import annotations

import gzip
import json
import re
import time
from xml.etree import ElementTree

import pytest

from gfxbpf.client.profiles.flamegraph import build_tree
from gfxbpf.client.profiles.folded import FoldedError, parse_folded, read_folded
from gfxbpf.client.profiles.model import FrameInfo, Profile, Thread
from gfxbpf.client.profiles.speedscope import speedscope_document
from gfxbpf.client.profiles.writers import FORMATS, format_top, top_functions, write_profile
from gfxbpf.proto import pprof_pb2


def _profile(unit: str = "samples") -> Profile:
    return Profile(
        stacks={
            ("prog", "_start", "main", "hot"): 300,
            ("prog", "_start", "main", "cold"): 100,
            ("prog", "_start", "main", "hot", "[kernel]"): 7,
            ("prog", "[user stack lost]"): 2,
            ("other prog", "work spaces", "rec", "rec", "rec"): 11,
        },
        unit=unit,
        period_ns=10_101_010 if unit == "samples" else None,
        duration_s=2.5,
        notes=["a note for the user"],
    )


def test_formats_are_the_agreed_ones() -> None:
    assert FORMATS == ("folded", "pprof", "speedscope", "svg")


def test_folded_round_trip(tmp_path) -> None:
    p = _profile()
    path = tmp_path / "p.folded"
    write_profile(p, "folded", str(path))
    assert read_folded(str(path)) == p.stacks
    assert "prog;_start;main;hot 300\n" in path.read_text()


def test_folded_reader_adds_repeats_and_names_bad_lines() -> None:
    assert parse_folded(["a;b 1\n", "a;b 2\n", "\n", "c 4"]) == {("a", "b"): 3, ("c",): 4}
    with pytest.raises(FoldedError, match="line 2"):
        parse_folded(["a;b 1\n", "a;b x\n"])


@pytest.mark.parametrize("unit", ["samples", "calls", "nanoseconds"])
def test_pprof_decodes_to_the_same_totals(tmp_path, unit: str) -> None:
    p = _profile(unit)
    path = tmp_path / "p.pb.gz"
    write_profile(p, "pprof", str(path))
    msg = pprof_pb2.Profile()
    msg.ParseFromString(gzip.decompress(path.read_bytes()))
    strings = list(msg.string_table)
    assert strings[0] == ""
    names = {f.id: strings[f.name] for f in msg.function}
    loc_fn = {loc.id: loc.line[0].function_id for loc in msg.location}
    got: dict[tuple[str, ...], int] = {}
    for s in msg.sample:
        # innermost first in pprof; root first in a Profile
        stack = tuple(names[loc_fn[i]] for i in reversed(s.location_id))
        got[stack] = got.get(stack, 0) + s.value[0]
    assert got == p.stacks
    types = [(strings[t.type], strings[t.unit]) for t in msg.sample_type]
    if unit == "samples":
        assert types == [("samples", "count"), ("cpu", "nanoseconds")]
        assert msg.period == 10_101_010
        assert sum(s.value[1] for s in msg.sample) == p.total() * 10_101_010
    else:
        assert len(types) == 1 and all(len(s.value) == 1 for s in msg.sample)
    assert msg.duration_nanos == 2_500_000_000
    assert [strings[i] for i in msg.comment] == ["a note for the user"]


def test_pprofs_first_mapping_is_the_main_binary() -> None:
    """profile.proto: "mapping[0] will be the main binary"; pprof prints it as
    "File:". A PyTorch script's profile said "File: libc10.so" (mappings were
    sorted by name), though its weight ran from python3.11's _start; threads
    begin in libc, which a busy thread pool may outweigh."""
    from gfxbpf.client.profiles.pprof import pprof_message

    frames = {
        "_start": FrameInfo("_start", "_start", obj="/usr/local/bin/train"),
        "main": FrameInfo("main", "main", obj="/usr/local/bin/train"),
        "clone3": FrameInfo("clone3", "clone3", obj="/lib/x86_64-linux-gnu/libc.so.6"),
        "worker": FrameInfo("worker", "worker", obj="/opt/torch/lib/libc10.so"),
    }
    p = Profile(
        stacks={
            ("python", "_start", "main", "worker"): 3,
            ("python", "clone3", "worker"): 9,
        },
        unit="samples",
        frames=frames,
    )
    msg = pprof_message(p)
    files = [msg.string_table[m.filename] for m in msg.mapping]
    assert files[0] == "/usr/local/bin/train", files
    assert sorted(files[1:]) == files[1:] and len(files) == 3
    p.stacks = {("python", "clone3", "worker"): 9}  # no _start: by name, as before
    msg = pprof_message(p)
    assert [msg.string_table[m.filename] for m in msg.mapping] == sorted(files)


# From https://www.speedscope.app/file-format-schema.json: the "required" lists
# of FileFormat.File, of its "shared" object, of FileFormat.SampledProfile and
# of FileFormat.Frame, and the FileFormat.ValueUnit enum.
FILE_REQUIRED = {"$schema", "profiles", "shared"}
SHARED_REQUIRED = {"frames"}
SAMPLED_REQUIRED = {"endValue", "name", "samples", "startValue", "type", "unit", "weights"}
FRAME_REQUIRED = {"name"}
VALUE_UNITS = {"bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"}


def test_speedscope_has_one_profile_per_thread_and_frames_with_file_and_line() -> None:
    """A thread renamed while sampled (its name at exec) stays one profile,
    named as most of its samples were; frames keep the function alone."""
    py = "step (/srv/t.py:9)"
    threads = {
        (Thread(5, 5, "t", "python"), ("t", "fork")): 1,
        (Thread(5, 5, "t", "trainer"), ("t", py)): 6,
        (Thread(5, 6, "t", "loader"), ("t", py)): 2,
    }
    frames = {py: FrameInfo("step", file="/srv/t.py", line=9), "fork": FrameInfo("fork", obj="/l")}
    stacks = {("t", "fork"): 1, ("t", py): 8}
    doc = speedscope_document(Profile(stacks, "samples", threads=threads, frames=frames))
    names = [p["name"] for p in doc["profiles"]]
    assert names == [
        "t (pid 5) thread trainer (tid 5) (samples)",
        "t (pid 5) thread loader (tid 6) (samples)",
    ]
    assert [p["endValue"] for p in doc["profiles"]] == [7, 2] and doc["activeProfileIndex"] == 0
    assert {"name": "step", "file": "/srv/t.py", "line": 9} in doc["shared"]["frames"]
    assert {"name": "fork", "file": "/l"} in doc["shared"]["frames"]


@pytest.mark.parametrize("unit", ["samples", "calls", "nanoseconds"])
def test_speedscope_has_the_schema_fields_and_the_same_stacks(tmp_path, unit: str) -> None:
    p = _profile(unit)
    path = tmp_path / "p.speedscope.json"
    write_profile(p, "speedscope", str(path))
    doc = json.loads(path.read_text())
    assert FILE_REQUIRED <= doc.keys()
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert SHARED_REQUIRED <= doc["shared"].keys()
    frames = doc["shared"]["frames"]
    assert all(FRAME_REQUIRED <= f.keys() and isinstance(f["name"], str) for f in frames)
    (prof,) = doc["profiles"]
    assert SAMPLED_REQUIRED <= prof.keys()
    assert prof["type"] == "sampled" and prof["unit"] in VALUE_UNITS
    assert isinstance(prof["name"], str)
    assert len(prof["samples"]) == len(prof["weights"])
    got: dict[tuple[str, ...], int] = {}
    for sample, w in zip(prof["samples"], prof["weights"], strict=True):
        stack = tuple(frames[i]["name"] for i in sample)
        got[stack] = got.get(stack, 0) + w
    assert got == p.stacks
    assert prof["endValue"] - prof["startValue"] == p.total()


def test_svg_has_one_frame_per_call_tree_node(tmp_path) -> None:
    p = _profile()
    path = tmp_path / "p.svg"
    write_profile(p, "svg", str(path))
    text = path.read_text()
    # Distinct root-first prefixes of the stacks, plus the "all" root.
    prefixes = {s[:i] for s in p.stacks for i in range(1, len(s) + 1)}
    assert text.count('<g class="f"') == len(prefixes) + 1
    assert "<title>prog (409 samples," in text
    assert "work spaces" in text  # a space in a name is kept
    assert not re.search(r"""(src|href)=["']https?:""", text), "must load nothing"


def test_svg_is_well_formed_xml_whatever_the_names(tmp_path) -> None:
    odd = "operator<<(std::ostream&, Foo const&) ]]> \x01 \"q\" 'a'"
    p = Profile(stacks={("prog", odd): 3, ("prog", "<script>x</script>"): 1}, unit="calls")
    path = tmp_path / "odd.svg"
    write_profile(p, "svg", str(path))
    root = ElementTree.parse(path).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    titles = [t.text or "" for t in root.iterfind(".//s:g/s:title", ns)]
    # A control character is written as its escape (gfxbpf.client.printable).
    assert any(t.startswith("operator<<(std::ostream&, Foo const&) ]]> \\x01 ") for t in titles)
    assert not root.findall(".//s:g/s:script", ns), "a name never becomes markup"


def test_svg_says_time_in_readable_units(tmp_path) -> None:
    p = Profile(stacks={("prog", "wait"): 2_500_000, ("prog", "spin"): 900}, unit="nanoseconds")
    path = tmp_path / "t.svg"
    write_profile(p, "svg", str(path))
    text = path.read_text()
    assert "<title>wait (2.5 ms, 99.96%)</title>" in text
    assert "<title>spin (900 ns, 0.04%)</title>" in text


def test_tree_weights_add_up() -> None:
    root = build_tree(_profile())
    assert root.weight == 420
    assert root.children["prog"].children["_start"].children["main"].weight == 407


def test_top_self_and_total() -> None:
    rows = {name: (s, t) for name, s, t in top_functions(_profile(), 100)}
    assert rows["hot"] == (300, 307)
    assert rows["main"] == (0, 407)
    assert rows["[kernel]"] == (7, 7)
    assert rows["rec"] == (11, 11)  # recursion counts once per stack
    assert "prog" not in rows  # the root frame is the process, not a function
    assert top_functions(_profile(), 1) == [("hot", 300, 307)]
    lines = format_top(_profile(), 3).splitlines()
    assert lines[0].split() == ["SELF", "samples", "TOTAL", "samples", "FUNCTION"]
    assert lines[1].split() == ["71.4%", "300", "73.1%", "307", "hot"]
    assert len(lines) == 4, "the table only: the caller prints the notes"
    assert format_top(Profile(stacks={}, unit="calls"), 3).splitlines()[1] == "(no calls)"


def test_unknown_format_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="choose one of folded, pprof, speedscope, svg"):
        write_profile(_profile(), "png", str(tmp_path / "x"))
    assert list(tmp_path.iterdir()) == []


def test_ten_thousand_stacks_fold_and_write_quickly(tmp_path) -> None:
    stacks = {
        ("bench", "_start", "main", f"f{i % 97}", f"g{i % 1013}", f"leaf{i}"): 1 + i % 5
        for i in range(10_000)
    }
    p = Profile(stacks=stacks, unit="samples", period_ns=1_010_101)
    times = {}
    for fmt in FORMATS:
        t0 = time.perf_counter()
        write_profile(p, fmt, str(tmp_path / f"p.{fmt}"))
        times[fmt] = time.perf_counter() - t0
    print("10,000 stacks: " + ", ".join(f"{f} {t * 1000:.0f} ms" for f, t in times.items()))
    assert read_folded(str(tmp_path / "p.folded")) == stacks
    # Generous for a shared 2-CPU machine; the figure above is the measurement.
    assert max(times.values()) < 10.0
