"""Uprobe programs whose functions come from a table, not from the client.

A program such as `cuda` probes a fixed set of library functions, each with
a role (what the BPF program does on entry and return) and, for some, the
argument that holds a byte count or a pointer. The broker attaches every
function of the table the library defines, skips (and reports) the rest,
and gives each probe a bpf cookie that tells the program all it needs:

    cookie = index | role << 8 | arg << 16 | space << 24

index is the function's position in the table (it keys the maps, and the
client names it from the same table); arg is the 0-based argument number;
space keeps addresses that may be equal apart (memstacks: host memory,
device pointers, device allocation handles; 0 elsewhere).
The catalog names a program's table with `function_table`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NO_ARG", "ROLES", "TableFunction", "cookie"]

# Roles as the BPF programs number them (catalog/programs/cuda.bpf.c and
# memstacks.bpf.c ROLE_*).
ROLES = {
    "launch": 1,
    "copy": 2,
    "alloc": 3,  # the address written through argument 0, 0 returned on success
    "free": 4,
    "sync": 5,
    "malloc": 6,  # the address returned
    "calloc": 7,  # arguments 0 and 1: count and size
    "realloc": 8,  # argument 0: the block it replaces; 1: the new size
    "mmap": 9,  # anonymous mappings only (argument 3: flags)
}
NO_ARG = 0xFF
# The programs read arguments at x86-64 struct pt_regs offsets (cuda.bpf.c).
MACHINES = ("x86_64",)
MAX_TABLE = 64  # the index is one byte, and the maps hold 64 functions


@dataclass(frozen=True)
class TableFunction:
    name: str
    role: str  # a key of ROLES
    arg: int = NO_ARG  # byte count (copy, alloc) or device pointer (free)
    direction: str = ""  # copies: "htod", "dtoh", "dtod" or "any" (unified addressing)
    space: int = 0  # memstacks: the address space of what it allocates or frees

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: unknown role {self.role!r}")
        if self.arg != NO_ARG and not 0 <= self.arg < 6:
            raise ValueError(f"{self.name}: only register arguments (0-5) can be read")


def cookie(index: int, fn: TableFunction) -> int:
    """The bpf cookie of table entry index (see the module docstring)."""
    if not 0 <= index < MAX_TABLE:
        raise ValueError(f"table index {index} out of range")
    return index | ROLES[fn.role] << 8 | fn.arg << 16 | fn.space << 24
