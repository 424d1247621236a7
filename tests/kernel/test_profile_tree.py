"""Process trees (issue 24): `gfxclient profile -- CMD`, `--pid` and
`--stacks-at` follow the target's descendants, filtered in the kernel.

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); the profiles are taken as gfxtest-alice. The spinning programs are
test_profile's, built here with frame pointers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.brokerenv import (
    ALICE,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)
from tests.kernel.test_profile import CALLER_C, HOTCOLD_C, LIB_C, _cc, folded, gfxclient

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def progs() -> Iterator[dict[str, Path]]:
    d = shared_dir(prefix="gfxbpf-tree-")
    os.chown(d, *ensure_user(ALICE))  # alice writes profiles and marker files here
    lib = _cc(LIB_C, d / "libstk.so", "-shared", "-fPIC")
    out = {
        "dir": d,
        "hotcold": _cc(HOTCOLD_C, d / "hotcold"),
        "lib": lib,
        "caller": _cc(CALLER_C, d / "caller", f"-L{d}", "-lstk", "-Wl,-rpath,$ORIGIN"),
    }
    for name in ("early", "late", "suidhot"):  # copies: their own command names
        shutil.copy(out["hotcold"], d / name)
        (d / name).chmod(0o755)
        out[name] = d / name
    # A setuid-root child: root's process although the user started it.
    os.chown(out["suidhot"], 0, 0)
    out["suidhot"].chmod(0o4755)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    progs: dict[str, Path] = request.getfixturevalue("progs")
    return policy_for(
        {
            # gfxclient's default path: stack copies (the copy programs follow
            # trees as profile and ustacks do); attach_tree.py uses profile itself
            "stackcopy": {"users": [ALICE], "scope": "self", "max_frequency": 999},
            "profile": {"users": [ALICE], "scope": "self", "max_frequency": 999},
            "ustackcopy": {"users": [ALICE], "scope": "self", "libraries": [str(progs["lib"])]},
            "ucalls": {"users": [ALICE], "scope": "self", "libraries": [str(progs["lib"])]},
        },
        limits={"map_bytes_per_user": 1 << 30},  # several profiles of ~7 MiB each
    )


def _seen(summary: dict[str, Any]) -> dict[str, int]:
    """Samples per command name, from the summary's processes seen."""
    out: dict[str, int] = {}
    for p in summary["processes_seen"]:
        out[p["command"]] = out.get(p["command"], 0) + p["weight"]
    return out


@pytest.mark.parametrize(
    "shell",
    [
        'sh -c "{prog} 250; true"',  # the shell waits for its child
        "sh -c 'sh -c \"{prog} 250; true\"; true'",  # make-style: a shell per recipe line
    ],
)
def test_profile_command_attributes_a_grandchilds_samples_to_it(
    broker: BrokerProcess, progs: dict[str, Path], shell: str
) -> None:
    out = progs["dir"] / "tree.folded"
    cmd = shell.format(prog=progs["hotcold"])
    r = gfxclient(
        broker, "fd", "--json", "profile", "--frequency", "499", "-o", str(out),
        "--format", "folded", "--", "sh", "-c", cmd,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    seen = _seen(summary)
    total = summary["total"]
    assert total > 200, (summary, r.stderr)
    assert seen.get("hotcold", 0) >= 0.9 * total, seen
    stacks = folded(out)
    assert any(s.startswith("hotcold;") and ";main;hot;" in s for s in stacks), stacks
    # The audit line says the attach followed the tree.
    attaches = [json.loads(x) for x in broker.stderr_lines() if '"op":"attach"' in x]
    assert attaches and attaches[-1].get("children") is True, attaches[-1:]
    # The text report lists the processes too.
    r = gfxclient(broker, "fd", "profile", "--", "sh", "-c", cmd)
    assert r.returncode == 0 and "hotcold" in r.stdout.split("processes (")[1], r.stdout


def test_a_setuid_child_leaves_the_tree(broker: BrokerProcess, progs: dict[str, Path]) -> None:
    """A child that runs a setuid-root program is another user's process: the
    tree follows the user's own children (hotcold), never suidhot (the kernel's
    uid, euid and dumpable check at every sample, gfx_task.h)."""
    assert os.stat(progs["suidhot"]).st_mode & 0o4000, "the test binary must be setuid"
    out = progs["dir"] / "suid-tree.folded"
    cmd = f"{progs['hotcold']} 150; {progs['suidhot']} 150; true"
    r = gfxclient(
        broker, "fd", "--json", "profile", "--frequency", "499", "-o", str(out),
        "--format", "folded", "--", "sh", "-c", cmd,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    seen = _seen(json.loads(r.stdout))
    assert seen.get("hotcold", 0) > 100, seen  # the tree is followed
    assert "suidhot" not in seen, seen
    assert not any(s.startswith("suidhot") for s in folded(out))


# Forks `early` (spinning when the profile attaches) and a subshell; the
# subshell forks `late` once the attach is done (the file `go` appears).
TREE_SH = """
{early} 250 &
( i=0; while [ ! -e {go} ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done; {late} 150 )
wait
"""

# As alice: start the tree, attach profile to its root, let `late` go, read
# the counts map; prints samples per command name.
ATTACH_PY = """
import json, os, struct, subprocess, sys, time
from gfxbpf.client.broker import Broker
b = Broker.connect(socket=os.environ["SOCK"], via="fd")
tree = subprocess.Popen(["sh", "-c", os.environ["TREE"]])
time.sleep(0.3)  # early and the subshell exist before the attach
a = b.attach("profile", pid=tree.pid, frequency=499, children=sys.argv[1] == "1")
open(os.environ["GO"], "w").close()
tree.wait()
seen = {}
for k, v in a.maps["counts"].raw_items():
    comm = struct.unpack_from("<IiI16s", k)[3].split(b"\\0")[0].decode()
    seen[comm] = seen.get(comm, 0) + int.from_bytes(v, "little")
print(json.dumps(seen))
"""


@pytest.mark.parametrize("children", [True, False])
def test_pid_follows_running_and_newly_forked_descendants(
    broker: BrokerProcess, progs: dict[str, Path], children: bool
) -> None:
    d = progs["dir"]
    go = d / f"go-{children}"
    script = d / "attach_tree.py"
    script.write_text(ATTACH_PY)
    script.chmod(0o644)
    tree = TREE_SH.format(early=progs["early"], late=progs["late"], go=go)
    env = {"SOCK": broker.socket, "TREE": tree, "GO": str(go)}
    r = run_as(ALICE, [VENV_PYTHON, str(script), "1" if children else "0"], env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    if children:
        # early: seeded by the broker from /proc; late: added by the fork hook
        # in the kernel (its parent, the subshell, was seeded).
        assert seen.get("early", 0) > 100 and seen.get("late", 0) > 100, seen
    else:
        assert "early" not in seen and "late" not in seen, seen


def test_stacks_at_counts_calls_made_in_a_child_exactly(
    broker: BrokerProcess, progs: dict[str, Path]
) -> None:
    na, nb = 3000, 1234
    out = progs["dir"] / "tree-calls.folded"
    r = gfxclient(
        broker, "fd", "--json", "profile", "--stacks-at", f"{progs['lib']}:target_fn",
        "--format", "folded", "-o", str(out), "--",
        "sh", "-c", f"{progs['caller']} {na} {nb}; true",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    stacks = folded(out)
    rooted: dict[str, int] = {}
    for s, n in stacks.items():
        k = s[s.index(";main;") + 1 :] if ";main;" in s else s
        rooted[k] = rooted.get(k, 0) + n
    assert rooted == {"main;site_a;target_fn": na, "main;site_b;target_fn": nb}, stacks
    assert json.loads(r.stdout)["total"] == na + nb
    # --no-children: the shell itself never calls it.
    r = gfxclient(
        broker, "fd", "--json", "profile", "--stacks-at", f"{progs['lib']}:target_fn",
        "--no-children", "--", "sh", "-c", f"{progs['caller']} 10 10; true",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == 0


# As alice: a shell that runs `caller` once told to; ucalls attached to the
# shell (which never maps the library itself); prints the calls counted.
UCALLS_PY = """
import os, subprocess, sys
from gfxbpf.client.broker import Broker
b = Broker.connect(socket=os.environ["SOCK"], via="fd")
go, run = os.environ["GO"], os.environ["RUN"]
sh = subprocess.Popen(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; {run}"])
a = b.attach("ucalls", pid=sh.pid, library=os.environ["LIB"], functions=["target_fn"],
             children=sys.argv[1] == "1")
open(go, "w").close()
sh.wait()
print(sum(int.from_bytes(v, "little") for _, v in a.maps["calls"].raw_items()))
"""


@pytest.mark.parametrize("children", [True, False])
def test_ucalls_counts_calls_in_a_child_that_maps_the_library(
    broker: BrokerProcess, progs: dict[str, Path], children: bool
) -> None:
    d = progs["dir"]
    script = d / "ucalls_tree.py"
    script.write_text(UCALLS_PY)
    script.chmod(0o644)
    env = {
        "SOCK": broker.socket,
        "GO": str(d / f"ucalls-go-{children}"),
        "RUN": f"{progs['caller']} 500 250; true",  # a fork, not an exec
        "LIB": str(progs["lib"]),
    }
    r = run_as(ALICE, [VENV_PYTHON, str(script), "1" if children else "0"], env=env)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == (750 if children else 0), r.stdout
