"""gfxbpf.proto: the broker protocol (messages, gRPC service) and the Unix-socket framing.

Importing a generated *_pb2 module runs protobuf's descriptor_pool and
internal/builder, which import internal/python_message at module level, and
with it text_format, decoder, containers and encoder (about a third of the
client's protobuf import time, issue 37). With the upb backend (the C one
the protobuf wheels ship) nothing on our path reads that module: it is the
pure-Python backend's message class. So here it becomes a lazy module
(importlib.util.LazyLoader): it loads on its first attribute access, if any
code ever makes one, and is never run otherwise.
"""

from __future__ import annotations

import importlib.util
import sys

_PURE_PYTHON_MESSAGES = "google.protobuf.internal.python_message"


def _defer_pure_python_messages() -> None:
    if _PURE_PYTHON_MESSAGES in sys.modules:
        return
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":  # the python backend needs it at once
        return
    spec = importlib.util.find_spec(_PURE_PYTHON_MESSAGES)
    if spec is None or spec.loader is None:
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PURE_PYTHON_MESSAGES] = module
    spec.loader.exec_module(module)
    # `from google.protobuf.internal import python_message` then finds it on the
    # package and touches nothing of it (the import machinery's own look-up of
    # the module's __spec__ would load it).
    import google.protobuf.internal as internal

    internal.python_message = module  # type: ignore[attr-defined]


_defer_pure_python_messages()
