"""Stored tracefs trees of GPU events, one per kernel (or driver) release.

tests/data/formats/releases/<release>/<system>/<event> holds the `format`
text that release's tracefs would show (see the README there). A release
tree stands in for a live tracefs: an event exists when its file does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gfxbpf.bpf.link import tracefs
from gfxbpf.catalog.entries import FIELD_ABSENT

# The kernel sources' layouts (tests/data/formats/README.md), written out
# independently of the stored files.
DRMSCHED_617 = {
    "off_q_name": 8,
    "off_q_context": 24,
    "off_q_seqno": 32,
    "off_q_client": 40,
    "off_r_name": 8,
    "off_r_context": 24,
    "off_r_seqno": 32,
    "off_r_client": 40,
    "off_d_context": 8,
    "off_d_seqno": 16,
}
DRMSCHED_616 = {
    "off_lq_fence": 16,
    "off_lq_name": 24,
    "off_lr_fence": 16,
    "off_lr_name": 24,
    "off_ld_fence": 8,
}
XE_611 = {
    "off_x_dev": 8,
    "off_x_fence": 40,
    "off_r_dev": 8,
    "off_r_fence": 40,
    "off_f_fence": 40,
    "off_t_dev": 8,
    "off_b_vm": 24,
    "off_b_start": 40,
    "off_b_end": 48,
    "off_u_vm": 24,
    "off_u_start": 40,
    "off_u_end": 48,
}
VBLANK = {"off_crtc": 8, "off_seq": 12}
# dma_fence_signaled: context u32@16, seqno u32@20 in every release stored.
AMDGPU_SIGNALED = {
    "off_sig_context": 16,
    "size_sig_context": 4,
    "off_sig_seqno": 20,
    "size_sig_seqno": 4,
}
AMDGPU_VM = {"off_map_start": 16, "off_map_last": 24, "off_unmap_start": 16, "off_unmap_last": 24}
AMDGPU_616 = {
    "off_cs_context": 20,
    "size_cs_context": 4,
    "off_cs_seqno": 24,
    "size_cs_seqno": 4,
    "off_cs_ring": 40,
    "off_run_context": 20,
    "size_run_context": 4,
    "off_run_seqno": 24,
    "size_run_seqno": 4,
    "off_run_ring": 28,
    **AMDGPU_SIGNALED,
    **AMDGPU_VM,
}
AMDGPU_617 = {
    "off_cs_context": 16,
    "size_cs_context": 8,
    "off_cs_seqno": 24,
    "size_cs_seqno": 8,
    "off_cs_ring": 40,
    "off_run_context": 16,
    "size_run_context": 8,
    "off_run_seqno": 24,
    "size_run_seqno": 8,
    "off_run_ring": 32,
    **AMDGPU_SIGNALED,
    **AMDGPU_VM,
}

# (release, program) -> (variant, knobs) where the program runs on that release.
RUNS = {
    ("6.16", "drmsched"): ("legacy", DRMSCHED_616),
    ("6.17", "drmsched"): ("6.17+", DRMSCHED_617),
    ("6.16", "amdgpu"): (None, AMDGPU_616),
    ("6.17", "amdgpu"): (None, AMDGPU_617),
    ("6.11", "xe"): (None, XE_611),
    ("nvidia-580", "xid"): (None, {"off_dev": 8, "off_code": 12, "off_msg": 16}),
    ("6.18", "vblank"): (None, {**VBLANK, "off_time": 16}),
    ("drm-no-time", "vblank"): (None, {**VBLANK, "off_time": FIELD_ABSENT}),
}
# (release, program) -> the field that release lacks.
LACKS = {("6.10", "xe"): "xe:xe_sched_job_exec has no field 'dev'"}

RELEASES_DIR = Path(__file__).resolve().parent / "data" / "formats" / "releases"


def releases() -> list[str]:
    return sorted(p.name for p in RELEASES_DIR.iterdir() if p.is_dir())


def exists_in(release: str) -> Callable[[str, str], bool]:
    root = RELEASES_DIR / release
    return lambda system, event: (root / system / event).is_file()


def reader_for(release: str) -> Callable[[str, str], tracefs.EventFormat]:
    root = RELEASES_DIR / release

    def read(system: str, event: str) -> tracefs.EventFormat:
        path = root / system / event
        if not path.is_file():
            raise tracefs.TracepointNotFound(2, f"{system}:{event} is not in release {release}")
        return tracefs.parse_format(path.read_text())

    return read
