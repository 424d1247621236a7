"""gfxclient profile's kinds beside CPU, off-CPU and wall time: the flags and
checks of --locks/--wakers (locks.py) and --memory/--memory-live/--cuda
(memory.py), in front of profile_cmd (docs/ARCHITECTURE.md)."""

# memory only: locks.py imports profile_cmd, which imports this package.
from gfxbpf.client.cli.kinds import memory

__all__ = ["memory"]
