"""Reading BPF objects with pyelftools (issue 36 item 7): what it costs, and
that the idle broker does not pay for it.

- import: pyelftools imported in a fresh process (wall time and RSS), which
  the first object a process reads pays once;
- per catalog object, after that import: the read into an ObjectSpec
  (elf/relocatable.py on pyelftools, then BTF, maps, programs, relocations),
  as the broker reads it at each load, and the catalog's check of it that
  `gfxbpf-admin approve` runs (the read included), medians;
- the idle broker's RSS, 1 s after its gRPC socket appears, started as
  deploy/gfxbpf.service starts it (the service user, two capabilities): this
  tree as installed, or --after SITE, and with --before SITE another build of
  the package first on its path (`pip install --no-deps --target SITE` of
  the commit to compare; build both so, since an editable install's import
  hook alone costs ~0.7 MiB).

    sudo python3 -m bench.object_read [--before SITE] [--after SITE] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, SERVICE_USER, BenchError, rss_kib
from bench.stats import median
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

_IMPORT = (
    "import json, time\n"
    "def rss():\n"
    "    st = open('/proc/self/status').read()\n"
    "    return int(st.split('VmRSS:')[1].split()[0])\n"
    "import gfxbpf.bpf.object\n"
    "r0, t0 = rss(), time.perf_counter()\n"
    "import elftools.elf.elffile\n"
    "print(json.dumps({'import_s': time.perf_counter() - t0, 'import_rss_kib': rss() - r0}))\n"
)


def import_cost() -> dict[str, float]:
    """pyelftools' import in a fresh process: wall seconds and RSS (KiB)."""
    r = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout))


def object_costs(rounds: int) -> list[dict[str, Any]]:
    """Per catalog object: median read (ObjectSpec.parse) and check seconds."""
    from gfxbpf.bpf.object import ObjectSpec
    from gfxbpf.catalog.objects import check_object

    out = []
    for entry in load_catalog():
        data = object_path(entry).read_bytes()
        name = entry.object.split(".", 1)[0]
        read, check = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ObjectSpec.parse(data, name)
            t1 = time.perf_counter()
            if check_object(entry, data):
                raise BenchError(f"{entry.object} does not match its catalog entry")
            check.append(time.perf_counter() - t1)
            read.append(t1 - t0)
        row = {"object": entry.object, "bytes": len(data)}
        out.append({**row, "read_s": round(median(read), 5), "check_s": round(median(check), 5)})
    return out


def _broker_argv(work: Path) -> list[str]:
    sys.path.insert(0, str(REPO / "tools"))
    from unit_exec import setpriv_argv

    return setpriv_argv(
        REPO / "deploy/gfxbpf.service",
        {"--policy": str(work / "policy.toml"), "--socket": str(work / "control.sock"),
         "--grpc": f"unix:{work / 'grpc.sock'}",
         "program": str(Path(sys.executable).parent / "gfxbpf-broker")},
    )  # fmt: skip


def idle_rss(work: Path, site: str | None) -> int:
    """VmRSS (KiB) of a broker 1 s after its gRPC socket appears (the control
    socket is bound before the start-up checks, the gRPC one after them)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site:
        env["PYTHONPATH"] = site
    for stale in work.glob("*.sock"):
        stale.unlink()
    p = subprocess.Popen(_broker_argv(work), env=env, stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (work / "grpc.sock").exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the broker did not start: {p.stderr.read() if p.stderr else ''}")
            time.sleep(0.05)
        time.sleep(1.0)
        return rss_kib(p.pid)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)


def broker_rss(rounds: int, before: str | None, after: str | None = None) -> dict[str, Any]:
    """Idle RSS of this tree's broker (and before's), rounds each, alternating."""
    work = Path(tempfile.mkdtemp(prefix="gfxbench-objread-"))
    svc = pwd.getpwnam(SERVICE_USER)
    try:
        shutil.copy(REPO / "deploy/policy.example.toml", work / "policy.toml")
        os.chmod(work, 0o755)
        os.chown(work, svc.pw_uid, svc.pw_gid)
        after_kib, before_kib = [], []
        for _ in range(rounds):
            after_kib.append(idle_rss(work, after))
            if before:
                before_kib.append(idle_rss(work, before))
        out: dict[str, Any] = {"rss_idle_kib": after_kib}
        if before:
            out["rss_idle_before_kib"] = before_kib
            out["rss_idle_change_kib"] = median(after_kib) - median(before_kib)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.object_read", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--before", metavar="SITE", help="a site dir with the build to compare")
    ap.add_argument("--after", metavar="SITE", help="a site dir with this tree's build")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each measurement")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "object_read: run as root (it starts the broker as the service user)", file=sys.stderr
        )
        return 2
    result = {"import": import_cost(), "objects": object_costs(args.rounds),
              "broker": broker_rss(args.rounds, args.before, args.after)}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"pyelftools import: {result['import']['import_s'] * 1e3:.0f} ms, "
          f"{result['import']['import_rss_kib'] / 1024:.1f} MiB")  # fmt: skip
    for o in result["objects"]:
        print(f"{o['object']:28} {o['bytes']:>8} B  read {o['read_s'] * 1e3:6.1f} ms  "
              f"check {o['check_s'] * 1e3:6.1f} ms")  # fmt: skip
    b = result["broker"]
    print(f"idle broker RSS (KiB): {b['rss_idle_kib']}"
          + (f"; before: {b['rss_idle_before_kib']}, median change {b['rss_idle_change_kib']} KiB"
             if args.before else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
