"""The SVG flame graph in a real browser (Debian's headless Chromium): it
renders the expected number of frames, shows a frame's name on hover, zooms on
a click (a frame's width changes) and highlights search matches.

Needs /usr/bin/chromium (tools/test_deps.sh installs it): a failure, not a skip,
when CI=true."""

from __future__ import annotations

import os

import pytest

from gfxbpf.client.profiles.model import Profile
from gfxbpf.client.profiles.writers import write_profile
from tests.browser import CHROMIUM, Browser
from tests.conftest import skip_or_fail

STACKS = {
    ("prog", "__libc_start_call_main", "main", "hot", "spin"): 600,
    ("prog", "__libc_start_call_main", "main", "hot"): 150,
    ("prog", "__libc_start_call_main", "main", "cold"): 250,
    ("prog", "__libc_start_call_main", "main", "cold", "[kernel]"): 50,
}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium)")
    path = tmp_path_factory.mktemp("svg") / "flame.svg"
    write_profile(Profile(stacks=dict(STACKS), unit="samples"), "svg", str(path))
    with Browser() as b:
        b.open(path.as_uri())
        b.wait_for("window.gfxFlame !== undefined")
        yield b


def _frame(b: Browser, name: str) -> dict:
    """Geometry of the (first) frame called name, as drawn now."""
    return b.eval(
        f"""(function () {{
          var g = Array.from(document.querySelectorAll('g.f'))
                       .find(g => g.querySelector('title').textContent
                                   .startsWith({name!r} + ' ('));
          var r = g.querySelector('rect'), box = r.getBoundingClientRect();
          return {{width: +r.getAttribute('width'), shown: g.style.display !== 'none',
                   fill: r.getAttribute('fill'), cx: box.x + box.width / 2,
                   cy: box.y + box.height / 2, screenWidth: box.width}};
        }})()"""
    )


def test_renders_every_frame(page) -> None:
    prefixes = {s[:i] for s in STACKS for i in range(1, len(s) + 1)}
    assert page.eval("document.querySelectorAll('g.f').length") == len(prefixes) + 1
    drawn = page.eval(
        "Array.from(document.querySelectorAll('g.f rect'))"
        ".filter(r => r.getBoundingClientRect().width > 0).length"
    )
    assert drawn == len(prefixes) + 1
    # Widths follow weights: main holds everything, cold 300 of 1050.
    assert _frame(page, "cold")["width"] == pytest.approx(1180 * 300 / 1050, abs=0.05)


def test_hover_names_the_frame(page) -> None:
    f = _frame(page, "spin")
    page.hover(f["cx"], f["cy"])
    page.wait_for("document.getElementById('details').textContent.startsWith('spin ')")
    assert page.eval("document.getElementById('details').textContent") == (
        "spin (600 samples, 57.14%)"
    )


def test_click_zooms_and_the_root_resets(page) -> None:
    before = _frame(page, "cold")
    page.click(before["cx"], before["cy"])
    after = _frame(page, "cold")
    assert after["width"] == pytest.approx(1180, abs=0.05), "the clicked frame fills the width"
    assert after["screenWidth"] > before["screenWidth"] * 3
    assert not _frame(page, "hot")["shown"], "frames outside the zoomed one are hidden"
    assert _frame(page, "main")["shown"], "ancestors stay, full width"
    root = _frame(page, "all")
    page.click(root["cx"], root["cy"])
    assert _frame(page, "cold")["width"] == pytest.approx(before["width"], abs=0.05)
    assert _frame(page, "hot")["shown"]


def test_search_highlights_matches(page) -> None:
    page.eval(
        "(function () { var s = document.getElementById('search'); s.value = '^(hot|spin)$';"
        " s.dispatchEvent(new Event('input')); })()"
    )
    assert _frame(page, "hot")["fill"] == "rgb(230,0,230)"
    assert _frame(page, "spin")["fill"] == "rgb(230,0,230)"
    assert _frame(page, "cold")["fill"] != "rgb(230,0,230)"
    # hot covers 750 of 1050 (spin lies inside it: counted once).
    assert page.eval("document.getElementById('matched').textContent") == "Matched: 71.4%"
