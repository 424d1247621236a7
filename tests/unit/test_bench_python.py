"""bench/python_profile.py's counting and its rows, offline (the run needs root)."""

from __future__ import annotations

from bench import python_profile as pp
from bench import report

PYSPY_RAW = """\
<module> (loop.py:17);outer (loop.py:13);middle (loop.py:10);inner (loop.py:5) 44
<module> (loop.py:17);outer (loop.py:13);middle (loop.py:10);inner (loop.py:4) 20
<module> (loop.py:17);outer (loop.py:13) 6
"""
NATIVE = "python3;_start;__libc_start_main;main;Py_BytesMain"
GFX_FOLDED = f"""\
{NATIVE};outer (loop.py:13);middle (loop.py:10);inner (loop.py:5) 90
{NATIVE};inner (loop.py:5);middle (loop.py:10);outer (loop.py:13) 5
python3;[kernel] 5
"""


def test_chain_share_counts_samples_holding_the_chain_in_order() -> None:
    assert pp.chain_share(pp.parse_folded(PYSPY_RAW.splitlines())) == 64 / 70
    # Reversed (leaf first) is not the chain; [kernel] only is not either.
    assert pp.chain_share(pp.parse_folded(GFX_FOLDED.splitlines())) == 0.9
    assert pp.chain_share([]) == 0.0


def test_script_share_leaves_out_start_up_and_shutdown() -> None:
    # gfxclient samples from exec: the interpreter's start-up has no frame of
    # the script and is left out of this share (py-spy never sees it).
    folded = GFX_FOLDED.replace(
        "python3;[kernel] 5", "python3;Py_BytesMain;Py_InitializeFromConfig 5"
    )
    stacks = pp.parse_folded(folded.splitlines())
    assert pp.chain_share(stacks) == 0.9
    assert pp.script_share(stacks) == 90 / 95
    assert pp.script_share(pp.parse_folded(PYSPY_RAW.splitlines())) == 64 / 70
    assert pp.in_script(["<module> (/tmp/x/loop.py:17)"]) and not pp.in_script(["loop.pyc"])


def test_frame_names_drop_file_and_line() -> None:
    assert pp.frame_name("inner (loop.py:5)") == "inner"
    assert pp.frame_name("Py_BytesMain") == "Py_BytesMain"
    # Native frames between Python calls (3.9, 3.10) do not break the chain;
    # another Python function does.
    assert pp.holds_chain(["outer (a.py:1)", "_PyEval_Vector", "middle (a.py:2)", "inner (a.py:3)"])
    assert not pp.holds_chain(["outer (a.py:1)", "x (a.py:9)", "middle (a.py:2)", "inner (a.py:3)"])
    assert not pp.is_python("[kernel]") and not pp.is_python("Py_BytesMain")


def test_python_rows_compare_with_pyspy() -> None:
    r = {
        "hz": 99,
        "untraced_s": 5.0,
        "gfxbpf_chain_share": 0.97,
        "pyspy_chain_share": 0.95,
        "pyspy_nonblocking_chain_share": 0.9,
        "gfxbpf_slowdown": 1.01,
        "pyspy_slowdown": 1.2,
        "pyspy_nonblocking_slowdown": 1.02,
        "gfxbpf_to_flamegraph_s": 0.3,
        "pyspy_to_flamegraph_s": 0.1,
    }
    rows = report.SECTIONS["python"](r)
    assert [row[5] for row in rows] == ["yes", "yes", "—"]  # no in-script share: no such row
    with_script = report.SECTIONS["python"](
        {**r, "gfxbpf_script_share": 0.99, "pyspy_script_share": 0.995}
    )
    assert [row[5] for row in with_script] == ["yes", "**no**", "yes", "—"]
    assert rows[0][1] == "97.0%" and "95.0%" in rows[0][2]
    r["gfxbpf_chain_share"] = 0.5
    assert report.SECTIONS["python"](r)[0][5] == "**no**"


def test_a_missed_whole_chain_share_counts_the_samples_outside_the_script() -> None:
    r = {
        "hz": 99, "untraced_s": 5.0, "gfxbpf_chain_share": 0.99, "pyspy_chain_share": 1.0,
        "pyspy_nonblocking_chain_share": 1.0, "gfxbpf_script_share": 1.0,
        "pyspy_script_share": 1.0, "gfxbpf_slowdown": 0.9, "pyspy_slowdown": 1.0,
        "pyspy_nonblocking_slowdown": 1.0, "gfxbpf_to_flamegraph_s": 0.08,
        "pyspy_to_flamegraph_s": 0.02, "gfxbpf_samples": 300, "gfxbpf_outside_script": [3, 3, 2],
        "gfxbpf_cut_in_script": [[1, 290, "middle;PyObject_Call;x"], [0, 291, ""], [0, 290, ""]],
        "pyspy_cut_in_script": [[0, 280, ""], [1, 281, "middle"], [0, 280, ""]],
    }  # fmt: skip
    (why,) = report.missed({"results": {"python": r}})
    assert why.startswith("12 Python: samples with the whole chain")
    assert "without the whole chain per round were [1, 0, 0] of [290, 291, 290]" in why
    assert "the commonest ends middle;PyObject_Call;x), py-spy's [0, 1, 0] of [280, 281" in why
    assert "medians 0 sample(s) apart, within the 1 by which" in why
    assert "and [3, 3, 2] samples per round hold no frame of loop.py" in why
