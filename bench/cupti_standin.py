"""The CUPTI stand-in (gpu/cupti/standin.c), gfxbpf's injection library built
against it, and a Python workload that launches known kernels (SCRIPT).

CI has no GPU: the stand-in makes the activity records a GPU would (kernels
"gemm" and "relu" with fixed device times, host-to-device copies), so the
injection library, its USDT probes and the `cudakernels` program run for
real. The CUPTI and CUDA headers come from the wheels gpu/cupti/build.sh
unpacked beside the venv (tools/setup.sh); GFXBPF_CUPTI_DIR names another place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import cuda_standin
from bench.cuda_standin import BuildError, _gcc

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "gpu" / "cupti"
MAJOR = 13
# Device times the workload's kernels take on the stand-in (SCRIPT).
NS = {"gemm": 250_000, "relu": 40_000, "copy": 7_000, "memset": 3_000}
COPY_BYTES, MEMSET_BYTES = 4096, 1024
# The workload: what the CUDA driver does at cuInit (load CUDA_INJECTION64_PATH
# through the stand-in's gfx_standin_init), then one command per stdin line,
# each answered "ok" after the library's poll (records handed to the probes):
#   a N     N launches of "gemm" from launch_a (line 12), straight to the driver
#   b N     N of "gemm" and N of "relu" from launch_b (lines 15, 16), through the
#           runtime (cudaLaunchKernel: two correlation ids, the record has the runtime's)
#   deep N  N of "gemm" from launch_deep (line 19) through the runtime, from under
#           the stand-in's 40 KiB frame (a cuBLASLt launch's depth)
#   pair N  N of "gemm" (deep) and N of "relu" (direct) from one line of
#           launch_pair (line 23): one Python chain, two native launch paths
#   twice N N of "gemm" deep and N direct from one line of <module> (line 40): one
#           chain, one kernel, two native paths (as autograd's thread launches
#           one backward kernel from many backward functions)
#   thread  one "gemm" from a thread (no Python of its own; the main thread waits
#           in the call, line 43) whose stack lies right below other readable memory
#   copy N  N host-to-device copies of COPY_BYTES (cudaMemcpyAsync, line 46)
#   memset N N memsets of MEMSET_BYTES (cudaMemsetAsync, line 50)
#   hold    another CUPTI client takes the subscription (the stand-in refuses ours)
#   release that client lets go
#   stats   "records R launches L collecting C refused F copy_apis A": the injection
#           library's counters
SCRIPT = """\
import ctypes, os, sys
C = ctypes.c_ulonglong
cupti = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libcupti.so.13"))
cupti.gfx_standin_launch.argtypes = [ctypes.c_char_p, C, ctypes.c_int, ctypes.c_int]
cupti.gfx_standin_launch_runtime.argtypes = cupti.gfx_standin_launch.argtypes
cupti.gfx_standin_memcpy.argtypes = [C, ctypes.c_uint, C]
GEMM, RELU = b"gemm", b"relu"  # the stand-in keeps the pointers: module constants
assert cupti.gfx_standin_init() == 1
lib = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
def launch_a(n):
    for _ in range(n):
        cupti.gfx_standin_launch(GEMM, 250000, 128, 256)
def launch_b(n):
    for _ in range(n):
        cupti.gfx_standin_launch_runtime(GEMM, 250000, 64, 128)
        cupti.gfx_standin_launch_runtime(RELU, 40000, 32, 1024)
def launch_deep(n):
    for _ in range(n):
        cupti.gfx_standin_launch_deep(GEMM, 250000, 64, 128)
cupti.gfx_standin_launch_deep.argtypes = cupti.gfx_standin_launch.argtypes
def launch_pair(n):
    for _ in range(n):
        cupti.gfx_standin_launch_pair(GEMM, RELU, 250000, 40000)
cupti.gfx_standin_launch_pair.argtypes = [ctypes.c_char_p, ctypes.c_char_p, C, C]
for f in ("gfx_cupti_records", "gfx_cupti_launches", "gfx_cupti_refusals"):
    getattr(lib, f).restype = C
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "a":
        launch_a(int(arg))
    elif cmd == "b":
        launch_b(int(arg))
    elif cmd == "deep":
        launch_deep(int(arg))
    elif cmd == "pair":
        launch_pair(int(arg))
    elif cmd == "twice":
        for _ in range(int(arg)):
            cupti.gfx_standin_launch_pair(GEMM, GEMM, 250000, 250000)
    elif cmd == "thread":
        cupti.gfx_standin_launch_below_data.argtypes = [ctypes.c_char_p, C]
        assert cupti.gfx_standin_launch_below_data(GEMM, 250000) == 0
    elif cmd == "copy":
        for _ in range(int(arg)):
            cupti.gfx_standin_memcpy(4096, 1, 7000)
    elif cmd == "memset":
        cupti.gfx_standin_memset.argtypes = [C, C]
        for _ in range(int(arg)):
            cupti.gfx_standin_memset(1024, 3000)
    elif cmd == "hold":
        cupti.gfx_standin_hold(1)
    elif cmd == "release":
        cupti.gfx_standin_hold(0)
    elif cmd == "stats":
        print("records", lib.gfx_cupti_records(), "launches", lib.gfx_cupti_launches(),
              "collecting", lib.gfx_cupti_collecting(), "refused", lib.gfx_cupti_refusals(),
              "copy_apis", lib.gfx_cupti_copy_apis(), flush=True)
    lib.gfx_cupti_poll()
    print("ok", flush=True)
"""
# bench/gpu_kernels_workload.py's protocol on the stand-in, for tests of
# bench/gpu_kernels_check.py (gpu_check.sh step 6): "matmul" launches 1 ms
# products from mm_a (a quarter) and mm_b, whose "events" say exactly that;
# "copies" makes 8 MiB copies each way in 1 ms, and says so;
# "profiler_start"/"profiler_stop" stand for a torch.profiler session as a
# client that holds CUPTI's subscription (its trace is not modelled: None).
GPU_CHECK_SCRIPT = """\
import ctypes, json, os, sys, time
C = ctypes.c_ulonglong
cupti = ctypes.CDLL(os.environ["GFX_STANDIN"])  # the checker runs a copy of this file
cupti.gfx_standin_launch_runtime.argtypes = [ctypes.c_char_p, C, ctypes.c_int, ctypes.c_int]
cupti.gfx_standin_init()
path = os.environ.get("CUDA_INJECTION64_PATH")
lib = ctypes.CDLL(path) if path else None
GEMM, ADD, NS = b"gemm", b"add", 1000000
def mm_a(n):
    for _ in range(n):
        cupti.gfx_standin_launch_runtime(GEMM, NS, 64, 256)
def mm_b(n):
    for _ in range(n):
        cupti.gfx_standin_launch_runtime(GEMM, NS, 64, 256)
def loop(n):
    t = time.perf_counter()
    for _ in range(n):
        cupti.gfx_standin_launch_runtime(ADD, 1000, 1, 32)
    return {"launches": n, "launched": n, "s_per_launch": (time.perf_counter() - t) / n}
print(json.dumps({"ready": os.getpid(), "injected": lib is not None}), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "exit":
        break
    reply = {"size": 1}
    if cmd == "matmul":
        n = int(arg)
        mm_a(n // 4)
        mm_b(n - n // 4)
        reply = {"products": n, "event_ns_total": n * NS, "event_ns_mean": NS}
    elif cmd in ("loop", "profile"):
        reply = loop(int(arg))
    elif cmd == "copies":  # htod (CUPTI kind 1) and dtoh (2), 8 MiB in 1 ms each
        cupti.gfx_standin_memcpy.argtypes = [C, ctypes.c_uint, C]
        for _ in range(int(arg)):
            cupti.gfx_standin_memcpy(8 << 20, 1, NS)
            cupti.gfx_standin_memcpy(8 << 20, 2, NS)
        reply = {"copies": int(arg), "bytes": 8 << 20,
                 "event_ns": {"htod": int(arg) * NS, "dtoh": int(arg) * NS}}
    elif cmd == "profiler_start":  # a profiler that holds CUPTI's subscription
        cupti.gfx_standin_hold(1)
        reply = {"started": True}
    elif cmd == "profiler_stop":
        reply = {**loop(int(arg)), "profiler_kernels": None}
        cupti.gfx_standin_hold(0)
    elif cmd == "stats":
        reply = {"records": lib.gfx_cupti_records(), "launches": lib.gfx_cupti_launches(),
                 "collecting": lib.gfx_cupti_collecting(),
                 "refused": lib.gfx_cupti_refusals(),
                 "copy_apis": lib.gfx_cupti_copy_apis()} if lib else {"records": None}
    if lib:
        lib.gfx_cupti_poll()
    print(json.dumps(reply), flush=True)
"""
GPU_CHECK_NS = 1_000_000
A_LINE, B_GEMM_LINE, B_RELU_LINE, DEEP_LINE, PAIR_LINE = 12, 15, 16, 19, 23  # in SCRIPT
MODULE_A_LINE, MODULE_B_LINE, MODULE_DEEP_LINE, MODULE_TWICE_LINE = 31, 33, 35, 40
MODULE_THREAD_LINE = 43  # where the main thread waits while the thread launches
MODULE_COPY_LINE, MODULE_MEMSET_LINE = 46, 50


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
    script: Path  # the workload (SCRIPT)


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
    script = out / "cupti_workload.py"
    script.write_text(SCRIPT)
    (out / "gpu_check_workload.py").write_text(GPU_CHECK_SCRIPT)
    for p in (standin, inject, script):
        os.chmod(p, 0o755)
    return Built(standin, inject, script)


class Workload(cuda_standin.Workload):
    """The workload running with the injection library (prefix: e.g. setpriv)."""

    def __init__(self, built: Built, python: str, prefix: Sequence[str] = (), **popen: Any) -> None:
        env = dict(popen.pop("env", None) or os.environ)
        env["CUDA_INJECTION64_PATH"] = str(built.inject)
        env.setdefault("GFX_CUPTI_POLL_MS", "20")
        super().__init__(Path(python), built.script, prefix, env=env, **popen)

    def command(self, text: str) -> list[str]:
        """Send one command; the lines it printed before its "ok"."""
        lines = [self.send(text + "\n")]
        while lines[-1] != "ok":
            if not lines[-1]:
                raise RuntimeError(f"the workload exited ({self.proc.wait()})")
            lines.append(self._line())
        return lines[:-1]

    def stats(self) -> dict[str, int]:
        words = self.command("stats")[0].split()  # "records R launches L ..."
        return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}
