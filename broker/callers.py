"""Who is asking the broker: the identity every decision starts from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """Who is asking: from SO_PEERCRED (Unix) or a token / certificate (gRPC)."""

    uid: int
    gid: int
    gids: tuple[int, ...]  # primary and supplementary groups
    pid: int  # 0 over gRPC
    transport: str  # "unix" | "grpc"
