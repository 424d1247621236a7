"""The CUPTI stand-in (gpu/cupti/standin.c), gfxbpf's injection library built
against it, and a workload that launches known kernels (cupti_workload.c).

CI has no GPU: the stand-in makes the activity records a GPU would (kernels
"gemm" and "relu" with fixed device times, host-to-device copies), so the
injection library, its USDT probes and the `cudakernels` program run for
real. The CUPTI and CUDA headers come from the wheels gpu/cupti/build.sh
unpacked beside the venv (tools/setup.sh); GFXBPF_CUPTI_DIR names another place.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.cuda_standin import BuildError, _gcc

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "gpu" / "cupti"
WORKLOAD_C = Path(__file__).resolve().parent / "cupti_workload.c"
MAJOR = 13
# Device times the workload's kernels take on the stand-in (cupti_workload.c).
NS = {"gemm": 250_000, "relu": 40_000, "copy": 7_000}
COPY_BYTES = 4096


def cupti_dir() -> Path:
    """Where setup.sh unpacked the CUPTI wheels: beside the venv's folder."""
    env = os.environ.get("GFXBPF_CUPTI_DIR")
    return Path(env) if env else Path(sys.prefix).resolve().parent / "cupti"


def includes() -> list[str]:
    inc = cupti_dir() / f"cu{MAJOR}" / "include"
    if not (inc / "cupti.h").exists():
        raise BuildError(f"no CUPTI headers in {inc} (run tools/setup.sh, gpu/cupti/build.sh)")
    return ["-I", str(inc), "-I", str(ROOT / "catalog" / "programs")]


@dataclass(frozen=True)
class Built:
    standin: Path  # libcupti.so.13, the stand-in
    inject: Path  # the injection library, linked to the stand-in
    workload: Path


def build(out: Path) -> Built:
    out.mkdir(parents=True, exist_ok=True)
    soname = f"libcupti.so.{MAJOR}"
    standin = out / soname
    _gcc(["-shared", "-fPIC", "-O1", "-Wno-deprecated-declarations", *includes(),
          f"-Wl,-soname,{soname}", "-o", str(standin), str(GPU / "standin.c"), "-ldl",
          "-lpthread"])  # fmt: skip
    inject = out / f"libgfxcupti-cu{MAJOR}.so"
    _gcc(["-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wno-deprecated-declarations",
          *includes(), "-o", str(inject), str(GPU / "inject.c"), "-L", str(out),
          f"-l:{soname}", f"-Wl,-rpath,{out}", "-lpthread"])  # fmt: skip
    workload = out / "cupti_workload"
    _gcc(["-O1", "-fno-omit-frame-pointer", "-o", str(workload), str(WORKLOAD_C), "-L", str(out),
          f"-l:{soname}", f"-Wl,-rpath,{out}", "-ldl"])  # fmt: skip
    for p in (standin, inject, workload):
        os.chmod(p, 0o755)
    return Built(standin, inject, workload)


class Workload:
    """The workload as a child process (prefix: e.g. setpriv to run as a user)."""

    def __init__(self, built: Built, prefix: list[str] | None = None, **popen: Any) -> None:
        env = dict(popen.pop("env", None) or os.environ)
        env["CUDA_INJECTION64_PATH"] = str(built.inject)
        env.setdefault("GFX_CUPTI_POLL_MS", "20")
        self.proc = subprocess.Popen(
            [*(prefix or []), str(built.workload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, **popen,
        )  # fmt: skip
        assert self._line() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self) -> str:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise RuntimeError(f"cupti_workload exited ({self.proc.wait()})")
        return line.strip()

    def command(self, text: str) -> list[str]:
        """Send one command; the lines it printed before its "ok"."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        lines = []
        while (line := self._line()) != "ok":
            lines.append(line)
        return lines

    def stats(self) -> dict[str, int]:
        words = self.command("stats")[0].split()
        return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
