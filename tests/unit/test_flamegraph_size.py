"""The flame graph of a large, deep profile stays small (issue 33: a PyTorch
profile of ~1000 stacks was an 8.6-9.8 MB SVG): each frame is written once
and compactly, none that can be drawn is left out, and a Python function
whose samples fall on several lines is one frame, its lines in the title."""

from __future__ import annotations

import random
import re

from gfxbpf.client.profiles.flamegraph import MIN_PX, PAD, WIDTH, build_tree, flamegraph_svg
from gfxbpf.client.profiles.model import FrameInfo, Profile


def _deep_profile(stacks: int = 1000, depth: int = 48) -> Profile:
    """A PyTorch-like profile: a shared root chain, then deep paths through
    C++ and Python frames with long names, most of them a sample or two wide."""
    rng = random.Random(33)
    native = [f"at::native::(anonymous namespace)::kernel_{i}<float, long>" for i in range(600)]
    python = [f"Module_{i}.forward (/home/u/model_{i % 40}.py:{i})" for i in range(400)]
    root = ("python3", "_start", "__libc_start_main", "Py_BytesMain", "<module> (train.py:90)")
    out: dict[tuple[str, ...], int] = {}
    for _ in range(stacks):
        path = root + tuple(rng.choice(native + python) for _ in range(depth))
        out[path] = out.get(path, 0) + rng.choice((1, 1, 1, 2, 3))
    infos = {}
    for name in python + [root[-1]]:
        fn, file, line = re.fullmatch(r"(.*) \((.*):(\d+)\)", name).groups()  # type: ignore[union-attr]
        infos[name] = FrameInfo(fn, file=file, line=int(line))
    return Profile(stacks=out, unit="samples", period_ns=10_101_010, frames=infos)


def _nodes(profile: Profile) -> list[tuple[str, int]]:
    todo, out = [build_tree(profile)], []
    while todo:
        node = todo.pop()
        out.append((node.name, node.weight))
        todo.extend(node.children.values())
    return out


def test_a_deep_profile_of_a_thousand_stacks_is_a_few_mb() -> None:
    p = _deep_profile()
    svg = flamegraph_svg(p, "big")
    nodes = _nodes(p)
    total = p.total()
    drawn = [n for n in nodes if n[1] / total * (WIDTH - 2 * PAD) >= MIN_PX]
    # Every frame wide enough to see is there (here every one: a sample is >1 px).
    assert svg.count('<g class="f">') == len(drawn) == len(nodes) > 40_000
    # Bytes per frame beyond its name: ~130 (the writer before issue 33's fix
    # wrote each name three times and ~230 more: 9.8 MB for such a profile).
    names = sum(len(name) for name, _ in drawn)
    assert (len(svg) - names) / len(drawn) < 140, len(svg)
    assert len(svg) < 10_000_000


def test_a_python_function_on_several_lines_is_one_frame_with_its_lines() -> None:
    lines = {57: 30, 58: 2, 61: 1}
    stacks = {("python3", f"train_step (train.py:{n})", "conv2d"): w for n, w in lines.items()}
    infos = {
        f"train_step (train.py:{n})": FrameInfo("train_step", file="train.py", line=n)
        for n in lines
    }
    p = Profile(stacks=stacks, unit="samples", frames=infos)
    svg = flamegraph_svg(p, "step")
    assert svg.count("<title>train_step (train.py) (") == 1
    assert "<title>train_step (train.py) (33 samples, 100.00%; lines 57: 30 samples, " in svg
    assert svg.count("<title>conv2d (33 samples") == 1  # one tower above it too
    # ... and frame per line where asked (the other formats keep lines always).
    by_line = flamegraph_svg(p, "step", by_line=True)
    assert by_line.count("<title>train_step (train.py:") == 3
