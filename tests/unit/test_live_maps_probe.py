"""LiveMaps.probe (bpf/mapids.py), the broker's start-up load of the live-maps
iterator in a forked child, without a kernel: the child's refusal becomes
the error ids() keeps, and a child that dies before it answers is an error,
not a start that hangs. Each runs in a fresh interpreter (one thread, as the
broker at start: probe forks only then)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_SCRIPT = """
import json, os, sys
from gfxbpf.bpf.mapids import LiveMaps
def refuse(self):
    self.error = "no BTF"
def die(self):
    os._exit(3)
parent = os.getpid()
def fake_open(self):  # the child does what the test asks; the parent never loads
    if os.getpid() == parent:
        if self.error is None:
            raise AssertionError("the parent loaded the iterator")
        return None  # as _open answers once a load failed
    return {"refuse": refuse, "die": die}[sys.argv[1]](self)
LiveMaps._open = fake_open
live = LiveMaps()
error = live.probe()
print(json.dumps({"probe": error, "error": live.error, "ids": live.ids() if error else "-"}))
"""


@pytest.mark.parametrize(
    ("child", "error"),
    [("refuse", "no BTF"), ("die", "the map iterator's load gave no answer")],
)
def test_the_childs_failure_is_the_error_ids_keeps(child: str, error: str) -> None:
    r = subprocess.run([sys.executable, "-c", _SCRIPT, child], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"probe": error, "error": error, "ids": None}
