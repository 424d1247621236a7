"""A stand-in for gfxbpf.client.events.EventStream in offline tests: it hands
out the records it was given, once."""

from __future__ import annotations


class Records:
    def __init__(self, records: list[bytes]) -> None:
        self.records = records

    def poll_raw(self, timeout: float | None = None) -> list[bytes]:
        out, self.records = self.records, []
        return out

    def flush(self) -> None:
        """Nothing is behind: every record is handed out at the next poll."""
