"""Run by test_usdt.py as the broker's user with only CAP_BPF + CAP_PERFMON:
load the USDT object, try both attach paths on the target's gated probe, and
print what happened as JSON. argv: OBJECT TARGET HITS."""

from __future__ import annotations

import json
import subprocess
import sys

from gfxbpf.bpf.consts import BPF_TRACE_UPROBE_MULTI
from gfxbpf.bpf.link import usdt
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec


def main() -> None:
    obj_path, target, hits = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = ObjectSpec.from_file(obj_path)
    spec.programs["gated"].expected_attach_type = BPF_TRACE_UPROBE_MULTI
    out: dict[str, object] = {}
    with load(spec, programs=["gated"]) as obj:
        specs, fd = obj.map(usdt.SPECS_MAP), obj.programs["gated"].fd
        try:  # the perf uprobe PMU: refused without CAP_SYS_ADMIN
            usdt.attach_usdt(fd, specs, target, "gfxtest", "gated").close()
            out["perf"] = "attached"
        except OSError as e:
            out["perf"] = e.errno
        proc = subprocess.Popen(
            [target, hits], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdout.readline()  # ready
        with usdt.attach_usdt(fd, specs, target, "gfxtest", "gated", pid=proc.pid, multi=True):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out["target"] = proc.stdout.readline().strip()
            proc.wait(timeout=30)
        bss = obj.map(".bss").lookup(0)
        v = spec.maps[".bss"].variables["gated_hits"]
        out["gated_hits"] = int.from_bytes(bss[v.offset : v.offset + v.size], "little")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
