"""What a refused caller learns (issue #16 findings 6 and 7), against a real broker.

The broker runs as deployed (user gfxbpf, CAP_BPF + CAP_PERFMON only,
tests/kernel/brokerenv.py); the attacks run as gfxtest-mallory and
gfxtest-alice through tests/kernel/askclient.py, over the Unix socket and
over gRPC.

6: the broker's group may read a directory mallory may not. Whether a
   library in it exists must not show in the broker's answers: existing and
   missing paths get the same answer (but for the path itself), whatever
   the transport and whether or not the policy's globs match the path.
7: every way of being refused names no other principal (name or uid) and
   not the policy's path; the audit line of the same request keeps the
   whole rule.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    BROKER_USER,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
    uid_of,
    wait_until,
)

ASKCLIENT = Path(__file__).with_name("askclient.py")
GFXCLIENT_MODULE = "gfxbpf.client"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
WRONG_SHA = "ab" * 32


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    base = shared_dir(None, prefix="gfxbpf-disclosure-")
    # Hidden from mallory, open to the broker's group: what the broker must not reveal.
    hidden = base / "hidden"
    hidden.mkdir()
    shutil.copy(LIBC, hidden / "exists.so")
    (hidden / "exists.txt").write_text("here\n")
    for f in hidden.iterdir():
        os.chmod(f, 0o644)
    os.chown(hidden, 0, ensure_user(BROKER_USER)[1])
    os.chmod(hidden, 0o750)
    public = base / "public"
    public.mkdir()
    shutil.copy(LIBC, public / "libpublic.so")
    os.chmod(public / "libpublic.so", 0o644)
    os.chmod(public, 0o755)
    both = [ALICE, BOB]
    text = policy_for(
        {
            "syscount": {"users": both, "scope": ["self"]},
            "clonecount": {"users": both, "scope": ["self"], "sha256": WRONG_SHA},
            "ucalls": [
                {"users": both, "libraries": [LIBC], "functions": ["getpid"]},
                {"users": [MALLORY], "libraries": [f"{hidden}/*.so", f"{public}/*.so"]},
            ],
        },
        # Every refusal's audit line is compared below: no line may be held back
        # for a summary (the per-uid rate limit has its own test, test_floods.py).
        limits={"audit_lines_per_second": 1000},
    )
    b = BrokerProcess.start(text, base)
    b.install(ASKCLIENT)
    try:
        yield {"broker": b, "hidden": hidden, "public": public, "base": str(base)}
    finally:
        b.stop()
        shutil.rmtree(base, ignore_errors=True)


def ask(env: dict[str, Any], user: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    b: BrokerProcess = env["broker"]
    assert b.grpc is not None
    r = run_as(
        user,
        [VENV_PYTHON, str(b.directory / "askclient.py"), b.socket, b.grpc],
        input=json.dumps(specs),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def both_ways(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**spec, "via": "unix"}, {**spec, "via": "grpc"}]


# ---------------------------------------------------------------- finding 6


def test_hidden_library_existence_does_not_show(env: dict[str, Any]) -> None:
    hidden, public = env["hidden"], env["public"]
    ucalls = {"name": "ucalls", "scope": "self", "pid_self": True, "functions": ["getpid"]}
    cases = []  # (what, [spec for exists, spec for missing])
    for ext in ("so", "txt"):  # matches the policy's globs / does not
        paths = [str(hidden / f"exists.{ext}"), str(hidden / f"missing.{ext}")]
        cases.append(
            (f"unix, path only, .{ext}", [{**ucalls, "via": "unix", "library": p} for p in paths])
        )
        cases.append(
            (
                f"unix, a decoy fd, .{ext}",
                [
                    {**ucalls, "via": "unix", "library": p, "library_fd": "/usr/bin/true"}
                    for p in paths
                ],
            )
        )
        cases.append((f"grpc, .{ext}", [{**ucalls, "via": "grpc", "library": p} for p in paths]))
    specs = [s for _, pair in cases for s in pair]
    # Mallory may trace a library she can read (so refusals are not all there is).
    mine = str(public / "libpublic.so")
    specs += [
        {**ucalls, "via": "unix", "library": mine, "library_fd": mine},
        {**ucalls, "via": "grpc", "library": mine},
    ]
    answers = ask(env, MALLORY, specs)
    assert answers[-2:] == [{"ok": True}, {"ok": True}], answers[-2:]
    differ = []  # every case that tells the two apart, so a failure shows them all
    for i, (what, pair) in enumerate(cases):
        exists, missing = answers[2 * i], answers[2 * i + 1]
        told = [
            {k: str(v).replace(spec["library"], "PATH") for k, v in answer.items()}
            for spec, answer in zip(pair, (exists, missing), strict=True)
        ]
        if exists["ok"] or told[0] != told[1]:
            differ.append((what, exists, missing))
    assert not differ, differ


def test_gfxclient_says_the_users_own_errno_for_a_library_they_cannot_open(
    env: dict[str, Any],
) -> None:
    b: BrokerProcess = env["broker"]
    out = []
    for name in ("exists.so", "missing.so"):
        path = str(env["hidden"] / name)
        argv = [VENV_PYTHON, "-m", GFXCLIENT_MODULE, "--socket", b.socket, "--via", "fd"]
        argv += ["dump", "ucalls", "--pid", "1", "--library", path, "--function", "getpid"]
        r = run_as(MALLORY, argv, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"cannot open library {path}: Permission denied" in r.stderr
        out.append(r.stderr.replace(path, "PATH"))
    assert out[0] == out[1]


# ---------------------------------------------------------------- finding 7


def _names(text: str, users: list[str]) -> list[str]:
    """Which of users appear in text, by name or by uid."""
    return [u for u in users if u in text or re.search(rf"\b{uid_of(u)}\b", text)]


# long: one table of every refusal a user can provoke, then one check over all.
def test_denials_name_no_other_principal_and_no_policy_path(env: dict[str, Any]) -> None:
    b: BrokerProcess = env["broker"]
    changed = b.directory / "changed.bpf.o"
    from gfxbpf.catalog.entries import load_catalog

    entry = load_catalog().get("execsnoop")
    data = bytearray((entry.directory / entry.object).read_bytes())
    data[len(data) // 2] ^= 1
    changed.write_bytes(bytes(data))
    os.chmod(changed, 0o644)
    lib = {"scope": "self", "pid_self": True}
    asks = {
        MALLORY: [
            ("default deny", {"name": "nosuchprogram", "scope": "self"}),
            ("not among users", {"name": "syscount", "scope": "self"}),
            ("hash of a named program", {"name": "clonecount", "scope": "self"}),
        ],
        ALICE: [
            ("scope", {"name": "syscount", "scope": "system"}),
            ("hash of a named program", {"name": "clonecount", "scope": "self"}),
            ("uploaded object", {"object_path": str(changed), "scope": "self"}),
            ("limit", {"object_size": 600 * 1024}),
            (
                "library",
                {
                    **lib,
                    "name": "ucalls",
                    "library": "/usr/bin/true",
                    "library_fd": "/usr/bin/true",
                    "functions": ["getpid"],
                },
            ),
            (
                "function",
                {
                    **lib,
                    "name": "ucalls",
                    "library": LIBC,
                    "library_fd": LIBC,
                    "functions": ["system"],
                },
            ),
        ],
    }
    for user, refusals in asks.items():
        others = [u for u in (ALICE, BOB, MALLORY) if u != user]
        specs = [s for _, spec in refusals for s in both_ways(spec)]
        for s in specs:
            if s["via"] == "grpc":
                s.pop("library_fd", None)
        uid = uid_of(user)

        def refused(uid: int = uid) -> list[dict[str, Any]]:
            return [
                r
                for r in b.audit_records()
                if r["op"] == "attach" and r["uid"] == uid and r["result"] != "ok"
            ]

        before = len(refused())
        answers = ask(env, user, specs)
        # The broker writes an audit line after it answers: wait for all of them, so the
        # lines compared below are this round's refusals and no earlier one.
        want = before + len(specs)
        wait_until(lambda want=want: len(refused()) >= want, 10)
        audit = refused()[before:]
        assert len(audit) == len(specs)
        for (what, _), pair, lines in zip(refusals, _pairs(answers), _pairs(audit), strict=True):
            for answer, line in zip(pair, lines, strict=True):
                assert not answer["ok"], (user, what, answer)
                told = " ".join(str(v) for v in answer.values())
                assert not _names(told, others), (user, what, answer)
                assert b.policy_path not in told and env["base"] not in told, (user, what, answer)
                assert WRONG_SHA not in told and "users = " not in told, (user, what, answer)
                if answer.get("error_rule") is not None:  # gRPC: metadata and Error agree
                    assert answer["error_rule"] == answer["rule"], answer
                # The audit line keeps the whole rule.
                assert line["rule"], (what, line)
                if what not in ("default deny", "uploaded object"):
                    assert b.policy_path in line["rule"], (what, line)
                if what == "not among users":
                    assert _names(line["rule"], [ALICE, BOB]) == [ALICE, BOB], line
                if what == "hash of a named program":
                    assert WRONG_SHA in line["rule"], line


def _pairs(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + 2] for i in range(0, len(items), 2)]
