"""A self-contained interactive flame graph (SVG), written by gfxbpf.

Root at the bottom, callees above, widths proportional to weight, siblings in
name order. The file carries its own style and script and loads nothing, so it
works offline: a frame's name and weight on hover (its <title>), click a frame
to zoom into it (click the root or "Reset zoom" to go back), and a search box
that highlights matching frames (a regular expression) and says what share of
the total they cover. Without a script (an image viewer) it still renders.

One function is one frame: a Python frame's line leaves its name here (the
title lists the lines with their weights), so a function whose samples fall
on several lines is one tower, not a sibling per line; the folded, pprof
and speedscope files keep the lines. Each frame is written once, compactly
(its name in its title only, a label only where one fits), so a deep
PyTorch profile of ~1000 stacks is a few MB, not ten.
"""

from __future__ import annotations

import functools
import html
import zlib
from dataclasses import dataclass, field

from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.model import Profile

__all__ = ["Node", "build_tree", "flamegraph_svg"]

WIDTH = 1200  # px
FRAME_H = 17
PAD = 10
TOP = 54  # title, search box
BOTTOM = 24  # the hover details line
FONT = 12
CHAR_W = 7.0  # px per character at FONT, for cutting names to fit (monospace)
MIN_PX = 0.1  # frames narrower than this are left out, like their callees

_UNIT = {"samples": "samples", "calls": "calls", "nanoseconds": "ns"}


@dataclass
class Node:
    name: str
    weight: int = 0
    children: dict[str, Node] = field(default_factory=dict)
    lines: dict[int, int] = field(default_factory=dict)  # a Python frame's line -> weight


def _by_function(profile: Profile) -> dict[str, tuple[str, int]]:
    """Frame name -> (the function's frame name, the line), for Python frames
    with a line: "train_step (train.py:57)" -> ("train_step (train.py)", 57)."""
    return {
        name: (f"{info.function} ({info.file})", info.line)
        for name, info in profile.frames.items()
        if info.file and info.line
    }


def build_tree(profile: Profile, by_line: bool = False) -> Node:
    """The merged call tree under one "all" root; a Python function's lines
    merged into one node unless by_line."""
    merge = {} if by_line else _by_function(profile)
    root = Node("all")
    for frames, w in profile.stacks.items():
        if w <= 0:
            continue
        root.weight += w
        node = root
        for name in frames:
            name, line = merge.get(name, (name, 0))
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = Node(name)
            child.weight += w
            if line:
                child.lines[line] = child.lines.get(line, 0) + w
            node = child
    return root


def _depth(node: Node) -> int:
    best, todo = 0, [(node, 0)]
    while todo:
        n, d = todo.pop()
        best = max(best, d)
        todo.extend((c, d + 1) for c in n.children.values())
    return best


# Leaf frames of off-CPU time (client/profiles/copies.wait_frame).
OFF_CPU_FRAMES = ("[wait:", "[preempted]")


@functools.lru_cache(maxsize=65536)
def _color(name: str) -> str:
    if name.startswith("["):  # made-up frames: [kernel], [unknown], [lib.so+0x..]
        if name.startswith(OFF_CPU_FRAMES):  # time off the CPU: blue, as off-CPU graphs are
            return "#5a96e6" if name.startswith("[wait") else "#96bef0"
        return "#f08c3c" if name == "[kernel]" else "#bebebe"
    h = zlib.crc32(name.encode("utf-8", "replace"))
    return f"#{205 + h % 50:02x}{70 + (h >> 8) % 160:02x}{(h >> 16) % 55:02x}"


def _amount(weight: int, unit: str) -> str:
    """ "1234 samples"; time in the unit that reads best ("12.3 ms")."""
    if unit != "ns":
        return f"{weight} {unit}"
    for scale, name in ((10**9, "s"), (10**6, "ms"), (10**3, "us")):
        if weight >= scale:
            return f"{weight / scale:.3g} {name}"
    return f"{weight} ns"


def _label(name: str, px: float) -> str:
    fits = int((px - 6) / CHAR_W)
    if fits >= len(name):
        return name
    return name[: fits - 2] + ".." if fits >= 3 else ""


@functools.lru_cache(maxsize=65536)
def _esc(s: str) -> str:
    """Text for the SVG: control characters written as \\xNN (printable; XML
    forbids most of them, and a name may be another user's), then XML-escaped."""
    return html.escape(printable(s), quote=True)


def _lines(node: Node, unit: str, most: int = 8) -> str:
    """ "; lines 57: 30 samples, 58: 2 samples" for a merged Python frame ("" if none),
    the heaviest first; no parenthesis, so the script can cut the name off."""
    if not node.lines:
        return ""
    top = sorted(node.lines.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{line}: {_amount(w, unit)}" for line, w in top[:most])
    more = f", {len(top) - most} more" if len(top) > most else ""
    return f"; line{'s' if len(top) > 1 else ''} {text}{more}"


def _frames(root: Node, maxdepth: int, unit: str) -> tuple[list[str], int]:
    """One <g> per frame, depth first; and how many were too narrow to draw.
    The name is written once (the title; the script reads it there) and a
    label only where one fits: most frames of a deep profile are slivers."""
    total = root.weight or 1
    span = WIDTH - 2 * PAD
    out: list[str] = []
    dropped = 0
    todo: list[tuple[Node, int, int]] = [(root, 0, 0)]  # node, depth, x in weight units
    while todo:
        node, depth, x = todo.pop()
        px = node.weight / total * span
        if px < MIN_PX:
            dropped += 1
            continue
        rx, y = PAD + x / total * span, TOP + (maxdepth - depth) * FRAME_H
        pct = node.weight * 100 / total
        label = _label(printable(node.name), px)  # cut to fit as it will read
        text = f'<text x="{rx + 3:.2f}" y="{y + FRAME_H - 5}">{_esc(label)}</text>' if label else ""
        # The script takes x, width and depth from the rectangle (to 1/1000 px).
        out.append(
            f'<g class="f"><title>{_esc(node.name)} ({_amount(node.weight, unit)}, '
            f"{pct:.2f}%{_lines(node, unit)})</title>"
            f'<rect x="{rx:.3f}" y="{y}" width="{px:.3f}" height="{FRAME_H - 1}" '
            f'fill="{_color(node.name)}"/>{text}</g>'
        )
        cx = x
        kids = []
        for name in sorted(node.children):
            child = node.children[name]
            kids.append((child, depth + 1, cx))
            cx += child.weight
        todo.extend(reversed(kids))
    return out, dropped


def flamegraph_svg(profile: Profile, title: str = "Flame graph", by_line: bool = False) -> str:
    """The profile's flame graph; by_line: a Python frame per line, as the other formats."""
    root = build_tree(profile, by_line)
    maxdepth = _depth(root)
    unit = _UNIT.get(profile.unit, profile.unit)
    frames, dropped = _frames(root, maxdepth, unit)
    height = TOP + (maxdepth + 1) * FRAME_H + BOTTOM
    sub = f"{_amount(root.weight, unit)}, {len(profile.stacks)} stacks"
    if profile.duration_s is not None:
        sub += f" in {profile.duration_s:.1f} s"
    if profile.period_ns:
        sub += f" at {1e9 / profile.period_ns:.0f} Hz"
    if dropped:
        sub += f"; {dropped} frames too narrow to draw"
    notes = html.escape("\n".join(printable(n) for n in profile.notes), quote=True)
    note_el = (
        f'<text id="notes" x="{PAD}" y="46" class="warn">&#9888; {len(profile.notes)} '
        f"note(s): hover to read<title>{notes}</title></text>"
        if notes
        else ""
    )
    return (
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" data-width="{WIDTH}" '
        f'data-pad="{PAD}" data-charw="{CHAR_W}" data-base="{TOP + maxdepth * FRAME_H}" '
        f'data-fh="{FRAME_H}">\n'
        f"<desc>{notes}</desc>\n<style>{_CSS}</style>\n"
        f'<rect width="100%" height="100%" fill="#fdfdf6"/>\n'
        f'<text x="{WIDTH // 2}" y="20" class="title">{_esc(title)}</text>\n'
        f'<text x="{PAD}" y="34" class="sub">{_esc(sub)}</text>\n{note_el}\n'
        f'<text id="reset" x="{PAD}" y="20" class="btn" visibility="hidden">Reset zoom</text>\n'
        f'<text id="matched" x="{WIDTH - PAD}" y="46" class="sub" text-anchor="end"></text>\n'
        f'<foreignObject x="{WIDTH - PAD - 240}" y="6" width="240" height="26">'
        '<input xmlns="http://www.w3.org/1999/xhtml" id="search" type="search" '
        'placeholder="search (regex)" spellcheck="false"/></foreignObject>\n'
        f'<g id="frames">\n{chr(10).join(frames)}\n</g>\n'
        f'<text id="details" x="{PAD}" y="{height - 8}" class="sub"> </text>\n'
        f"<script><![CDATA[{_JS}]]></script>\n</svg>\n"
    )


_CSS = """
text { font-family: monospace; font-size: 12px; fill: #000; }
.title { font-size: 16px; text-anchor: middle; }
.sub { fill: #555; }
.warn { fill: #a40; cursor: help; }
.btn { cursor: pointer; fill: #06c; text-decoration: underline; }
g.f { cursor: pointer; }
g.f rect { rx: 2px; }
g.f:hover rect { stroke: #000; stroke-width: 0.5; }
g.f.anc { opacity: 0.55; }
g.f text { pointer-events: none; }
#search { width: 230px; font: 12px monospace; }
"""

# Runs in the viewer's browser. Frames' geometry, as written, gives their place
# as fractions of the total and their depth; zoom and search recompute from them.
_JS = r"""
(function () {
  "use strict";
  var svg = document.documentElement;
  var W = +svg.getAttribute("data-width"), PAD = +svg.getAttribute("data-pad");
  var CW = +svg.getAttribute("data-charw"), SPAN = W - 2 * PAD, EPS = 2e-6;
  var BASE = +svg.getAttribute("data-base"), FH = +svg.getAttribute("data-fh");
  var NS = "http://www.w3.org/2000/svg";
  var frames = Array.prototype.map.call(document.querySelectorAll("g.f"), function (g) {
    var r = g.querySelector("rect"), title = g.querySelector("title").textContent;
    // The title is "NAME (AMOUNT, PCT%[; lines ...])": the name is what precedes it.
    return {g: g, r: r, t: g.querySelector("text"), name: title.replace(/ \([^()]*\)$/, ""),
            title: title, x: (+r.getAttribute("x") - PAD) / SPAN,
            w: +r.getAttribute("width") / SPAN, d: Math.round((BASE - +r.getAttribute("y")) / FH),
            fill: r.getAttribute("fill")};
  });
  var reset = document.getElementById("reset"), details = document.getElementById("details");
  var matched = document.getElementById("matched"), search = document.getElementById("search");

  function label(name, px) {
    var fits = Math.floor((px - 6) / CW);
    if (fits >= name.length) return name;
    return fits >= 3 ? name.slice(0, fits - 2) + ".." : "";
  }
  function place(f, x, w) {
    var px = w * SPAN, rx = PAD + x * SPAN, text = label(f.name, px);
    f.g.style.display = "";
    f.r.setAttribute("x", rx.toFixed(2));
    f.r.setAttribute("width", px.toFixed(2));
    if (!f.t && text) {  // slivers are written without a label: add one once it fits
      f.t = document.createElementNS(NS, "text");
      f.t.setAttribute("y", +f.r.getAttribute("y") + +f.r.getAttribute("height") - 4);
      f.g.appendChild(f.t);
    }
    if (f.t) {
      f.t.setAttribute("x", (rx + 3).toFixed(2));
      f.t.textContent = text;
    }
  }
  function zoom(z) {
    frames.forEach(function (f) {
      f.g.classList.remove("anc");
      if (f.d >= z.d && f.x >= z.x - EPS && f.x + f.w <= z.x + z.w + EPS) {
        place(f, (f.x - z.x) / z.w, f.w / z.w);
      } else if (f.d < z.d && f.x <= z.x + EPS && f.x + f.w >= z.x + z.w - EPS) {
        place(f, 0, 1);
        f.g.classList.add("anc");
      } else {
        f.g.style.display = "none";
      }
    });
    reset.setAttribute("visibility", z.d > 0 ? "visible" : "hidden");
  }
  function unzoom() { zoom(frames[0]); }
  function find(text) {
    var re = null, covered = 0, end = -1;
    if (text) {
      try { re = new RegExp(text); } catch (e) {
        re = new RegExp(text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
      }
    }
    var hits = frames.filter(function (f) {
      var hit = re !== null && re.test(f.name);
      f.r.setAttribute("fill", hit ? "rgb(230,0,230)" : f.fill);
      return hit;
    });
    hits.sort(function (a, b) { return a.x - b.x; }).forEach(function (f) {
      var lo = Math.max(f.x, end), hi = f.x + f.w;  // union of the matched ranges
      if (hi > lo) { covered += hi - lo; end = hi; }
    });
    matched.textContent = re ? "Matched: " + (covered * 100).toFixed(1) + "%" : "";
    return hits.length;
  }
  frames.forEach(function (f) {
    f.g.addEventListener("click", function (e) {
      e.stopPropagation();
      if (f.d === 0) unzoom(); else zoom(f);
    });
    f.g.addEventListener("mouseover", function () {
      details.textContent = f.title;
    });
    f.g.addEventListener("mouseout", function () { details.textContent = " "; });
  });
  reset.addEventListener("click", unzoom);
  search.addEventListener("input", function () { find(search.value); });
  document.addEventListener("keydown", function (e) {
    if ((e.ctrlKey && e.key === "f") || (e.key === "/" && document.activeElement !== search)) {
      e.preventDefault();
      search.focus();
    } else if (e.key === "Escape") {
      search.value = "";
      find("");
      unzoom();
    }
  });
  window.gfxFlame = {zoom: function (i) { zoom(frames[i]); }, unzoom: unzoom, find: find};
  if (frames.length) unzoom();
})();
"""
