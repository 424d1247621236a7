"""Object bytes the broker may load: catalog files read and hashed once, and the
static audit's verdict per sha256, kept for the broker's lifetime."""

from __future__ import annotations

import threading

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import ObjectError
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.review import checks
from gfxbpf.catalog.entries import Program
from gfxbpf.catalog.objects import ObjectChanged, ObjectUnreadable, read_object
from gfxbpf.proto import gfxbpf_pb2 as pb


class Objects:
    """Thread-safe caches; a catalog file is checked against its sha256 on first read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, bytes] = {}  # catalog name -> bytes
        self._audits: dict[str, checks.AuditReport] = {}  # sha256 -> verdict

    def catalog_bytes(self, entry: Program) -> bytes:
        with self._lock:
            data = self._bytes.get(entry.name)
        if data is not None:
            return data
        try:
            data = read_object(entry)
        except ObjectUnreadable as e:
            raise BrokerError(pb.ERROR_UNAVAILABLE, str(e)) from None
        except ObjectChanged as e:
            raise BrokerError(pb.ERROR_HASH_MISMATCH, str(e)) from None
        with self._lock:
            self._bytes.setdefault(entry.name, data)
        return data

    def audit(self, data: bytes, sha: str, name: str) -> checks.AuditReport:
        """The static audit's verdict on these bytes; BrokerError AUDIT_FAILED if refused."""
        with self._lock:
            report = self._audits.get(sha)
        if report is None:
            try:
                spec = ObjectSpec.parse(data, name)
            except ObjectError as e:
                raise BrokerError(
                    pb.ERROR_INVALID_ARGUMENT, f"object (sha256 {sha}) cannot be used: {e}"
                ) from None
            report = checks.audit_spec(spec, ncpus=bpfsys.possible_cpus())
            with self._lock:
                self._audits[sha] = report
        if not report.ok:
            raise BrokerError(
                pb.ERROR_AUDIT_FAILED,
                f"the broker's static audit refused object {name!r} (sha256 {sha}): "
                + "; ".join(report.problems),
            )
        return report
