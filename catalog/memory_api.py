"""The allocation functions the `memstacks` program probes, in one table.

One table for both libraries a memory profile attaches to: the process's C
library (host memory) and its libcuda (device memory). The broker attaches
the functions the library defines and skips the rest, so attaching to libc
probes the first part and attaching to libcuda the second. Signatures from
glibc's manual and CUDA's driver API reference (cuda.h); `arg` is the
0-based argument holding the size (or the address freed).

Not probed: glibc's aliases of these names (`__libc_malloc`, `mmap64`: the
same addresses), `valloc`/`pvalloc` (obsolete), `cuMemAllocPitch` (its size
is a product of three arguments), and `cuMemMap`/`cuMemUnmap`: they map
physical memory that `cuMemCreate` already counted (PyTorch's expandable
segments call both), so counting them would count it twice.

Table order is the map key (index): append, never reorder, or clients built
from an older table would name keys wrongly.
"""

from __future__ import annotations

from gfxbpf.catalog.function_tables import TableFunction as F

__all__ = ["DEVICE", "FUNCTIONS", "HANDLE", "HOST", "allocators", "is_device"]

# Address spaces (the cookie's space): equal numbers in two of them are
# different things, so blocks are keyed by both.
HOST, DEVICE, HANDLE = 0, 1, 2

FUNCTIONS: tuple[F, ...] = (
    # The C library: (size) -> pointer
    F("malloc", "malloc", 0),
    F("calloc", "calloc"),
    F("realloc", "realloc"),
    # (void **memptr, size_t alignment, size_t size) -> 0
    F("posix_memalign", "alloc", 2),
    # (size_t alignment, size_t size) -> pointer
    F("aligned_alloc", "malloc", 1),
    F("memalign", "malloc", 1),
    F("free", "free", 0),
    # (addr, length, prot, flags, fd, offset): MAP_ANONYMOUS ones only
    F("mmap", "mmap", 1),
    # (addr, length): a whole mapping; a part of one is not matched
    F("munmap", "free", 0),
    # CUDA: (CUdeviceptr *dptr, size_t bytesize, ...) -> CUDA_SUCCESS
    F("cuMemAlloc_v2", "alloc", 1, space=DEVICE),
    F("cuMemAllocManaged", "alloc", 1, space=DEVICE),
    F("cuMemAllocAsync", "alloc", 1, space=DEVICE),
    F("cuMemAllocAsync_ptsz", "alloc", 1, space=DEVICE),
    F("cuMemAllocFromPoolAsync", "alloc", 1, space=DEVICE),
    F("cuMemAllocFromPoolAsync_ptsz", "alloc", 1, space=DEVICE),
    # (CUdeviceptr dptr[, stream])
    F("cuMemFree_v2", "free", 0, space=DEVICE),
    F("cuMemFreeAsync", "free", 0, space=DEVICE),
    F("cuMemFreeAsync_ptsz", "free", 0, space=DEVICE),
    # Virtual memory management: (CUmemGenericAllocationHandle *handle, size, prop, flags)
    F("cuMemCreate", "alloc", 1, space=HANDLE),
    F("cuMemRelease", "free", 0, space=HANDLE),
)


def is_device(index: int) -> bool:
    """Whether table entry index allocates or frees device memory."""
    return 0 <= index < len(FUNCTIONS) and FUNCTIONS[index].space != HOST


def allocators(device: bool) -> list[str]:
    """The names that allocate in host memory, or in device memory."""
    return [f.name for f in FUNCTIONS if f.role != "free" and (f.space != HOST) == device]
