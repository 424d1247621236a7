"""`-- COMMAND`: forked, and held before exec until the broker has attached."""

from __future__ import annotations

import contextlib
import os

from gfxbpf.client.errors import UsageError

# The held child's command name until exec gives it COMMAND's: what it runs
# before (gfxclient's own Python, forked) is the profiler, not the profile,
# and its samples are told apart by this name.
HELD_COMM = "gfxclient:held"


class Child:
    """COMMAND forked and held before exec until the broker has attached."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become COMMAND
            os.close(go_w)
            os.close(err_r)
            try:
                with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
                    f.write(HELD_COMM)
                if os.read(go_r, 1) == b"g":  # EOF: the parent gave up (attach failed)
                    os.execvp(argv[0], argv)
                os._exit(127)
            except BaseException as e:  # noqa: BLE001 - reported by the parent
                with contextlib.suppress(OSError):
                    os.write(err_w, str(getattr(e, "strerror", None) or e).encode()[:500])
            os._exit(127)
        os.close(go_r)
        os.close(err_w)
        self.pid = pid
        self._go = go_w
        self._err = err_r
        self.status: int | None = None

    def release(self) -> None:
        """Let it exec; returns once it has (or raises UsageError if it could not)."""
        os.write(self._go, b"g")
        os.close(self._go)
        self._go = -1
        chunks = []
        while chunk := os.read(self._err, 512):  # EOF: exec closed the CLOEXEC end
            chunks.append(chunk)
        os.close(self._err)
        self._err = -1
        if chunks:
            self.wait()
            why = b"".join(chunks).decode(errors="replace")
            raise UsageError(f"cannot run {self.argv[0]!r}: {why}")

    def poll(self) -> bool:
        """True once it has exited (reaped)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def wait(self) -> int:
        if self.status is None:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def abandon(self) -> None:
        """Attach failed: the child never runs COMMAND."""
        for fd in (self._go, self._err):
            if fd >= 0:
                os.close(fd)  # the child reads EOF and exits 127
        self._go = self._err = -1
        self.wait()
