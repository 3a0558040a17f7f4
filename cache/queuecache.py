"""Decoded queue jobs, kept between listings: the uploader lists the queue on every scheduling
pass (hundreds of passes a second under small-file saves), and decoding every job's JSON each
time was about a tenth of the event loop's time. A job is decoded again only when its stored
bytes differ from the bytes it was decoded from, so nothing stale is ever returned; callers get
a copy of their own (they add keys and update jobs), and a job holding a list or an object is
not kept at all, so no caller can change what another will be handed.
"""
from __future__ import annotations

import json


class DecodedJobs:
    def __init__(self):
        self._known: dict[int, tuple[bytes, dict]] = {}   # job id -> (stored bytes, job)

    def lister(self) -> "_Listing":
        return _Listing(self)


class _Listing:
    """One pass over (part of) the queue. What it kept replaces the cache when it ends, so the
    cache holds at most what one listing saw, and jobs gone since are forgotten."""

    def __init__(self, cache: DecodedJobs):
        self._cache = cache
        self._seen: dict[int, tuple[bytes, dict]] = {}

    def job(self, job_id: int, stored) -> dict:
        raw = bytes(stored)
        hit = self._cache._known.get(job_id)
        if hit is not None and hit[0] == raw:
            self._seen[job_id] = hit
            return dict(hit[1])
        job = json.loads(raw)
        if all(not isinstance(v, (list, dict)) for v in job.values()):
            self._seen[job_id] = (raw, job)
            return dict(job)
        return job

    def end(self) -> None:
        # one assignment: a listing on another thread reads either the old or the new dict
        self._cache._known = self._seen
