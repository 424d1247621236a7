"""bench/torch_chains.py's pure parts: which samples are under the training
step and hold a whole chain, for each tool's output, and the row's table."""

from __future__ import annotations

import pytest

from bench import report
from bench.harness import BenchError
from bench.torch_chains import (
    cut_by,
    perf_samples,
    perf_under_step,
    pyspy_counts,
    share,
    steps_per_s,
    under_step,
    whole_native,
    whole_pyspy_native,
)

PERF = """\
python 100/100 10.500000:
\t7f01 conv_kernel (/x/libtorch_cpu.so)
\t5501 Py_BytesMain (/usr/bin/python3.11)
\t5502 main (/usr/bin/python3.11)

python 100/100 10.700000:
\t7f01 conv_kernel (/x/libtorch_cpu.so)
\t7f02 [unknown] (/x/libtorch_cpu.so)

pt_data_worker 101/101 10.550000:
\t5501 Py_BytesMain (/usr/bin/python3.11)

python 100/100 11.500000:
\t5501 Py_BytesMain (/usr/bin/python3.11)
"""


def test_perf_script_blocks_are_read_root_first() -> None:
    got = list(perf_samples(PERF))
    assert [(p, t, ts) for p, t, ts, _ in got][:2] == [(100, 100, 10.5), (100, 100, 10.7)]
    assert got[0][3] == ["main", "Py_BytesMain", "conv_kernel"]


def test_perf_samples_under_a_step_are_the_main_threads_inside_a_span() -> None:
    # steps 10.4-10.6 and 10.65-10.8; the worker's sample and the one at 11.5 are outside
    step, total = perf_under_step(PERF, 100, [[10.4, 10.6], [10.65, 10.8]])
    assert total == 4 and len(step) == 2
    assert share(step, whole_native) == 0.5


def test_gfxclient_and_pyspy_samples_under_the_step_by_its_python_frame() -> None:
    stacks = [
        (["python3", "main", "Py_BytesMain", "train (/w/t.py:9)", "train_step (/w/t.py:5)"], 3),
        (["python3", "[unwind stopped: bad frame]", "train_step (/w/t.py:5)", "relu"], 1),
        (["python3", "main", "Py_BytesMain", "train (/w/t.py:9)"], 6),  # not in the step
    ]
    step = under_step(stacks)
    assert sum(n for _, n in step) == 4
    assert share(step, whole_native) == 0.75
    spy = [(["0x7f (libc.so.6)", "<module> (t.py:1)", "train_step (t.py:5)"], 1)]
    assert share(under_step(spy), whole_pyspy_native) == 1.0
    assert not whole_pyspy_native(["<module> (t.py:1)", "train_step (t.py:5)"])
    assert share([], whole_native) is None


def test_steps_per_second_from_first_start_to_last_end() -> None:
    assert steps_per_s([[1.0, 1.5], [1.5, 2.0], [2.0, 3.0]]) == 1.5
    with pytest.raises(BenchError):
        steps_per_s([[1.0, 2.0]])


def _result(whole: float, slowdown: float) -> dict:
    tool = {"whole": 0.9, "slowdown": 1.2, "to_file_s": 0.3, "samples_under_step": 500}
    return {
        "workload": "torch",
        "hz": 99,
        "code_mb": 374.4,
        "untraced_steps_per_s": 11.0,
        "rounds_steps_per_s": {
            t: [11.0, 10.0]
            for t in ("untraced", "gfxclient", "perf_dwarf", "pyspy_native", "pyspy")
        },
        "gfxclient": tool
        | {
            "whole": whole,
            "slowdown": slowdown,
            "record_bytes": 8280,
            "tables_mb_per_100mb": 3.0,
            "program": "stackcopy",
            "notes": ["cut"],
        },  # fmt: skip
        "perf_dwarf": tool | {"bytes_per_sample": 10851, "script_mb_per_100mb": 90.0},
        "pyspy_native": tool | {"whole": 1.0, "tables_mb_per_100mb": 20.0},
        "pyspy": tool | {"whole": None},
    }


def test_the_rows_judge_both_goals_and_say_why_one_is_missed() -> None:
    rows = report._torch(_result(0.97, 1.1))
    assert len(rows) == 5 and all(report._has_figure(r[1]) for r in rows)
    assert rows[0][5] == "**no**"  # 97% but under py-spy --native's 100%
    assert rows[1][5] == "yes"
    doc = {"results": {"torch": _result(0.2, 1.5)}}
    why = report.missed(doc)
    assert len(why) == 2 and "stackcopy" in why[0] and "each round" in why[1]


def test_pyspy_counts_are_read_from_its_last_line() -> None:
    err = "py-spy> Wrote raw flamegraph data to 'x.txt'. Samples: 1937 Errors: 4\n"
    assert pyspy_counts(err) == (1937, 4)
    with pytest.raises(BenchError):
        pyspy_counts("py-spy> Error: Failed to find python version")


def test_cut_chains_are_counted_by_their_marker_or_outermost_named_frame() -> None:
    stacks = [
        (["python3", "main", "Py_BytesMain", "f"], 5),
        (["python3", "[unwind stopped: no CFI]", "f"], 2),
        (["[unknown]", "PyObject_Call", "f"], 3),
    ]
    assert cut_by(stacks, whole_native) == {"ends at PyObject_Call": 3,
                                            "[unwind stopped: no CFI]": 2}  # fmt: skip
