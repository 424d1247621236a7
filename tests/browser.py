"""A headless Chromium for tests, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ended by NUL on fds 3 and 4), so no
WebDriver or websocket package is needed."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

from bench.procs import stop as stop_process

CHROMIUM = "/usr/bin/chromium"
# What a root-run Chromium needs to start in a bare container, and no network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="gfxbpf-chromium-")
        to_chrome_r, self._out = os.pipe()
        self._in, from_chrome_w = os.pipe()
        cmd = " ".join(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
            + [f"3<&{to_chrome_r}", f"4>&{from_chrome_w}"]
        )
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {cmd}"],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def close(self) -> None:
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        stop_process(self.proc, timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (status {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: bool = True, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        """Open url in a new tab and talk to that tab from now on."""
        target = self.call("Target.createTarget", session=False, url=url)["targetId"]
        self.session = self.call(
            "Target.attachToTarget", session=False, targetId=target, flatten=True
        )["sessionId"]
        self.wait_for("document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(expression):
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression}")
            time.sleep(0.1)

    def click(self, x: float, y: float) -> None:
        """A real mouse click at page coordinates (through the browser's input path)."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
