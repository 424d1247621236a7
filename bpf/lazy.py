"""Names a module re-exports on first use (PEP 562's module __getattr__), so
importing it stays cheap: the one loader bpf/btf/facade.py and
client/profiles/__init__.py both use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module __getattr__ for namespace (the module's globals()): name is
    imported from package.homes[name] when first asked for, then kept."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
