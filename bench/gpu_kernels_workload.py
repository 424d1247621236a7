"""The PyTorch workload of tools/gpu_check.sh's GPU-time step (run as the ordinary user).

One command per line on stdin, one JSON line back per command:

  prep        allocates the matrices and runs one product (cuBLAS picks and loads its kernel)
  matmul N    N matrix products of a fixed size, N/4 from `mm_a` and 3N/4 from
              `mm_b`, each between two CUDA events recorded while the GPU is
              busy (a spacer kernel from `_gpu_busy` first): the truth of their
              device time (torch.cuda.Event.elapsed_time), and how many kernels one
              product launches (torch.profiler is not used: it would take CUPTI)
  loop N      N launches of a tiny kernel back to back (launch-bound): seconds per launch
  profile N   the same loop under torch.profiler (CUDA activities): seconds per launch
  profile_count N   the same, and the kernels torch.profiler's trace holds
  profiler_start / profiler_stop N   a torch.profiler session left open across
              other commands (a watch that ends meanwhile), then the loop and
              the kernels its trace holds
  copies N    N host-to-device and N device-to-host copies of COPY_BYTES between
              pinned host memory and the GPU, each between CUDA events: the truth
              of the copies `cudakernels` counts (count, bytes) and their time
  train N     N training steps of a small transformer (two encoder layers, AdamW):
              seconds per step in `s_per_launch` (a realistic launch rate, for
              the cost of listening beside the launch-bound loop's)
  stats       the injection library's counters (records collected, launches seen)
  exit
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

import torch

SIZE = int(os.environ.get("GFX_MATMUL_SIZE", "8192"))


def _lib() -> Any:
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return None
    lib = ctypes.CDLL(path)  # the copy the driver loaded: same handle
    for name in ("gfx_cupti_records", "gfx_cupti_launches"):
        getattr(lib, name).restype = ctypes.c_ulonglong
    if hasattr(lib, "gfx_cupti_refusals"):  # libraries built before 2026-11-29 lack it
        lib.gfx_cupti_refusals.restype = ctypes.c_ulonglong
    return lib


# GPU clock cycles of the spacer before each timed product (~2 ms at 2 GHz):
# longer than the host takes to launch the product, listened to or not.
SPACER_CYCLES = int(os.environ.get("GFX_SPACER_CYCLES", "4000000"))


def _gpu_busy() -> None:
    """Keep the GPU busy while the host launches the product, so that the start
    event runs right before the product's kernel: on an idle GPU it runs at
    once, and the events then also time the host's launch (tens of µs, more
    with a launch probe), which is no kernel's device time."""
    torch._C._cuda_sleep(SPACER_CYCLES)  # torch.cuda._sleep's own call: this line launches


def _timed(a: torch.Tensor, b: torch.Tensor, out: list[float]) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _gpu_busy()
    start.record()
    torch.mm(a, b)
    end.record()
    end.synchronize()
    out.append(start.elapsed_time(end) * 1e6)  # ms -> ns


def mm_a(a: torch.Tensor, b: torch.Tensor, n: int, out: list[float]) -> None:
    for _ in range(n):
        _timed(a, b, out)


def mm_b(a: torch.Tensor, b: torch.Tensor, n: int, out: list[float]) -> None:
    for _ in range(n):
        _timed(a, b, out)


MATS: list[torch.Tensor] = []


def prep() -> dict[str, Any]:
    MATS[:] = [torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    torch.mm(MATS[0], MATS[1])  # cuBLAS picks its kernel (and loads it) before the window
    torch.cuda.synchronize()
    return {"size": SIZE}


def matmul(n: int) -> dict[str, Any]:
    a, b = MATS
    ns: list[float] = []
    mm_a(a, b, n // 4, ns)
    mm_b(a, b, n - n // 4, ns)
    return {"size": SIZE, "products": len(ns), "from_mm_a": n // 4, "from_mm_b": n - n // 4,
            "event_ns_total": sum(ns), "event_ns_mean": sum(ns) / len(ns),
            "event_ns_min": min(ns), "event_ns_max": max(ns)}  # fmt: skip


COPY_BYTES = 8 << 20


def copies(n: int) -> dict[str, Any]:
    host = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()  # a host copy, not CUDA's
    dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    ns = {"htod": 0.0, "dtoh": 0.0}
    for _ in range(n):
        for kind, dst, src in (("htod", dev, host), ("dtoh", host, dev)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            ns[kind] += start.elapsed_time(end) * 1e6  # ms -> ns
    return {"copies": n, "bytes": COPY_BYTES, "event_ns": ns}


def launch_loop(x: torch.Tensor, n: int) -> None:
    for _ in range(n):
        x.add_(1)


WARMUP = 1000  # launches of `loop` before its timed ones


def loop(n: int) -> dict[str, Any]:
    x = torch.zeros(16, device="cuda")
    launch_loop(x, WARMUP)
    torch.cuda.synchronize()
    t = time.perf_counter()
    launch_loop(x, n)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    return {"launches": n, "launched": WARMUP + n, "s_per_launch": dt / n,
            "check": float(x[0].item())}  # fmt: skip


TRAIN: list[Any] = []  # model, optimizer, batch: built at the first `train`
DEVICE = os.environ.get("GFX_TORCH_DEVICE", "cuda")  # "cpu": a smoke test without a GPU


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    model(x).float().pow(2).mean().backward()
    opt.step()


def train(n: int) -> dict[str, Any]:
    if not TRAIN:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(DEVICE)
        TRAIN[:] = [model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                    torch.randn(16, 128, 512, device=DEVICE)]  # fmt: skip
        for _ in range(3):  # cuBLAS and the allocator settle before any window
            _train_step(*TRAIN)
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(n):
        _train_step(*TRAIN)
    sync()
    return {"steps": n, "s_per_launch": (time.perf_counter() - t) / n}


def _torch_profiler() -> Any:
    """torch.profiler as a user runs it on a GPU: CPU and CUDA activities."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    return torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def profile(n: int) -> dict[str, Any]:
    with _torch_profiler():
        return loop(n)


PROFILER: list[Any] = []  # a torch.profiler session left open (profiler_start)


def _profiler_kernels(prof: Any) -> int:
    """Kernels in torch.profiler's trace (its CUDA events)."""
    from torch.autograd import DeviceType

    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def profiler_start() -> dict[str, Any]:
    prof = _torch_profiler()
    prof.__enter__()
    PROFILER[:] = [prof]
    return {"started": True}


def profiler_stop(n: int) -> dict[str, Any]:
    """The loop, then the session profiler_start opened ends: the kernels the
    loop launched, and how many of them the trace holds."""
    launched = loop(n)["launched"]
    prof = PROFILER.pop()
    prof.__exit__(None, None, None)
    return {"launches": launched, "profiler_kernels": _profiler_kernels(prof)}


def profile_count(n: int) -> dict[str, Any]:
    """The loop under torch.profiler, and how many of its kernels the trace holds."""
    profiler_start()
    return profiler_stop(n)


def main() -> int:
    torch.zeros(1, device="cuda")  # cuInit: the driver loads CUDA_INJECTION64_PATH here
    lib = _lib()
    print(json.dumps({"ready": os.getpid(), "injected": lib is not None}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "prep":
            reply = prep()
        elif cmd == "matmul":
            reply = matmul(int(arg))
        elif cmd == "loop":
            reply = loop(int(arg))
        elif cmd == "profile":
            reply = profile(int(arg))
        elif cmd == "copies":
            try:  # new in the check: its failure must not end the run's other steps
                reply = copies(int(arg))
            except (RuntimeError, ValueError) as e:
                reply = {"error": f"{type(e).__name__}: {e}"}
        elif cmd == "train":
            reply = train(int(arg))
        elif cmd == "profile_count":
            reply = profile_count(int(arg))
        elif cmd == "profiler_start":
            reply = profiler_start()
        elif cmd == "profiler_stop":
            reply = profiler_stop(int(arg))
        elif cmd == "stats":
            reply = {"records": lib.gfx_cupti_records() if lib else None,
                     "launches": lib.gfx_cupti_launches() if lib else None,
                     "collecting": lib.gfx_cupti_collecting() if lib else None,
                     "refused": lib.gfx_cupti_refusals()
                     if lib and hasattr(lib, "gfx_cupti_refusals") else None,
                     # the copy and memset calls it probes (since 2026-11-29)
                     "copy_apis": lib.gfx_cupti_copy_apis()
                     if lib and hasattr(lib, "gfx_cupti_copy_apis") else None}  # fmt: skip
        elif cmd == "exit":
            return 0
        else:
            reply = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
