"""gfxbpf on the kernels Debian ships, not only on this machine's: 6.1
(Debian 12) and 6.12 (Debian 13), each booted under qemu by
tools/stock_kernels.py, with Debian's own settings.

Every catalog object loads there. Their verifiers are older than 6.18's; 6.1
refused six of the stack-copy programs until their loops and
gfx_py_copy_code's arguments were shaped for it. 6.1 has no uprobe_multi
links either, so the broker refuses uprobe and USDT programs there, saying
why.

The product runs there as on a host: the broker started with --user, an
ordinary user's gfxclient. At Debian's kernel.perf_event_paranoid = 3 only
CAP_SYS_ADMIN may open perf events, so her CPU profile and a tracepoint
watch are refused, and the broker and the client say why; with
deploy/sysctl.d/60-gfxbpf.conf applied her profile shows her Python
functions (docs/ARCHITECTURE.md, "Kernels")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

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
        check_the_product(guest)
    assert r.returncode == 0


def _listed(step: dict[str, Any]) -> dict[str, str | None]:
    """`gfxclient list --json`: each program's reason it cannot run (None: it can)."""
    assert step["rc"] == 0, step
    return {p["name"]: p["unavailable_reason"] for p in json.loads(step["stdout"])["programs"]}


def _weights(folded: str, chain: str | None = None) -> int:
    """The weight of the folded stacks that match chain (all: None)."""
    total = 0
    for line in folded.splitlines():
        stack, weight = line.rsplit(" ", 1)
        total += int(weight) if chain is None or re.search(chain, stack) else 0
    return total


def _share(folded: str, chain: str) -> float:
    """The weight of the stacks that match chain, over all the profile's."""
    return _weights(folded, chain) / max(1, _weights(folded))


def check_the_product(guest: dict[str, Any]) -> None:
    where = f"Linux {guest['kernel']}"
    assert guest["errors"] == [], guest["errors"]
    assert guest["sysctl"]["perf_event_paranoid"] == "3", guest["sysctl"]  # Debian's default
    steps = {s["run"]: s for s in guest["runs"] if "run" in s}
    (applied,) = [s for s in guest["runs"] if "applied" in s]
    assert applied["sysctl"]["perf_event_paranoid"] == "2"
    # Root's --check-policy warns of the entries the kernel refuses the broker.
    for name, stopped in (
        ("check_policy_stock", ["clonecount", "stackcopy"]),
        ("check_policy", []),
    ):
        said = steps[name]["stdout"].splitlines()
        warned = sorted(x.split("'")[1] for x in said if "cannot attach on this host" in x)
        assert steps[name]["rc"] == 0 and warned == stopped, (where, steps[name])
    # On Debian's settings: `gfxclient list` says what cannot run and why ...
    here = _listed(steps["list_stock"])
    assert "kernel.perf_event_paranoid is 3" in here["stackcopy"], here
    assert here["offcpu"] is None and here["clonecount"], here  # tp_btf; a tracepoint
    uprobe = here["ustackcopy"]
    assert ("Linux 6.6" in uprobe) if where.startswith("Linux 6.1.") else uprobe is None, here
    after = _listed(steps["list"])
    assert after["stackcopy"] is None and after["clonecount"] is None, after
    # ... and what she runs anyway is refused with the same reason.
    for name in ("cpu_stock", "tracepoint_stock"):
        step = steps[name]
        assert step["rc"] not in (0, "timeout"), (where, step)
        assert "kernel.perf_event_paranoid is 3" in step["stderr"], (where, step["stderr"])
        assert "only CAP_SYS_ADMIN" in step["stderr"]
    (stopped,) = guest["broker"]
    assert stopped["broker"] == "stopped" and stopped["rc"] == 0, stopped
    # The only thing the broker finds wrong with a Debian host at start.
    (said,) = (json.loads(x)["detail"] for x in stopped["host_checks"])
    assert "kernel.perf_event_paranoid is 3" in said and "stackcopy" in said, said
    # With deploy/'s sysctl file: her Python functions, her waits, her tracepoint.
    for name in ("cpu", "tracepoint", "offcpu"):
        assert steps[name]["rc"] == 0, (where, steps[name])
    chain = r"gfx_outer \(/tmp/alice/cpu\.py:6\);gfx_leaf \("
    cpu = _share(steps["cpu"]["out"], chain)
    assert cpu >= 0.5, (where, steps["cpu"]["out"])
    # ... whole: from the process's entry through libc and the interpreter's C
    # frames (once, every stack stopped as "not code" above Py_BytesMain).
    whole = _weights(steps["cpu"]["out"], r"^python3[.0-9]*;_start;__libc_start_main;.*" + chain)
    assert whole >= 0.8 * _weights(steps["cpu"]["out"], chain), (where, steps["cpu"]["out"])
    waits = _share(
        steps["offcpu"]["out"],
        r"gfx_waiter \(/tmp/alice/offcpu\.py:6\);gfx_nap \(.*\[wait: clock_nanosleep\]$",
    )
    assert waits >= 0.5, (where, steps["offcpu"]["out"])
    assert '"program": "clonecount"' in steps["tracepoint"]["stdout"]
    # Her stacks at a libc function: exact counts per Python caller, where the
    # kernel has uprobe_multi links; before 6.6 the broker's reason reaches her.
    at = steps["stacks_at"]
    if guest["kernel"].startswith("6.1."):
        assert at["rc"] not in (0, "timeout") and "Linux 6.6" in at["stderr"], (where, at)
    else:
        assert at["rc"] == 0, (where, at)
        calls = _weights(at["out"], r"gfx_caller \(/tmp/alice/stacks_at\.py:6\);gfx_ask \(")
        assert calls == 1000, (where, at["out"])
