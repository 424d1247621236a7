#!/usr/bin/env python3
"""Regenerate the Python code for proto/gfxbpf.proto.

    python3 tools/gen_proto.py            # rewrite proto/gfxbpf_pb2*.py(i), proto/pprof_pb2.py(i)
    python3 tools/gen_proto.py --out DIR  # write into DIR instead (drift test)

proto/pprof.proto (the profile format the client writes) gets message code
only: it has no service.

Needs grpcio-tools (`pip install grpcio-tools`). The committed files must be
what this script produces; tests/unit/test_proto_drift.py checks that.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

PROTO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "proto")
PROTO_FILE = "gfxbpf.proto"
PPROF_FILE = "pprof.proto"
GENERATED = (
    "gfxbpf_pb2.py",
    "gfxbpf_pb2.pyi",
    "gfxbpf_pb2_grpc.py",
    "pprof_pb2.py",
    "pprof_pb2.pyi",
)

# protoc writes `import gfxbpf_pb2 as gfxbpf__pb2`, which only works with
# proto/ on sys.path; the package is imported as gfxbpf.proto.
_ABS_IMPORT = re.compile(r"^import gfxbpf_pb2 as gfxbpf__pb2$", re.MULTILINE)
_REL_IMPORT = "from . import gfxbpf_pb2 as gfxbpf__pb2"


def generate(out_dir: str, proto_dir: str = PROTO_DIR) -> list[str]:
    """Run protoc on proto_dir/gfxbpf.proto into out_dir; return the written paths."""
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise SystemExit(
            "grpc_tools is missing: install grpcio-tools (pip install grpcio-tools)"
        ) from e
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    common = ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{include}"]
    common += [f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
    for args, name in (
        ([*common, f"--grpc_python_out={out_dir}", PROTO_FILE], PROTO_FILE),
        ([*common, PPROF_FILE], PPROF_FILE),
    ):
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed with status {rc} on {proto_dir}/{name}")
    grpc_path = os.path.join(out_dir, "gfxbpf_pb2_grpc.py")
    with open(grpc_path, encoding="utf-8") as f:
        text = f.read()
    fixed, n = _ABS_IMPORT.subn(_REL_IMPORT, text)
    if n != 1:
        raise SystemExit(f"{grpc_path}: expected one 'import gfxbpf_pb2' line to fix, found {n}")
    with open(grpc_path, "w", encoding="utf-8") as f:
        f.write(fixed)
    return [os.path.join(out_dir, name) for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=PROTO_DIR, help="output directory (default: proto/)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    # Generate into a scratch dir first so a failure never leaves half-written files.
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(tmp):
            name = os.path.basename(path)
            with open(path, "rb") as src:
                data = src.read()
            with open(os.path.join(args.out, name), "wb") as dst:
                dst.write(data)
            print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
