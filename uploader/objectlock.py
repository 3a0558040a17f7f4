"""Object Lock and object tags for checkpoints: what protects a pinned checkpoint in S3 and
what tells the bucket's lifecycle rules which objects they may act on.

Pin locks (config `retention.pin_lock`):
  "legal-hold"  (default) a legal hold on each object version; `unpin` lifts it.
  "governance"  a GOVERNANCE retention period of `pin_lock_days` (privileged users may lift it).
  "compliance"  a COMPLIANCE retention period of `pin_lock_days` (nobody can shorten it).
  "off"         no S3 protection; the pin only protects the cache and our own rules.
Object Lock works only in a bucket created with it enabled (S3 refuses the calls otherwise);
a lock protects a *version*: a plain DELETE still adds a delete marker, but no version that
holds the pinned bytes can be deleted until the hold is lifted or the period ends.

Tags: every object of a checkpoint carries `ckptgw-series=<name>` and `ckptgw-class=<class>`,
class one of:
  pinned     pinned: nothing may touch it
  protected  the newest complete checkpoint, or an incomplete one: nothing may touch it
  kept       kept by keep_last / keep_every: storage-class transitions only, never expiry
  expirable  may be transitioned and expired by age
The bucket lifecycle rules written by `ckptgw lifecycle sync` filter on these tags, so an
untagged object (just uploaded, not yet classified) matches no rule of ours: safe by default.
"""
from __future__ import annotations

import re
import time

PIN_LOCK_MODES = ("legal-hold", "governance", "compliance", "off")
TAG_CLASS = "ckptgw-class"
TAG_SERIES = "ckptgw-series"
CLASSES = ("pinned", "protected", "kept", "expirable")
SERIES_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def tags_for(series: str, klass: str) -> dict[str, str]:
    if klass not in CLASSES:
        raise ValueError(f"unknown checkpoint class {klass!r}")
    return {TAG_SERIES: series, TAG_CLASS: klass}


def lock_object(client, key: str, mode: str, days: int, now: float | None = None) -> str:
    """Protect one object as `mode` says; returns what was done (for the audit log)."""
    if mode == "legal-hold":
        client.set_legal_hold(key, True)
        return "legal hold on"
    if mode in ("governance", "compliance"):
        until = (now if now is not None else time.time()) + days * 86400
        current = client.get_retention(key)
        if current is not None and current[1] >= until:
            return f"retention already {current[0]} until {int(current[1])}"
        client.set_retention(key, mode.upper(), until)
        return f"retention {mode.upper()} until {int(until)}"
    return "no lock (pin_lock = off)"


def unlock_object(client, key: str, mode: str) -> str:
    """Lift what unpin may lift: a legal hold. A retention period stays until it ends."""
    if mode == "legal-hold":
        client.set_legal_hold(key, False)
        return "legal hold off"
    return "retention period left to run out" if mode in ("governance", "compliance") else "nothing to lift"
