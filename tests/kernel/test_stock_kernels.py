"""Every catalog object loads on the kernels Debian ships, not only on this
machine's: 6.1 (Debian 12) and 6.12 (Debian 13), each booted under qemu by
tools/stock_kernels.py. Their verifiers are older than 6.18's; 6.1 refused
six of the stack-copy programs until their loops and gfx_py_copy_code's
arguments were shaped for it. 6.1 has no uprobe_multi links either, so the
broker refuses uprobe and USDT programs there, saying why
(docs/ARCHITECTURE.md, "Kernels")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from gfxbpf.catalog.entries import load_catalog
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import ROOT

KERNEL_LINES = {"debian12": "6.1.", "debian13": "6.12."}
CATALOG = load_catalog()
# What the broker answers on 6.1 for these: no uprobe_multi links before 6.6.
UPROBE_PROGRAMS = {
    p.name for p in CATALOG if any(a.kind in ("uprobe", "uretprobe", "usdt") for a in p.attach)
}


def test_every_catalog_object_loads_on_debians_stock_kernels() -> None:
    if os.geteuid() != 0:
        skip_or_fail("fetching Debian's kernel packages needs root (apt-get download)")
    if not shutil.which("qemu-system-x86_64"):
        skip_or_fail("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools/stock_kernels.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode in (0, 1), r.stderr
    booted = {x["release"]: x for x in json.loads(r.stdout)}
    assert sorted(booted) == sorted(KERNEL_LINES)
    for release, line in KERNEL_LINES.items():
        guest = booted[release]
        assert guest["kernel"].startswith(line), guest["kernel"]
        objects = {o["program"]: o for o in guest["objects"]}
        assert set(objects) == set(CATALOG.names())
        refused = {n: o["error"] + "\n" + o["log"] for n, o in objects.items() if not o["ok"]}
        assert refused == {}, f"Linux {guest['kernel']} refused:\n" + "\n".join(refused.values())
        unavailable = {n for n, o in objects.items() if o["unavailable"]}
        if line == "6.1.":
            # The kernel agrees with the broker's refusal: no uprobe_multi link.
            assert "Invalid argument" in objects["ucalls"]["uprobe_multi"]
            assert unavailable == UPROBE_PROGRAMS and "stackcopy" not in unavailable
            assert "Linux 6.6" in objects["ucalls"]["unavailable"]
        else:
            assert objects["ucalls"]["uprobe_multi"] == "attached"
            assert unavailable == set()
    assert r.returncode == 0
