"""profile --gpu's text report: one row per (thread, launching Python line,
kernel), the native paths between them summed."""

from __future__ import annotations

import argparse
import io
import json

from gfxbpf.client.cli import gpu_profile
from gfxbpf.client.profiles.model import FrameInfo, Profile

LINE_A = "step (train.py:12)"
LINE_B = "step (train.py:14)"


def _profile() -> Profile:
    frames = {
        LINE_A: FrameInfo("step", file="train.py", line=12),
        LINE_B: FrameInfo("step", file="train.py", line=14),
        "<module> (train.py:30)": FrameInfo("<module>", file="train.py", line=30),
        "cuLaunchKernel": FrameInfo("cuLaunchKernel", obj="libcuda.so.1"),
    }
    main = ("python3", "Py_BytesMain", "<module> (train.py:30)")
    stacks = {
        (*main, LINE_A, "at::mm", "cuLaunchKernel", "gemm"): 3_000_000,
        (*main, LINE_A, "at::addmm", "cuLaunchKernel", "gemm"): 1_000_000,  # another path
        (*main, LINE_B, "cuLaunchKernel", "relu\n"): 500_000,
        ("pt_autograd_0", "clone3", "mm_mat1_backward", "cuLaunchKernel", "gemm"): 5_500_000,
    }
    return Profile(stacks, "nanoseconds", duration_s=2.0, time_kind="gpu", frames=frames)


def test_rows_sum_the_native_paths_under_one_line() -> None:
    assert gpu_profile.launch_rows(_profile()) == [
        (5_500_000, "pt_autograd_0", gpu_profile.NO_PYTHON, "gemm"),
        (4_000_000, "python3", LINE_A, "gemm"),
        (500_000, "python3", LINE_B, "relu\n"),
    ]


def test_text_report_names_thread_line_and_kernel() -> None:
    out = io.StringIO()
    args = argparse.Namespace(output=None, json=False, top=2)
    assert gpu_profile._report(_profile(), args, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "GPU time: 0.010000 s in 4 stacks over 2.0 s"
    assert lines[1].split() == ["SHARE", "DEVICE", "ms", "THREAD", "LAUNCHED", "FROM", "KERNEL"]
    assert lines[2].split() == [
        "55.00%",
        "5.500",
        "pt_autograd_0",
        "[no",
        "Python",
        "frame]",
        "gemm",
    ]
    assert lines[3].split() == ["40.00%", "4.000", "python3", "step", "(train.py:12)", "gemm"]
    assert lines[4].startswith("whole launch stacks:") and len(lines) == 5  # --top 2


def test_text_report_escapes_names() -> None:
    out = io.StringIO()
    gpu_profile._report(_profile(), argparse.Namespace(output=None, json=False, top=9), out)
    assert "relu\\x0a" in out.getvalue() and "relu\n" not in out.getvalue()


def test_json_holds_the_rows_and_the_whole_stacks() -> None:
    out = io.StringIO()
    gpu_profile._report(_profile(), argparse.Namespace(output=None, json=True, top=1), out)
    got = json.loads(out.getvalue())
    assert got["launches"][1] == {
        "device_ns": 4_000_000,
        "thread": "python3",
        "line": LINE_A,
        "kernel": "gemm",
    }
    assert len(got["launches"]) == 3 and len(got["stacks"]) == 4  # --top is the text's


def test_the_line_is_the_users_own_innermost() -> None:
    """PyTorch's frames (site-packages) and the standard library's are passed
    over for the model's line; a stack with only installed frames keeps its
    innermost."""
    torch = "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"
    lib = "/usr/local/lib/python3.13/threading.py"
    frames = {
        "<module> (train.py:30)": FrameInfo("<module>", file="train.py", line=30),
        "forward (model.py:22)": FrameInfo("forward", file="/home/a/model.py", line=22),
        "forward (linear.py:125)": FrameInfo("forward", file=torch, line=125),
        "run (threading.py:9)": FrameInfo("run", file=lib, line=9),
    }
    stacks = {
        ("python3", "<module> (train.py:30)", "forward (model.py:22)",
         "forward (linear.py:125)", "cuLaunchKernel", "gemm"): 7,
        ("python3", "run (threading.py:9)", "forward (linear.py:125)", "gemm"): 3,
    }  # fmt: skip
    prof = Profile(stacks, "nanoseconds", time_kind="gpu", frames=frames)
    assert gpu_profile.launch_rows(prof) == [
        (7, "python3", "forward (model.py:22)", "gemm"),
        (3, "python3", "forward (linear.py:125)", "gemm"),
    ]
