"""Python records of the stack-copy programs, the code objects they name and
mixed stacks (client/profiles/python/records.py, mixed.py; the BPF side is
catalog/programs/gfx_python.h, tested live in tests/kernel/test_python_frames.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gfxbpf.client.errors import ProtocolError
from gfxbpf.client.profiles import Symbolizer
from gfxbpf.client.profiles.copies import HEADER, CopyReader
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.python import records as py
from gfxbpf.client.profiles.python.mixed import mix, split_runs
from tests.event_stream import Records

ENTRY = py.FRAME_ENTRY
ASCII = 1 << 6 | 1 << 5 | 1 << 2  # PyUnicode state: ascii, compact, 1-byte kind


def py_record(
    tgid: int, tid: int, frames: list[tuple[int, int, int]], flags: int = 0, ts: int = 5
) -> bytes:
    head = py.HEADER.pack(tgid, tid, py.FLAG_PYTHON | flags, len(frames), 3 << 8 | 11, 0, ts)
    return head + b"".join(py.FRAME.pack(*f) for f in frames)


def stack_record(tgid: int, tid: int, ts: int = 5) -> bytes:
    return HEADER.pack(tgid, tid, 0, 0, 0x401000, 0x7FF0, 0, ts, 0, 0, 0, b"python3")


def code_value(
    name: str, filename: str, first: int, table: bytes, tlen: int | None = None
) -> bytes:
    head = py.CODE_HEAD.pack(
        3 << 8 | 11,
        first,
        ASCII,
        len(name),
        ASCII,
        len(filename),
        len(table) if tlen is None else tlen,
        0,
    )
    return (
        head
        + name.encode().ljust(py.NAME_BYTES, b"\0")
        + filename.encode().ljust(py.PATH_BYTES, b"\0")
        + table.ljust(py.TABLE_BYTES, b"\0")
    )


# A 3.11 location table: one entry (code 13: "no column", a one-line step of
# +1) covering 8 code units (length field 7 = units - 1).
ONE_LINE_PLUS_1 = bytes([0x80 | 13 << 3 | 7, 2])


def test_split_runs_cuts_at_entry_frames_innermost_first() -> None:
    frames = [("inner", 0), ("middle", ENTRY), ("cb", 0), ("outer", ENTRY), ("<module>", ENTRY)]
    assert split_runs(frames) == (("middle", "inner"), ("outer", "cb"), ("<module>",))


def test_split_runs_keeps_frames_after_the_last_entry() -> None:
    assert split_runs([("a", 0), ("b", 0)]) == (("b", "a"),)
    assert split_runs([]) == ()


def test_mix_puts_each_run_at_its_eval_loop_frame() -> None:
    native = ("main", "Py_BytesMain", "_PyEval_EvalFrameDefault", "PyObject_Call")
    native += ("_PyEval_EvalFrameDefault", "PyObject_Free")
    runs = (("middle", "inner"), ("<module>", "outer"))
    assert mix(native, runs) == (
        "main",
        "Py_BytesMain",
        "<module>",
        "outer",
        "PyObject_Call",
        "middle",
        "inner",
        "PyObject_Free",
    )


def test_mix_with_more_runs_than_loop_frames_keeps_them_at_the_outermost() -> None:
    native = ("[unwind stopped]", "_PyEval_EvalFrameDefault", "leaf")
    runs = (("inner",), ("outer",), ("<module>",))
    assert mix(native, runs) == ("[unwind stopped]", "<module>", "outer", "inner", "leaf")


def test_mix_without_a_loop_frame_puts_python_at_the_root() -> None:
    assert mix(("leaf",), (("b",), ("a",))) == ("a", "b", "leaf")
    assert mix(("a", "_PyEval_EvalFrameDefault"), ()) == ("a", "_PyEval_EvalFrameDefault")


def test_parse_a_python_record() -> None:
    rec = py_record(7, 8, [(0x1000, 3, ENTRY | 5 << py.TAG_SHIFT)], flags=py.FLAG_TRUNCATED)
    assert py.is_python(rec) and not py.is_python(stack_record(7, 8))
    r = py.parse(rec)
    assert (r.tgid, r.tid, r.version, r.truncated) == (7, 8, (3, 11), True)
    assert r.frames == ((0x1000, 3, ENTRY | 5 << py.TAG_SHIFT),)
    with pytest.raises(ProtocolError):
        py.parse(rec[:-1])  # a frame short


def test_chain_hash_matches_the_programs_fnv() -> None:
    h = 0xCBF29CE484222325
    for v in (0x1000, 3):
        h = ((h ^ v) * 0x100000001B3) & (1 << 64) - 1
    assert py.chain_hash([(0x1000, 3, ENTRY)]) == h | 1
    assert py.chain_hash([]) == 0
    assert py.chain_hash([(0x1000, 3, 0)]) != py.chain_hash([(0x1000, 4, 0)])


def test_decode_code_and_name_a_frame() -> None:
    info = py.decode_code(code_value("Model.forward", "/srv/model.py", 41, ONE_LINE_PLUS_1))
    assert (info.name, info.filename, info.firstlineno, info.complete) == (
        "Model.forward",
        "/srv/model.py",
        41,
        True,
    )
    assert info.line(2) == 42
    cut = py.decode_code(code_value("f", "f.py", 1, ONE_LINE_PLUS_1, tlen=5000))
    assert not cut.complete and len(cut.table) == py.TABLE_BYTES


def test_a_code_object_read_mid_change_is_named_as_such_not_printed() -> None:
    """Seen on an H200: a frame being set up under PyIter_Next named a "code
    object" whose name was stack bytes (NUL, \\x1e, C1); printed, it split a
    folded line and broke the readers of every line-based format."""
    garbage = "\x1e\xdd=\xc6z{\x9b\xfe\x00\x00"
    for name, filename in ((garbage, "/w/s.py"), ("f", "/w/\x00s.py")):
        info = py.decode_code(code_value(name, filename, 1, ONE_LINE_PLUS_1))
        got = py._frame_name(info, 0x7F00, 2)
        assert got == "[python code 0x7f00: not a code object when read]", got
    latin = py.decode_code(code_value("café", "/w/é.py", 1, ONE_LINE_PLUS_1))
    assert not py._frame_name(latin, 0x7F00, 2).startswith("[python code")


def test_code_book_reads_each_code_once_and_names_frames() -> None:
    key = py.CODE_KEY.pack(7, 5, 0x1000)
    table = {key: code_value("inner", "/w/s.py", 6, ONE_LINE_PLUS_1)}
    asked: list[list[bytes]] = []

    def lookup(keys: object) -> list[tuple[bytes, bytes]]:
        ks = list(keys)  # type: ignore[call-overload]
        asked.append(ks)
        return [(k, table[k]) for k in ks if k in table]

    book = py.CodeBook(lookup, lambda: list(table.items()))
    frame = (0x1000, 2, 5 << py.TAG_SHIFT)
    gone = (0x2000, 0, 0)
    book.want(7, [frame, gone])
    book.resolve()
    book.want(7, [frame, gone])  # known (or known to be gone): not asked again
    book.resolve()
    assert len(asked) == 1 and len(asked[0]) == 2
    assert book.name(7, frame) == "inner (/w/s.py:7)"
    assert book.name(7, gone) == "[python code 0x2000]"
    # the same address with another tag is another code object
    assert book.name(7, (0x1000, 2, 6 << py.TAG_SHIFT)) == "[python code 0x1000]"


def test_copy_reader_joins_a_python_record_to_its_threads_stack_record() -> None:
    key = py.CODE_KEY.pack(7, 0, 0x1000)
    table = {key: code_value("inner", "s.py", 6, ONE_LINE_PLUS_1)}
    book = py.CodeBook(lambda ks: [(k, table[k]) for k in ks if k in table], lambda: [])
    records = [
        py_record(7, 8, [(0x1000, 2, ENTRY)]),
        stack_record(7, 9),  # another thread between them: no Python frames
        stack_record(7, 8),
        stack_record(7, 8, ts=6),  # the next sample of thread 8 had no Python record
        py_record(7, 8, [(0x1000, 2, ENTRY)], ts=7),  # its stack record was dropped:
        stack_record(7, 8, ts=8),  # never joined to the next sample's
    ]
    reader = CopyReader(Records(records), lambda tgid, refresh: None, None, codes=book)  # type: ignore[arg-type]
    reader.drain()
    assert reader.records == 4 and reader.python.records == 2
    got = sorted((s.tid, s.python, s.python_starts, s.weight) for s in reader.raw_stacks())
    assert got == [
        (8, (), (), 2),
        (8, (("inner (s.py:7)",),), (("inner (s.py:7)", 6),), 1),  # starts at co_firstlineno
        (9, (), (), 1),  # each thread's stacks apart (RawStack.tid: pprof's label)
    ]
    assert reader.python.versions == {7: (3, 11)}


def test_symbolizer_names_python_frames_in_place_of_the_loop(tmp_path: object) -> None:
    raw = RawStack(
        pid=999_999_999,
        user=(),
        kernel=False,
        weight=3,
        comm="python3",
        python=(("outer (s.py:2)", "inner (s.py:7)"),),
    )
    prof = Symbolizer(cache_dir=str(tmp_path)).symbolize([raw], "samples")
    assert prof.stacks == {("python3", "outer (s.py:2)", "inner (s.py:7)"): 3}


def test_notes_for_a_python_that_is_not_walked() -> None:
    from gfxbpf.client.profiles.python import targets

    mapped = ["/usr/bin/python3.12", "/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0"]
    note = targets.process_note(4242, "python3", mapped, "/usr/bin/python3.12")
    assert note is not None and "process 4242 (python3) runs Python 3.12" in note
    assert "libpython3.12.so.1.0 (a shared build)" in note
    assert targets.process_note(1, "make", ["/usr/bin/make"], "/usr/bin/make") is None


def test_report_lists_interpreters_walked_and_notes_the_others() -> None:
    from gfxbpf.client.profiles.python import targets

    found = targets.Interpreters()
    f = found.add("/usr/bin/python3")  # Debian's 3.11 (3.13 on Debian 13): walkable
    assert f is not None and f.walkable
    host = f"{f.version[0]}.{f.version[1]}"
    section, notes = targets.report(
        found,
        {10: (int(host[0]), int(host[2:]))},
        {
            10: ("python3", [f"/usr/bin/python{host}"]),
            11: ("py", ["/opt/py/bin/python3.13", "/opt/py/lib/libpython3.13.so.1.0"]),
        },
    )
    assert [i["version"][: len(host)] for i in section["interpreters"]] == [host]
    assert section["processes_walked"] == {"10": host}
    assert len(notes) == 1 and "process 11 (py) runs Python 3.13" in notes[0]


def test_code_book_reads_the_whole_map_through_the_broker_at_most_once_a_second() -> None:
    key = py.CODE_KEY.pack(7, 0, 0x1000)
    table = {key: code_value("f", "s.py", 1, ONE_LINE_PLUS_1)}
    reads: list[int] = []

    def read_all() -> list[tuple[bytes, bytes]]:
        reads.append(1)
        return list(table.items())

    book = py.CodeBook(lambda ks: None, read_all)
    book.want(7, [(0x2000, 0, 0)])
    book.resolve()
    book.want(7, [(0x1000, 0, 0)])
    book.resolve()  # within the second: not read again, still wanted
    assert len(reads) == 1 and (7, 0, 0x1000) not in book.codes
    book.resolve(final=True)
    assert len(reads) == 2 and book.name(7, (0x1000, 0, 0)).startswith("f (s.py:")


def test_a_cut_chain_ends_in_a_marker_at_its_root() -> None:
    key = py.CODE_KEY.pack(7, 0, 0x1000)
    table = {key: code_value("inner", "s.py", 6, ONE_LINE_PLUS_1)}
    book = py.CodeBook(lambda ks: [(k, table[k]) for k in ks if k in table], lambda: [])
    records = [
        py_record(7, 8, [(0x1000, 2, 0)], flags=py.FLAG_TRUNCATED),
        stack_record(7, 8),
    ]
    reader = CopyReader(Records(records), lambda tgid, refresh: None, None, codes=book)  # type: ignore[arg-type]
    reader.drain()
    (stack,) = reader.raw_stacks()
    assert stack.python == ((py.CUT_FRAME, "inner (s.py:7)"),)
    # the marker is not part of ustackcopy's row key
    assert py.chain_hash([(0x1000, 2, 0), (0, 0, py.FRAME_CUT)]) == py.chain_hash([(0x1000, 2, 0)])


def test_the_main_threads_frames_come_under_a_marker() -> None:
    """cudakernels' record of the main thread's frames, taken for a thread
    that ran none (FLAG_MAIN): the marker above its outermost frame says
    whose they are; they go before the thread's native frames, which hold no
    evaluation loop."""
    key = py.CODE_KEY.pack(7, 0, 0x1000)
    table = {key: code_value("<module>", "train.py", 6, ONE_LINE_PLUS_1)}
    book = py.CodeBook(lambda ks: [(k, table[k]) for k in ks if k in table], lambda: [])
    records = [py_record(7, 9, [(0x1000, 2, 0)], flags=py.FLAG_MAIN), stack_record(7, 9)]
    reader = CopyReader(Records(records), lambda tgid, refresh: None, None, codes=book)  # type: ignore[arg-type]
    reader.drain()
    (stack,) = reader.raw_stacks()
    assert stack.python == ((py.MAIN_FRAME, "<module> (train.py:7)"),)
    native = ("clone3", "start_thread", "mm_mat1_backward", "cuLaunchKernel")
    assert mix(native, stack.python) == (py.MAIN_FRAME, "<module> (train.py:7)", *native)


def test_the_main_threads_chain_has_a_row_key_of_its_own() -> None:
    """The salt keeps a borrowed chain apart from the main thread's own
    launches from the same frames, as gfx_pychain.h does."""
    frames = [(0x1000, 2, 0)]
    own, borrowed = py.chain_hash(frames), py.chain_hash([*frames, (0, 0, py.FRAME_MAIN)])
    assert borrowed & 1 and own & 1 and borrowed != own
    cut = [*frames, (0, 0, py.FRAME_CUT), (0, 0, py.FRAME_MAIN)]
    assert py.chain_hash(cut) == borrowed
    record = py.parse(py_record(7, 9, frames, flags=py.FLAG_MAIN | py.FLAG_TRUNCATED))
    assert record.main and record.marked() == tuple(cut)


def test_the_flag_and_salt_are_the_bpf_headers() -> None:
    src = Path(__file__).resolve().parents[2] / "catalog" / "programs"
    python_h = (src / "gfx_python.h").read_text()
    chain_h = (src / "gfx_pychain.h").read_text()
    assert re.search(rf"#define GFX_PY_MAIN {py.FLAG_MAIN}\b", python_h)
    salt = re.search(r"#define GFX_PY_MAIN_SALT (0x[0-9a-f]+)ull", chain_h)
    assert salt and int(salt.group(1), 16) == py._MAIN_SALT
