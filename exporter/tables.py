"""What the exporter needs to know of programs whose functions come from a table (cuda).

Their map keys hold a function's index in the table. The metrics name it as
gfxclient does, by the client's own reading of the table
(gfxbpf.client.cli.cuda_view), and add the function's role and copy direction,
so a dashboard can select launches or sum copies by direction. Their
library is found as `gfxclient watch cuda` finds it: in the target's
/proc/PID/maps, which only the process's own user can read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gfxbpf.catalog.function_tables import MAX_TABLE, TableFunction
from gfxbpf.client import libcuda
from gfxbpf.exporter import mapping
from gfxbpf.exporter.config import ProgramConfig

ATTRIBUTES = ("role", "direction")  # the labels a table adds after "function"


def table_functions(lookup: Callable[[Any], TableFunction | None]) -> mapping.Functions:
    """A table's functions as labels, index by index, as lookup names them."""
    found: list[TableFunction] = []
    for index in range(MAX_TABLE):
        fn = lookup(index)
        if fn is None:
            break
        found.append(fn)
    return mapping.Functions(
        names=tuple(f.name for f in found),
        attributes=ATTRIBUTES,
        values=tuple((f.role, f.direction) for f in found),
    )


CUDA = table_functions(libcuda.function_of)


def functions_for(program: ProgramConfig) -> mapping.Functions:
    """How this program's function indexes read: its table's, or ucalls' configured list."""
    if program.name == libcuda.PROGRAM:
        return CUDA
    return mapping.Functions(names=program.functions)


def library_for(program: ProgramConfig) -> str | None:
    """The library to attach: the configured one, or (cuda) the target's libcuda.

    Raises libcuda.NoLibcudaYet while the process has not loaded it (worth
    asking again later), UsageError when it never will (no such process, or
    not the exporter's user's).
    """
    if program.library is not None or program.name != libcuda.PROGRAM or program.pid is None:
        return program.library
    return libcuda.find_libcuda(program.pid)
