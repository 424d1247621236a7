"""gc_paused(): no cyclic garbage collection while many small acyclic objects
are made (a BTF blob's types, a map's decoded rows): the collector would rescan
the young ones over and over and find nothing to free."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside, back to its former state after (nests)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
