"""The committed generated code in proto/ is what tools/gen_proto.py produces now."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "proto")


def _load_gen_proto():
    spec = importlib.util.spec_from_file_location(
        "gen_proto", os.path.join(ROOT, "tools", "gen_proto.py")
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _protoc_version(text: str) -> str | None:
    m = re.search(r"^# Protobuf Python Version: (\S+)$", text, re.MULTILINE)
    return m.group(1) if m else None


def test_generated_code_matches_proto(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed")
    gen = _load_gen_proto()
    written = gen.generate(str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == sorted(gen.GENERATED)
    for path in written:
        name = os.path.basename(path)
        committed_path = os.path.join(PROTO_DIR, name)
        assert os.path.exists(committed_path), f"proto/{name} missing: run tools/gen_proto.py"
        with open(path, encoding="utf-8") as f:
            fresh = f.read()
        with open(committed_path, encoding="utf-8") as f:
            committed = f.read()
        if fresh != committed:
            hint = "run `python3 tools/gen_proto.py` and commit the result"
            a, b = _protoc_version(committed), _protoc_version(fresh)
            if a != b:
                hint += f" (committed with protoc for protobuf {a}, this grpcio-tools gives {b})"
            pytest.fail(f"proto/{name} is stale relative to proto/gfxbpf.proto: {hint}")


def test_grpc_module_imports_package_relative():
    with open(os.path.join(PROTO_DIR, "gfxbpf_pb2_grpc.py"), encoding="utf-8") as f:
        text = f.read()
    assert "from . import gfxbpf_pb2 as gfxbpf__pb2" in text
    assert not re.search(r"^import gfxbpf_pb2", text, re.MULTILINE)
    from gfxbpf.proto import gfxbpf_pb2_grpc

    assert hasattr(gfxbpf_pb2_grpc, "BrokerStub")
    assert hasattr(gfxbpf_pb2_grpc, "add_BrokerServicer_to_server")


def test_service_shape():
    from gfxbpf.proto import gfxbpf_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Broker"]
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {
        "Hello",
        "ListPrograms",
        "Attach",
        "Detach",
        "ReadMap",
        "StreamEvents",
        "Stats",
    }
    assert methods["StreamEvents"].server_streaming
    assert not any(m.server_streaming for n, m in methods.items() if n != "StreamEvents")
    assert pb.DESCRIPTOR.package == "gfxbpf.v1"
    request_ops = {f.name for f in pb.Request.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert request_ops == {
        "hello",
        "list_programs",
        "attach",
        "detach",
        "read_map",
        "stream_events",
        "stats",
        "issue_token",
    }
    response_ops = {f.name for f in pb.Response.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert response_ops == (request_ops - {"stream_events"}) | {"events", "error"}


def test_pprof_stubs_are_generated_and_message_only():
    gen = _load_gen_proto()
    assert {"pprof_pb2.py", "pprof_pb2.pyi"} <= set(gen.GENERATED)
    assert not os.path.exists(os.path.join(PROTO_DIR, "pprof_pb2_grpc.py")), "no service"
    from gfxbpf.proto import pprof_pb2

    assert pprof_pb2.DESCRIPTOR.package == "perftools.profiles"
    assert not pprof_pb2.DESCRIPTOR.services_by_name
