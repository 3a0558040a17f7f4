"""Counters the uploader keeps for status() and the appliance's Prometheus metrics."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    requests: Counter = field(default_factory=Counter)       # by operation, successful
    failures: Counter = field(default_factory=Counter)       # by error code
    bytes_sent: int = 0          # payload bytes of every attempt (retries included)
    bytes_uploaded: int = 0      # payload bytes of successful PUT / UploadPart
    bytes_copied: int = 0        # bytes moved server-side (CopyObject / UploadPartCopy)
    bytes_fetched: int = 0       # read-through GET bytes
    retries: int = 0
    throttles: int = 0
    uploads_done: int = 0
    uploads_copied: int = 0      # of those, by a server-side copy of a COPY/CLONE source's object
    moves_done: int = 0
    deletes_done: int = 0
    uploads_aborted: int = 0
    parts_resumed: int = 0       # parts found intact after a restart, not sent again
    orphans_aborted: int = 0
    evicted_bytes: int = 0
    imported: int = 0
    permanent_errors: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if not isinstance(v, Counter)}
        d["requests"] = dict(self.requests)
        d["requests_total"] = sum(self.requests.values())
        d["failures"] = dict(self.failures)
        return d
