"""The bucket's lifecycle configuration: what S3 can enforce of our rules by itself.

S3 ages objects from their upload and filters by key prefix and tags; it cannot count
checkpoints (keep_last) or see pins. So per series we write, with the series pattern's
literal prefix (under the bucket prefix) and the tags uploader.objectlock puts on objects:
  ckptgw-<series>-expirable  tags series + class=expirable: the transitions, and expiry
                             after expire_after (rounded up to whole days)
  ckptgw-<series>-kept       tags series + class=kept: the transitions only
  ckptgw-abort-multipart     the bucket prefix: abort incomplete multipart uploads after
                             abort_incomplete_multipart_days (always present)
Objects of pinned, incomplete and newest checkpoints are tagged pinned / protected, and
untagged objects (not yet classified) match nothing: no S3 rule can expire them.

Only rules whose ID starts with "ckptgw-" are ours: others are kept exactly as they are,
in their place. `plan` shows the difference against the bucket; `sync` writes it and reads
it back.
"""
from __future__ import annotations

import asyncio
import json
import math

import structlog

from .objectlock import TAG_CLASS, TAG_SERIES
from .series import parse_pattern

log = structlog.get_logger(__name__)

OUR_PREFIX = "ckptgw-"
ABORT_RULE_ID = "ckptgw-abort-multipart"
DEFAULT_ABORT_DAYS = 7


class LifecycleError(Exception):
    pass


def _days(seconds: float) -> int:
    return max(1, math.ceil(seconds / 86400))


def _filter(prefix: str, series: str, klass: str) -> dict:
    return {"And": {"Prefix": prefix, "Tags": [{"Key": TAG_SERIES, "Value": series},
                                               {"Key": TAG_CLASS, "Value": klass}]}}


def desired_rules(rules, *, bucket_prefix: str = "", abort_days: int = DEFAULT_ABORT_DAYS) -> list[dict]:
    out = []
    for rule in rules:
        prefix = bucket_prefix + parse_pattern(rule.pattern).literal_prefix
        transitions = [{"Days": _days(t.after), "StorageClass": t.storage_class}
                       for t in sorted(rule.transitions, key=lambda t: t.after)]
        if transitions or rule.expire_after is not None:
            r = {"ID": f"{OUR_PREFIX}{rule.name}-expirable", "Status": "Enabled",
                 "Filter": _filter(prefix, rule.name, "expirable")}
            if transitions:
                r["Transitions"] = transitions
            if rule.expire_after is not None:
                r["Expiration"] = {"Days": _days(rule.expire_after)}
            out.append(r)
        if transitions:
            out.append({"ID": f"{OUR_PREFIX}{rule.name}-kept", "Status": "Enabled",
                        "Filter": _filter(prefix, rule.name, "kept"), "Transitions": transitions})
    out.append({"ID": ABORT_RULE_ID, "Status": "Enabled", "Filter": {"Prefix": bucket_prefix},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": int(abort_days)}})
    return out


def _normal(rule: dict) -> dict:
    """A rule as compared: empty fields dropped, tags sorted, a bare Prefix filter unified."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x not in (None, [], {}, "") or k == "Prefix"}
        if isinstance(v, list):
            items = [clean(x) for x in v]
            return sorted(items, key=lambda x: json.dumps(x, sort_keys=True, default=str))
        return v
    r = clean({k: v for k, v in rule.items() if k != "ID"})
    if "Prefix" in r and "Filter" not in r:          # the legacy top-level Prefix form
        r["Filter"] = {"Prefix": r.pop("Prefix")}
    return r


def diff(current: list[dict], desired: list[dict]) -> dict:
    ours = {r.get("ID"): r for r in current if str(r.get("ID", "")).startswith(OUR_PREFIX)}
    foreign = [r for r in current if not str(r.get("ID", "")).startswith(OUR_PREFIX)]
    want = {r["ID"]: r for r in desired}
    added = [want[i] for i in want if i not in ours]
    removed = [ours[i] for i in ours if i not in want]
    changed = [{"id": i, "from": ours[i], "to": want[i]} for i in want
               if i in ours and _normal(ours[i]) != _normal(want[i])]
    unchanged = [i for i in want if i in ours and _normal(ours[i]) == _normal(want[i])]
    return {"add": added, "remove": removed, "change": changed, "unchanged": unchanged,
            "foreign": [r.get("ID") for r in foreign], "in_sync": not (added or removed or changed)}


def _settings_of(settings):
    return (getattr(settings, "abort_incomplete_multipart_days", DEFAULT_ABORT_DAYS)
            if settings is not None else DEFAULT_ABORT_DAYS)


def _plan_sync(client, rules, prefix, settings) -> tuple[list, list, dict]:
    if client is None:
        raise LifecycleError("no S3 client in this daemon")
    current = client.get_lifecycle_rules()
    desired = desired_rules(rules, bucket_prefix=prefix, abort_days=_settings_of(settings))
    return current, desired, diff(current, desired)


def _actions(d: dict) -> list[dict]:
    out = [{"action": "add", "rule": r["ID"], "detail": json.dumps(_normal(r), sort_keys=True)} for r in d["add"]]
    out += [{"action": "change", "rule": c["id"],
             "detail": f"{json.dumps(_normal(c['from']), sort_keys=True, default=str)} -> "
                       f"{json.dumps(_normal(c['to']), sort_keys=True)}"} for c in d["change"]]
    out += [{"action": "remove", "rule": r.get("ID"), "detail": "no series defines it any more"}
            for r in d["remove"]]
    return out


async def plan(*, object_client=None, rules=(), prefix: str = "", settings=None, **_) -> dict:
    """`ckptgw lifecycle plan`: the difference between the bucket and our rules."""
    _, desired, d = await asyncio.to_thread(_plan_sync, object_client, tuple(rules), prefix, settings)
    return {"actions": _actions(d), "in_sync": d["in_sync"], "unchanged": d["unchanged"],
            "foreign_rules_kept": d["foreign"], "desired": desired}


def _sync(client, rules, prefix, settings) -> dict:
    current, desired, d = _plan_sync(client, rules, prefix, settings)
    if not d["in_sync"]:
        foreign = [r for r in current if not str(r.get("ID", "")).startswith(OUR_PREFIX)]
        client.put_lifecycle_rules(foreign + desired)
        log.info("lifecycle_synced", added=[r["ID"] for r in d["add"]], changed=[c["id"] for c in d["change"]],
                 removed=[r.get("ID") for r in d["remove"]], foreign=d["foreign"])
    after = diff(client.get_lifecycle_rules(), desired)
    if not after["in_sync"]:
        raise LifecycleError(f"the bucket's lifecycle configuration does not read back as written: {after}")
    return {"actions": _actions(d), "written": not d["in_sync"], "in_sync": True,
            "foreign_rules_kept": d["foreign"]}


async def sync(*, object_client=None, rules=(), prefix: str = "", settings=None, **_) -> dict:
    """`ckptgw lifecycle sync`: write our rules, keep every foreign one, read back."""
    return await asyncio.to_thread(_sync, object_client, tuple(rules), prefix, settings)
