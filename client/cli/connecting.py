"""A gfxclient command's broker session: connecting with the global flags,
attaching with the attach flags, and sleeping while gRPC leases are renewed.
"""

from __future__ import annotations

import argparse
import time

from gfxbpf.client.broker import Broker
from gfxbpf.client.cli.arguments import function_names
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import BrokerError, UsageError
from gfxbpf.client.grpc_config import TlsFiles
from gfxbpf.client.handle import Attachment
from gfxbpf.proto import gfxbpf_pb2 as pb

# `watch cuda`'s view (with the CUDA function table) is imported only for
# that program (issue #15); test_cuda_table checks the name against it.
CUDA_PROGRAM = "cuda"


def connect(args: argparse.Namespace) -> Broker:
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = TlsFiles(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    return Broker.connect(socket=args.socket, grpc=args.grpc, via=args.via, tls=tls)


def attach(broker: Broker, args: argparse.Namespace) -> Attachment:
    if args.name == CUDA_PROGRAM and not args.library:
        if not args.pid:
            raise UsageError("cuda needs --pid PID: a process of yours that uses CUDA")
        from gfxbpf.client import libcuda  # only for watch cuda: start-up stays light

        args.library = libcuda.find_libcuda_in_tree(args.pid, not args.no_children)
    try:
        return broker.attach(
            args.name,
            scope=args.scope or ("job" if args.job else None),
            job=args.job or "",
            pid=args.pid,
            library=args.library,
            functions=function_names(args),
            children=bool(args.pid) and not args.no_children,
        )
    except BrokerError as e:
        if e.code != pb.ERROR_INVALID_ARGUMENT:
            raise
        # The broker names AttachParams fields; say which flags carry them.
        hint = (
            f"`gfxclient info {args.name}` lists its parameters; they are the flags "
            "--pid PID, --library PATH and --function NAME (--no-children: a program "
            "that follows no child processes)"
        )
        raise BrokerError(e.code, f"{e.message}\n  {hint}", e.rule, operation=e.operation) from None


# gRPC attachments live on a lease (policy default 300 s) that any call naming
# them renews; a long sleep renews it on the way.
RENEW_EVERY = 60.0


def sleep_renewing(stop: StopSignal, seconds: float, broker: Broker) -> bool:
    """Sleep (True early on a stop signal), renewing gRPC leases meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return stop.stopped
        if broker.via != "grpc" or left <= RENEW_EVERY:
            return stop.wait(left)
        if stop.wait(RENEW_EVERY):
            return True
        for att in broker.attachments:
            att.renew()
