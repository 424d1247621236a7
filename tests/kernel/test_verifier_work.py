"""Issue 35 item 5: an ordinary user pays for the verifier work she makes the broker do.

gfxtest-mallory attaches stackcopy, again and again, to a child of hers that
exits while the broker loads the program (answered "exited while attaching"),
each time with another stack_bytes so no warm instance fits. Before, such a
load cost her nothing: the map charge was refunded, and the broker's CPU was
hers for the asking (one CPU verifying back to back). Now:

- the loads' CPU time counts against load_cpu_seconds_per_user, whether they
  succeed or not: past it she is refused (RESOURCE_EXHAUSTED, the rule and
  when to retry), the broker's CPU over the whole loop stays near the
  allowance, and gfxtest-bob's attach meanwhile stays within 10x its time
  on the idle broker;
- a failed load keeps its part of map_churn_bytes_per_user: a loop of loads
  that all fail meets the churn allowance.

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON),
with each load made 0.5 s slower (GFXBPF_TEST_LOAD_DELAY_S) so that every
child of mallory's is gone by the time its attach ends.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from gfxbpf.broker.instances import LOAD_DELAY_ENV
from tests.kernel.brokerenv import BOB, MALLORY, BrokerProcess, Client, policy_for

LOAD_DELAY_S = 0.5
CHILD_LIFE_S = 0.2  # alive when the broker checks the pid, gone before the attach ends
LOAD_CPU_S = 5
REFUSALS = 10


def _policy(limits: dict[str, int]) -> str:
    entry = {"users": [MALLORY, BOB], "scope": "self", "max_stack_bytes": 16384}
    return policy_for({"stackcopy": entry}, limits=limits)


def _start(limits: dict[str, int]) -> BrokerProcess:
    return BrokerProcess.start(
        _policy(limits), grpc=False, env_extra={LOAD_DELAY_ENV: str(LOAD_DELAY_S)}
    )


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bob_attach(bob: Client, stack_bytes: int) -> float:
    """Seconds for one cold stackcopy attach of bob's (a knob no warm instance has)."""
    t0 = time.monotonic()
    a = bob.ok("attach", name="stackcopy", scope="self", stack_bytes=stack_bytes)
    took = time.monotonic() - t0
    bob.ok("detach", id=a["id"])
    return took


def _loop(mallory: Client, seconds: float, refusals: int) -> dict[str, Any]:
    return mallory.ok(
        "attach_exiting", name="stackcopy", life=CHILD_LIFE_S, seconds=seconds, refusals=refusals
    )


def test_loads_that_fail_are_paid_for_in_load_cpu() -> None:
    limits = {"load_cpu_seconds_per_user": LOAD_CPU_S, "load_cpu_window_seconds": 600}
    with _start(limits) as broker:
        mallory, bob = Client(broker, MALLORY), Client(broker, BOB)
        try:
            idle = max(_bob_attach(bob, 2048), _bob_attach(bob, 2056))
            out: dict[str, Any] = {}
            cpu0 = _cpu_seconds(broker.pid)
            loop = threading.Thread(target=lambda: out.update(_loop(mallory, 120, REFUSALS)))
            loop.start()
            loaded = []
            while loop.is_alive() and len(loaded) < 3:
                loaded.append(_bob_attach(bob, 4096 + 8 * len(loaded)))
            loop.join(180)
            spent = _cpu_seconds(broker.pid) - cpu0
        finally:
            mallory.close()
            bob.close()
    codes = out["codes"]
    assert codes.get("ERROR_RESOURCE_EXHAUSTED") == REFUSALS, out
    assert codes.get("ERROR_NOT_FOUND", 0) >= 2, out  # loads whose target exited meanwhile
    refusal = out["refusal"]
    assert refusal["rule"] == f"[limits] load_cpu_seconds_per_user = {LOAD_CPU_S}", refusal
    assert "Retry in" in refusal["message"] and "verifier" in refusal["message"], refusal
    # Bob's loads and mallory's last one (begun under the allowance) come on
    # top of the allowance; the refusals cost next to nothing.
    assert spent < LOAD_CPU_S + 4 * idle + 2, (spent, idle, out)
    assert loaded and max(loaded) < 10 * idle, (loaded, idle)


def test_loads_that_fail_keep_their_churn() -> None:
    churn = 16 << 20  # four or five stackcopy instances
    limits = {"map_churn_bytes_per_user": churn}  # five loads: within the default load CPU
    with _start(limits) as broker:
        mallory = Client(broker, MALLORY)
        try:
            out = _loop(mallory, 60, 1)
        finally:
            mallory.close()
    codes = out["codes"]
    assert "OK" not in codes and codes.get("ERROR_NOT_FOUND", 0) >= 3, out
    assert codes.get("ERROR_RESOURCE_EXHAUSTED") == 1, out
    assert out["refusal"]["rule"] == f"[limits] map_churn_bytes_per_user = {churn}", out
