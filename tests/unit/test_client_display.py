"""gfxbpf.client.cli.display: units, rates, tables and bpftrace-style histograms."""

from __future__ import annotations

import io
import json

import pytest

from gfxbpf.client import mapdata as md
from gfxbpf.client.cli import display as d


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (10 * 1024 + 300, "10.3 KiB"),
        (1023.9 * 1024, "1.00 MiB"),
        (3 << 20, "3.00 MiB"),
        (5 << 40, "5.00 TiB"),
        (-2048, "-2.00 KiB"),
    ],
)
def test_humanize_bytes(n: float, text: str) -> None:
    assert d.humanize_bytes(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 ns"),
        (999, "999 ns"),
        (999.6, "1.00 µs"),
        (1500, "1.50 µs"),
        (999_600, "1.00 ms"),
        (2_500_000, "2.50 ms"),
        (123_456_789, "123 ms"),
        (3e9, "3.00 s"),
    ],
)
def test_humanize_ns(n: float, text: str) -> None:
    assert d.humanize_ns(n) == text


def test_values_and_rates_by_unit() -> None:
    assert d.format_value(1234567, "count") == "1,234,567"
    assert d.format_value(1234567, "") == "1,234,567"
    assert d.format_value(4096, "bytes") == "4.00 KiB"
    assert d.format_value(1500, "ns") == "1.50 µs"
    assert d.format_value("bash", "") == "bash"
    assert d.format_rate(None) == "-"
    assert d.format_rate(2.0) == "2.0/s"
    assert d.format_rate(12345.4) == "12,345/s"
    assert d.format_rate(2048, "bytes") == "2.00 KiB/s"
    assert d.format_rate(1_500_000, "ns") == "1.50 ms/s"


def test_hist_edges() -> None:
    assert d.slot_bounds(0) == (0, 2)
    assert d.slot_bounds(10) == (1024, 2048)
    assert d.hist_edge(1024) == "1K"
    assert d.hist_edge(1 << 20) == "1M"
    assert d.hist_edge(512) == "512"
    assert d.hist_edge(1024, "bytes") == "1KiB"
    assert d.hist_edge(64, "bytes") == "64B"
    assert d.hist_edge(1 << 30, "bytes") == "1GiB"
    assert d.hist_edge(1024, "ns") == "1.02µs"


def test_histogram_exact_text() -> None:
    lines = d.render_histogram("bind_size", {10: 12, 11: 3, 13: 48}, "bytes", width=16)
    assert lines == [
        "@bind_size:",
        "[1KiB, 2KiB)        12 |@@@@            |",
        "[2KiB, 4KiB)         3 |@               |",
        "[4KiB, 8KiB)         0 |                |",
        "[8KiB, 16KiB)       48 |@@@@@@@@@@@@@@@@|",
    ]


def test_histogram_default_width_and_group_title() -> None:
    lines = d.render_histogram("x", {0: 5, 1: 10}, group="i915, ring0")
    assert lines[0] == "@x[i915, ring0]:"
    assert lines[1].startswith("[0, 2) ")
    assert lines[2].endswith("|" + "@" * d.BAR_WIDTH + "|")
    assert d.render_histogram("x", {}) == ["@x:", "  (empty)"]


def test_split_histogram_groups_by_other_key_members() -> None:
    entries = [
        ({"driver": "i915", "timeline": "r0", "slot": 3}, 2),
        ({"driver": "i915", "timeline": "r0", "slot": 5}, 1),
        ({"driver": "xe", "timeline": "r1", "slot": 3}, 7),
        (4, 9),  # a plain slot key: the unnamed group
        ({"driver": "bad", "slot": 999}, 1),  # nonsense slot: ignored
    ]
    groups = d.split_histogram(entries)
    assert groups == {"i915, r0": {3: 2, 5: 1}, "xe, r1": {3: 7}, "": {4: 9}}
    rows = d.histogram_json(md.MapData("h", "log2_histogram", entries=entries[:2]))
    assert rows == [
        {"key": "i915, r0", "slot": 3, "low": 8, "high": 16, "value": 2},
        {"key": "i915, r0", "slot": 5, "low": 32, "high": 64, "value": 1},
    ]


def test_rates_per_key_and_member() -> None:
    prev = md.MapData("c", entries=[(1, 10), (2, 50), ({"comm": "x"}, 1)])
    cur = md.MapData("c", entries=[(1, 30), (2, 40), (3, 4), ({"comm": "x"}, 3)])
    r = d.rates(prev, cur, 2.0)
    assert r[d.key_id(1)] == 10.0
    assert d.key_id(2) not in r  # went down: no rate
    assert r[d.key_id(3)] == 2.0  # new key counts from zero
    assert r[d.key_id({"comm": "x"})] == 1.0
    table_prev = md.MapData("t", "table", entries=[(1, {"binds": 1, "name": "a"})])
    table_cur = md.MapData("t", "table", entries=[(1, {"binds": 5, "name": "a"})])
    assert d.rates(table_prev, table_cur, 1.0) == {d.key_id(1): {"binds": 4.0}}
    assert d.rates(None, cur, 1.0) == {}


def test_counter_table_sorted_with_rates_and_limit() -> None:
    data = md.MapData("counts", "counter", "count", "syscall", entries=[(0, 5), (1, 500), (2, 50)])
    r = d.rates(md.MapData("counts", entries=[(1, 400)]), data, 1.0)
    lines = d.render_counter(data, r, key_format=lambda k: f"nr{k}", limit=2)
    assert lines == [
        "  SYSCALL  COUNT     RATE",
        "  nr1        500  100.0/s",
        "  nr2         50   50.0/s",
        "  ... 1 more",
    ]


def test_struct_table_columns() -> None:
    data = md.MapData(
        "vm_stats",
        "table",
        key_label="address space",
        entries=[
            (1, {"bytes_bound": 4096, "binds": 2}),
            (2, {"bytes_bound": 1 << 20, "binds": 1}),
        ],
    )
    lines = d.render_table(data)
    assert lines[0].split() == ["ADDRESS", "SPACE", "BYTES_BOUND", "BINDS", "BYTES_BOUND/S"]
    assert lines[1].split()[:3] == ["2", "1.00", "MiB"]  # largest first, bytes humanised


def test_sum_cpus() -> None:
    assert md.sum_cpus([1, 2, 3]) == 6
    assert md.sum_cpus([{"a": 1, "s": "x"}, {"a": 2, "s": "y"}]) == {"a": 3, "s": "x"}
    assert md.sum_cpus(7) == 7


def test_entries_json_labels_and_order() -> None:
    data = md.MapData("counts", "counter", entries=[(39, 1), (0, 9)])
    rows = d.entries_json(data, {}, key_format=lambda k: {0: "read", 39: "getpid"}[k])
    assert rows == [
        {"key": 0, "value": 9, "label": "read", "rate": None},
        {"key": 39, "value": 1, "label": "getpid", "rate": None},
    ]


def test_format_event_and_key() -> None:
    ev = {"pid": 7, "comm": "my prog", "filename": "/bin/ls", "empty": ""}
    line = d.format_event(ev, "12:00:00.000")
    assert line == '12:00:00.000 pid=7 comm="my prog" filename=/bin/ls empty=""'
    assert d.format_key({"comm": "bash"}) == "bash"
    assert d.format_key({"a": 1, "b": "x"}) == "a=1, b=x"
    assert d.jsonable({"b": b"\x01\x02", "l": [1, b"\xff"]}) == {"b": "0102", "l": [1, "ff"]}


def test_clip_never_overflows_the_terminal() -> None:
    lines = ["x" * 50, "short", *[str(i) for i in range(10)]]
    out = d.clip(lines, 20, 5)
    assert len(out) == 5
    assert all(len(ln) <= 20 for ln in out)
    assert out[0].endswith("…")
    assert out[-1].startswith("... 8 more lines")


def test_screen_restores_cursor_and_screen() -> None:
    buf = io.StringIO()
    with d.Screen(buf) as screen:
        screen.draw(["a", "b"])
    text = buf.getvalue()
    assert text.startswith(d.ALT_SCREEN_ON + d.HIDE_CURSOR)
    assert d.HOME + "a" + d.CLEAR_EOL + "\nb" + d.CLEAR_EOL + d.CLEAR_BELOW in text
    assert text.endswith(d.SHOW_CURSOR + d.ALT_SCREEN_OFF)


def test_json_line_writes_decoded_values_as_jsonable_does() -> None:
    # The fast path (C encoder, bytes through its hook) and the fallback for
    # non-finite floats must both give what json.dumps(d.jsonable(doc)) gives.
    docs = [
        {"entries": [{"key": {"comm": "bash"}, "value": 3}, {"key": b"\x01\xff", "value": None}]},
        {"v": bytearray(b"\x02"), "t": (1, 2.5, True), "s": "é"},
        {"f": float("inf"), "g": [float("nan"), b"\x00"], "n": {"x": -1.5}},
    ]
    for doc in docs:
        assert d.json_line(doc) == json.dumps(d.jsonable(doc), ensure_ascii=False)
    assert json.loads(d.json_line(docs[2])) == {"f": "inf", "g": ["nan", "00"], "n": {"x": -1.5}}
