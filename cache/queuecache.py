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

    def decode(self, stored: list[tuple[int, bytes]]) -> list[tuple[int, dict]]:
        """The jobs of one listing, from (job id, stored bytes) pairs copied out of its read
        txn. What this listing kept replaces what was kept before, so the cache holds at most
        what one listing saw, and jobs gone since are forgotten."""
        known = self._known
        kept: dict[int, tuple[bytes, dict]] = {}
        out = []
        for job_id, raw in stored:
            hit = known.get(job_id)
            if hit is not None and hit[0] == raw:
                kept[job_id] = hit
                out.append((job_id, dict(hit[1])))
                continue
            job = json.loads(raw)
            if all(not isinstance(v, (list, dict)) for v in job.values()):
                kept[job_id] = (raw, job)
                job = dict(job)
            out.append((job_id, job))
        # one assignment: a listing on another thread reads either the old or the new dict
        self._known = kept
        return out
