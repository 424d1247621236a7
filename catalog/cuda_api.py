"""The CUDA driver API functions the `cuda` program probes, in one table.

Used by the broker (which functions to attach, their bpf cookies), the
client (naming map keys, grouping copies by direction) and the tests (the
stand-in library exports these names). Signatures from CUDA's driver API
reference (cuda.h); `arg` is the 0-based argument holding the byte count
(copies, allocations) or the device pointer (frees). The `_ptsz`/`_ptds`
variants are the per-thread-default-stream entry points with the same
arguments. An allocation's device pointer is written through argument 0
(CUdeviceptr *dptr) and read back on return.

Table order is the map key (index): append, never reorder, or clients
built from an older table would name keys wrongly.
"""

from __future__ import annotations

from gfxbpf.catalog.function_tables import TableFunction as F

__all__ = ["DIRECTIONS", "FUNCTIONS", "by_role", "index_of"]

DIRECTIONS = ("htod", "dtoh", "dtod", "any")

FUNCTIONS: tuple[F, ...] = (
    # Kernel launches
    F("cuLaunchKernel", "launch"),
    F("cuLaunchKernel_ptsz", "launch"),
    F("cuLaunchKernelEx", "launch"),
    F("cuLaunchKernelEx_ptsz", "launch"),
    F("cuLaunchCooperativeKernel", "launch"),
    F("cuLaunchCooperativeKernel_ptsz", "launch"),
    F("cuGraphLaunch", "launch"),
    F("cuGraphLaunch_ptsz", "launch"),
    # Copies: (dst, src, ByteCount[, stream])
    F("cuMemcpyHtoD_v2", "copy", 2, "htod"),
    F("cuMemcpyHtoD_v2_ptds", "copy", 2, "htod"),
    F("cuMemcpyHtoDAsync_v2", "copy", 2, "htod"),
    F("cuMemcpyHtoDAsync_v2_ptsz", "copy", 2, "htod"),
    F("cuMemcpyDtoH_v2", "copy", 2, "dtoh"),
    F("cuMemcpyDtoH_v2_ptds", "copy", 2, "dtoh"),
    F("cuMemcpyDtoHAsync_v2", "copy", 2, "dtoh"),
    F("cuMemcpyDtoHAsync_v2_ptsz", "copy", 2, "dtoh"),
    F("cuMemcpyDtoD_v2", "copy", 2, "dtod"),
    F("cuMemcpyDtoD_v2_ptds", "copy", 2, "dtod"),
    F("cuMemcpyDtoDAsync_v2", "copy", 2, "dtod"),
    F("cuMemcpyDtoDAsync_v2_ptsz", "copy", 2, "dtod"),
    # Unified addressing: the driver infers the direction from the pointers.
    F("cuMemcpy", "copy", 2, "any"),
    F("cuMemcpy_ptds", "copy", 2, "any"),
    F("cuMemcpyAsync", "copy", 2, "any"),
    F("cuMemcpyAsync_ptsz", "copy", 2, "any"),
    # (dstDevice, dstContext, srcDevice, srcContext, ByteCount[, stream])
    F("cuMemcpyPeer", "copy", 4, "dtod"),
    F("cuMemcpyPeer_ptds", "copy", 4, "dtod"),
    F("cuMemcpyPeerAsync", "copy", 4, "dtod"),
    F("cuMemcpyPeerAsync_ptsz", "copy", 4, "dtod"),
    # Allocations: (CUdeviceptr *dptr, size_t bytesize, ...)
    F("cuMemAlloc_v2", "alloc", 1),
    F("cuMemAllocAsync", "alloc", 1),
    F("cuMemAllocAsync_ptsz", "alloc", 1),
    F("cuMemAllocManaged", "alloc", 1),
    F("cuMemAllocFromPoolAsync", "alloc", 1),
    F("cuMemAllocFromPoolAsync_ptsz", "alloc", 1),
    # Frees: (CUdeviceptr dptr[, stream])
    F("cuMemFree_v2", "free", 0),
    F("cuMemFreeAsync", "free", 0),
    F("cuMemFreeAsync_ptsz", "free", 0),
    # Time blocked waiting for the GPU
    F("cuStreamSynchronize", "sync"),
    F("cuStreamSynchronize_ptsz", "sync"),
    F("cuCtxSynchronize", "sync"),
    F("cuEventSynchronize", "sync"),
    # CUDA 13's runtime synchronizes a device through this one (seen on driver
    # 580 with PyTorch 2.11: cudaDeviceSynchronize never called cuCtxSynchronize)
    F("cuCtxSynchronize_v2", "sync"),
)


def index_of(name: str) -> int:
    for i, f in enumerate(FUNCTIONS):
        if f.name == name:
            return i
    raise KeyError(name)


def by_role(role: str) -> list[int]:
    """Table indexes of the functions with this role."""
    return [i for i, f in enumerate(FUNCTIONS) if f.role == role]
