"""What the broker's two listeners (the Unix control socket, the gRPC socket)
share against a connect flood (issue 35 item 1).

A listen backlog is one kernel queue for every user. One user's 256 threads
doing connect + close filled the gRPC socket's, and another user's
non-blocking connect (grpc's) failed EAGAIN 191 times of 200. The kernel
serves *blocked* connects one per freed slot, in order, so gfxbpf's clients
connect blocking (client/grpc_queued.py for gRPC) and wait their turn behind
at most the flooder's threads and the backlog. The broker's side:

- both accept loops take what is waiting in batches (ACCEPT_BATCH per
  wakeup) and decide each connection at once: one whose peer already hung
  up is closed without any work (hung_up), one over its user's cap is
  refused; so the queue moves as fast as the broker can accept;
- the backlog stays short (LISTEN_BACKLOG, 128): under a flood faster than
  the broker accepts it is always full, and a waiting connect waits behind
  all of it. Measured on a 2-CPU VM under 4 x 64 threads of connect + close:
  a gRPC attach and first read took 1.5-2 s with 4096, 0.27-0.31 s with 128
  (0.21 s idle).

What stays: a client that connects non-blocking (plain grpc, grpcurl) can
still fail EAGAIN while another user floods the socket.
"""

from __future__ import annotations

import socket

LISTEN_BACKLOG = 128
ACCEPT_BATCH = 64  # connections accepted per wakeup before other work gets a turn


def hung_up(conn: socket.socket) -> bool:
    """Whether conn's peer closed it before anything was read (nothing to serve)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # open, nothing sent yet
    except OSError:
        return True  # reset
