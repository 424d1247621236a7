"""The libcuda stand-in (cuda_standin.c) and a workload that drives it with
known calls (cuda_workload.c), built with gcc; and the truth of a script.

CI has no GPU. The `cuda` program probes libcuda by symbol name, so a
library that exports the same names with the driver's signatures, named
libcuda.so.1, exercises everything but the GPU: the broker's symbol
lookup, the probes' argument reading, the client's library discovery.
Tests and the bench share this module (tests may import bench; bench may
not import tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gfxbpf.catalog import cuda_api

HERE = Path(__file__).resolve().parent
STANDIN_C = HERE / "cuda_standin.c"
WORKLOAD_C = HERE / "cuda_workload.c"
LIBNAME = "libcuda.so.1"
# What -DGFX_OLD_DRIVER leaves out (cuda_standin.c): the per-thread-stream
# variants and cuLaunchKernelEx.
OLD_DRIVER_LACKS = frozenset(
    f.name
    for f in cuda_api.FUNCTIONS
    if f.name.endswith(("_ptsz", "_ptds")) or f.name == "cuLaunchKernelEx"
)


class BuildError(RuntimeError):
    pass


def _gcc(args: Sequence[str]) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc is not installed (Debian: gcc)")
    r = subprocess.run([gcc, *args], capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise BuildError(f"gcc {' '.join(args)} failed:\n{r.stderr}")


def build_library(
    out_dir: Path, *, old_driver: bool = False, fillers: int = 0, pad_mib: int = 0
) -> Path:
    """out_dir/libcuda.so.1; fillers extra exported functions and pad_mib MiB of
    read-only data make it large like the real one (~100 MB, thousands of symbols)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["-shared", "-fPIC", "-O1", "-o", str(out_dir / LIBNAME), str(STANDIN_C)]
    if old_driver:
        args.append("-DGFX_OLD_DRIVER")
    if fillers or pad_mib:
        filler = out_dir / "filler.h"
        lines = [f"API int gfx_filler_{i}(int x) {{ return x + {i}; }}" for i in range(fillers)]
        if pad_mib:
            # Initialised, so it takes file space as the driver's code and data do.
            lines.append(
                f"API const unsigned char gfx_pad[{pad_mib << 20}] "
                "__attribute__((aligned(4096))) = { 1 };"
            )
        filler.write_text("\n".join(lines) + "\n")
        args.append(f'-DGFX_FILLER_H="{filler}"')
    _gcc(args)
    lib = out_dir / LIBNAME
    os.chmod(lib, 0o755)
    return lib


def build_workload(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / "cuda_workload"
    _gcc(["-O1", "-o", str(exe), str(WORKLOAD_C), "-ldl"])
    os.chmod(exe, 0o755)
    return exe


# ------------------------------------------------------------------ scripts


@dataclass(frozen=True)
class Call:
    """count calls of name with six register arguments (see cuda_workload.c)."""

    name: str
    count: int
    args: tuple[str, ...] = ("0",) * 6

    def line(self) -> str:
        return f"call {self.name} {self.count} {' '.join(self.args)}\n"


def _regs(values: dict[int, str]) -> tuple[str, ...]:
    return tuple(values.get(i, "1") for i in range(6))


def copy(name: str, count: int, nbytes: int, *, fail: bool = False) -> Call:
    """A copy of nbytes; fail=True passes a null destination (the stand-in
    then returns CUDA_ERROR_INVALID_VALUE)."""
    fn = cuda_api.FUNCTIONS[cuda_api.index_of(name)]
    return Call(name, count, _regs({0: "0" if fail else "1", fn.arg: str(nbytes)}))


def alloc(name: str, slot: int, nbytes: int) -> Call:
    fn = cuda_api.FUNCTIONS[cuda_api.index_of(name)]
    return Call(name, 1, _regs({0: f"&{slot}", fn.arg: str(nbytes)}))


def free(name: str, slot: int) -> Call:
    return Call(name, 1, _regs({0: f"*{slot}"}))


MIB = 1 << 20

# Every role, several directions, one failing copy, a free of live memory
# after the peak, per-thread-stream variants (absent from an old driver).
SCRIPT: tuple[Call, ...] = (
    Call("cuLaunchKernel", 1000),
    Call("cuLaunchKernel_ptsz", 10),
    Call("cuLaunchKernelEx", 20),
    Call("cuLaunchCooperativeKernel", 3),
    Call("cuGraphLaunch", 5),
    copy("cuMemcpyHtoD_v2", 7, 4096),
    copy("cuMemcpyHtoDAsync_v2", 3, 1000),
    copy("cuMemcpyHtoD_v2", 1, 999, fail=True),
    copy("cuMemcpyDtoH_v2", 5, 2048),
    copy("cuMemcpyDtoHAsync_v2_ptsz", 2, 333),
    copy("cuMemcpyDtoD_v2", 2, MIB),
    copy("cuMemcpyPeer", 1, 12345),
    copy("cuMemcpy", 4, 100),
    alloc("cuMemAlloc_v2", 0, 1 * MIB),
    alloc("cuMemAlloc_v2", 1, 2 * MIB),
    alloc("cuMemAlloc_v2", 2, 3 * MIB),
    free("cuMemFree_v2", 1),
    alloc("cuMemAllocManaged", 3, 5 * MIB),
    free("cuMemFree_v2", 0),
    alloc("cuMemAllocAsync", 4, 4096),
    free("cuMemFreeAsync", 4),
    Call("cuStreamSynchronize", 3),
    Call("cuCtxSynchronize", 2),
    Call("cuEventSynchronize", 1),
    Call("cuCtxSynchronize_v2", 2),
)


@dataclass
class Truth:
    """What the `cuda` program must report after a script ran."""

    calls: dict[str, int] = field(default_factory=dict)
    bytes_by_direction: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    live: int = 0
    peak: int = 0
    allocs: int = 0
    frees: int = 0
    sync_calls: int = 0


def truth(script: Sequence[Call], absent: frozenset[str] = frozenset()) -> Truth:
    """The figures a script yields on a library lacking `absent` (a model of
    the stand-in: copies with a null destination fail, all else succeeds)."""
    t = Truth(bytes_by_direction=dict.fromkeys(cuda_api.DIRECTIONS, 0))
    sizes: dict[str, int] = {}
    for c in script:
        if c.name in absent:
            continue
        fn = cuda_api.FUNCTIONS[cuda_api.index_of(c.name)]
        t.calls[c.name] = t.calls.get(c.name, 0) + c.count
        if fn.role == "copy":
            if c.args[0] == "0":
                t.errors += c.count
            else:
                t.bytes_by_direction[fn.direction] += c.count * int(c.args[fn.arg])
        elif fn.role == "alloc":
            sizes[c.args[0][1:]] = int(c.args[fn.arg])
            t.live += int(c.args[fn.arg])
            t.peak = max(t.peak, t.live)
            t.allocs += 1
        elif fn.role == "free":
            t.live -= sizes.pop(c.args[0][1:])
            t.frees += 1
        elif fn.role == "sync":
            t.sync_calls += c.count
    return t


class Workload:
    """cuda_workload running (optionally as another user: prefix, e.g. setpriv)."""

    def __init__(self, exe: Path, library: Path, prefix: Sequence[str] = (), **popen: Any) -> None:
        self.proc = subprocess.Popen(
            [*prefix, str(exe), str(library)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            **popen,
        )
        first = self._line()
        if first != "ready":
            self.close()
            raise BuildError(f"cuda_workload did not start: {first!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self) -> str:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        return out.readline().strip()

    def send(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        return self._line()

    def run(self, script: Sequence[Call]) -> list[str]:
        return [self.send(c.line()) for c in script]

    def bench(self, name: str, n: int, rounds: int) -> list[float]:
        """ns per call of each round of n calls."""
        reply = self.send(f"bench {name} {n} {rounds}\n").split()
        if not reply or reply[0] != "ns":
            raise BuildError(f"cuda_workload bench: {' '.join(reply)!r}")
        return [float(x) for x in reply[1:]]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
