"""Where gfxclient finds the broker unless told otherwise: its Unix socket and
its gRPC listener. Apart from connection.py and grpc_config.py so that
gfxclient's start (its --help) imports neither protobuf nor grpc.
"""

DEFAULT_SOCKET = "/run/gfxbpf/control.sock"
DEFAULT_GRPC = "unix:/run/gfxbpf/grpc.sock"
