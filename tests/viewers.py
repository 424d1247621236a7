"""The profile viewers' own readers, for the tests of gfxclient profile's files:
Google's pprof (a binary tools/profile_viewers.sh builds from Debian's source
package) and speedscope's page and importer (the npm package it installs),
driven in headless Chromium (tests/browser.py)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from tests.browser import CHROMIUM, Browser
from tests.conftest import skip_or_fail

TOOLS = Path(os.environ.get("GFXBPF_TOOLS", "/opt/gfxbpf/tools"))
PPROF = TOOLS / "pprof"
SPEEDSCOPE_PAGE = TOOLS / "speedscope/node_modules/speedscope/dist/release/index.html"
# The toolbar's line for the profile shown, where there are several: "NAME (i/n)".
_SHOWN = re.compile(r"^(.*) \((\d+)/(\d+)\)$")
_MISSING = "is missing (tools/test_deps.sh installs it: tools/profile_viewers.sh)"


def need_pprof() -> None:
    if not os.access(PPROF, os.X_OK):
        skip_or_fail(f"{PPROF} {_MISSING}")


def need_speedscope() -> None:
    if not SPEEDSCOPE_PAGE.is_file():
        skip_or_fail(f"{SPEEDSCOPE_PAGE} {_MISSING}")
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium)")


def pprof(path: Path, *args: str) -> str:
    """pprof ARGS PATH's report (stdout); a failure shows its stderr."""
    r = subprocess.run(
        [str(PPROF), *args, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def pprof_top(path: Path, *args: str) -> list[tuple[str, str]]:
    """pprof -top's rows, every node: (flat, name); a blank name is ''."""
    out = pprof(path, "-top", "-nodecount=100000", "-nodefraction=0", *args)
    rows = []
    table = False
    for line in out.splitlines():
        if line.split() == ["flat", "flat%", "sum%", "cum", "cum%"]:
            table = True
        elif table and line.strip():
            cols = line.split(maxsplit=5)
            rows.append((cols[0], cols[5] if len(cols) > 5 else ""))
    assert table, out
    return rows


class Speedscope:
    """A profile file opened in speedscope's page, as its command-line tool
    opens it (a script that hands the file to speedscope.loadFileFromBase64)."""

    def __init__(self, path: Path) -> None:
        self.folder = tempfile.mkdtemp(prefix="gfxbpf-speedscope-")
        loader = Path(self.folder) / "load.js"
        data = base64.b64encode(path.read_bytes()).decode()
        loader.write_text(f"speedscope.loadFileFromBase64({json.dumps(path.name)}, '{data}')")
        self.browser = Browser()
        self.browser.open(f"{SPEEDSCOPE_PAGE.as_uri()}#localProfilePath={loader}")
        # Imported: the page's title becomes "NAME - speedscope" (the file's name field).
        self.browser.wait_for("document.title.endsWith(' - speedscope')")

    def close(self) -> None:
        self.browser.close()
        for f in Path(self.folder).iterdir():
            f.unlink()
        os.rmdir(self.folder)

    def __enter__(self) -> Speedscope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lines(self) -> list[str]:
        return [line for line in self.browser.eval("document.body.innerText").splitlines() if line]

    def shown(self) -> tuple[str, int, int] | None:
        """The profile shown: (name, i, n) from the toolbar's "NAME (i/n)"."""
        m = next(filter(None, map(_SHOWN.match, self._lines())), None)
        return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None

    def _step(self, key: str) -> tuple[str, int, int] | None:
        """Press key ('n' next, 'p' previous profile); the profile shown after."""
        before = self.shown()
        self.browser.call("Input.dispatchKeyEvent", type="char", text=key, key=key)
        deadline = time.monotonic() + 10
        while (shown := self.shown()) == before:
            assert time.monotonic() < deadline, f"{key!r} did not change the profile from {before}"
            time.sleep(0.05)
        return shown

    def profile_names(self) -> list[str]:
        """Every profile's name in the file's order, stepping through them with
        the 'p' and 'n' keys; [] where there is one profile (no "i/n" shown).
        Ends where it began: at the profile shown first."""
        shown = self.shown()
        if shown is None:
            return []
        first = shown[1]
        for _ in range(first - 1):
            shown = self._step("p")
        names: list[str] = []
        while shown is not None:
            name, i, n = shown
            names.append(name)
            if i >= n:
                break
            shown = self._step("n")
        for _ in range(len(names) - first):
            self._step("p")
        return names

    def tooltips(self, x: float = 100.0) -> list[list[str]]:
        """The hover tooltip's lines at each frame row of the flame chart's column x."""
        seen: list[list[str]] = []
        before = set(self._lines())
        for y in range(20, 480, 6):
            self.browser.hover(x, y)
            time.sleep(0.05)
            extra = [line for line in self._lines() if line not in before]
            if extra and extra not in seen:
                seen.append(extra)
        return seen
