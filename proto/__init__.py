"""gfxbpf.proto: the broker protocol (messages, gRPC service) and the Unix-socket framing."""
