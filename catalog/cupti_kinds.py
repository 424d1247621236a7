"""What program `cudakernels`' map `copies` keys a transfer by: its kind.

A memcpy record's kind is CUPTI's CUpti_ActivityMemcpyKind (its activity header:
host, device, array and peer memory, source to destination); a memset's is
MEMSET, which the program sets itself (cudakernels.bpf.c, count_copy). The
client's view and the exporter's label read them with the same names.
"""

from __future__ import annotations

MEMSET = 0x100
COPY_KINDS = {
    0: "unknown",
    1: "htod",
    2: "dtoh",
    3: "htoa",
    4: "atoh",
    5: "atoa",
    6: "atod",
    7: "dtoa",
    8: "dtod",
    9: "htoh",
    10: "ptop",
    MEMSET: "memset",
}


def copy_kind(kind: int) -> str:
    """A kind's name; one CUPTI adds later keeps its number."""
    return COPY_KINDS.get(kind, f"kind {kind}")
