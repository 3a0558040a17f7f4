"""Checkpoint retention: rules -> a plan of actions -> carried out through the durable queue.

    plan(store=..., rules=cfg.retention.series, object_client=..., now=time.time())
    await apply(store=..., rules=..., object_client=..., now=..., uploader=up)

Per series (uploader.series finds the checkpoints), each checkpoint gets one verdict:
  - never touched, whatever the rules say (SAFETY): pinned ones, incomplete ones (a file
    not yet clean in S3, a file open, a temporary entry inside, or no file at all), and the
    newest complete checkpoint of the series;
  - untouched while younger than `min_age`;
  - kept by `keep_last` (the N newest complete) or `keep_every` (step % N == 0);
  - deleted once older than `expire_after` if nothing above keeps it;
  - moved to the storage class of the last `transitions` entry its age has passed (kept
    ones too; never the SAFETY ones).
Temporary entries (*.tmp, .tmp*) inside checkpoints or beside them older than
`stale_tmp_after` are deleted unless open or pinned.

Apply: a delete removes the checkpoint from the namespace at once (the store journals one
unlink/rmdir job per entry in the same transaction, which the uploader turns into
DeleteObject as its queue drains, through S3 outages and restarts). Before it starts, the
intent is written (fsync) to the audit log, so a crash in the middle is finished by the
next apply or daemon start (`resume`). Transitions, tags and locks become per-file jobs of
kind "retention" in the same durable queue, run by the uploader (its gate: rate limits,
retries) via `install_job_handlers`. Every action is in the audit log (`log_entries`) and
in the structured log.
"""
from __future__ import annotations

import asyncio
import datetime
import errno
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field

import structlog

from cache.api import ROOT_INO, DataState, FileType, StoreError

from .jobs import KeyRef
from .objectclient import ObjectClientError, PermanentError
from .objectlock import PIN_LOCK_MODES, lock_object, tags_for, unlock_object
from .series import Checkpoint, TmpEntry, discover, parse_pattern

log = structlog.get_logger(__name__)

JOB_KIND = "retention"
DELETE, DELETE_TMP, TRANSITION, TAG, LOCK, UNLOCK = ("delete", "delete-tmp", "transition", "tag", "lock",
                                                    "unlock")
STORAGE_ORDER = ("STANDARD", "INTELLIGENT_TIERING", "STANDARD_IA", "ONEZONE_IA", "GLACIER_IR", "GLACIER",
                 "DEEP_ARCHIVE")
_CLEAN = (DataState.CLEAN, DataState.ABSENT)


class RetentionError(Exception):
    """A retention command cannot run (the message says why)."""


def fmt_age(seconds: float | None) -> str:
    """Ages and rule durations in plans, in the CLI's one duration style (appliance.units.fmt_seconds:
    1h, 1h05m, 30d, 3d04h; the tests hold the two together; the uploader does not import the
    appliance layer)."""
    if seconds is None:
        return "never"
    s = int(max(0.0, seconds))
    for big, n, small, m in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= n:
            rest = s % n // m
            return f"{s // n}{big}" + (f"{rest:02d}{small}" if rest else "")
    return f"{s}s"


# ---- durable records beside the store: audit log and per-object state ----------------------
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(path: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(path, threading.Lock())


# The audit log is rotated at the start of an apply once it reaches this size (every intent
# is closed then), keeping this many older generations (audit.jsonl.1 newest).
AUDIT_ROTATE_BYTES = 8 << 20
AUDIT_GENERATIONS = 4


class Records:
    """<store>/retention/audit.jsonl: one JSON object per line, appended and fsynced (a torn
    last line after a crash is skipped), rotated to audit.jsonl.1 .. .N by size.
    <store>/retention/objects.json: what we last did to each object (tag class, storage
    class, lock), keyed by object key, valid for its etag."""

    def __init__(self, store):
        self.dir = os.path.join(store.path, "retention")
        os.makedirs(self.dir, exist_ok=True)
        self.audit_path = os.path.join(self.dir, "audit.jsonl")
        self.objects_path = os.path.join(self.dir, "objects.json")
        self.lock = _lock_for(self.dir)

    def audit(self, **entry) -> dict:
        entry = {"t": round(time.time(), 3), **entry}
        line = json.dumps(entry, sort_keys=True, default=str) + "\n"
        with self.lock:
            fd = os.open(self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        log.info("retention_audit", **{k: v for k, v in entry.items() if k != "t"})
        return entry

    def entries(self, generation: int = 0) -> list[dict]:
        """The entries of the current log (generation 0) or of a rotated one, oldest first."""
        path = self.audit_path if generation == 0 else f"{self.audit_path}.{generation}"
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue                     # a line torn by a crash
        return out

    def newest_entries(self, limit: int) -> list[dict]:
        """The newest `limit` entries (0: all) across the rotated generations, oldest first."""
        out: list[dict] = []
        for generation in range(AUDIT_GENERATIONS + 1):
            out[:0] = self.entries(generation)
            if 0 < limit <= len(out):
                return out[-limit:]
        return out

    def rotate_if_large(self, limit: int | None = None, keep: int | None = None) -> bool:
        """Move audit.jsonl to audit.jsonl.1 (older ones up by one, the oldest dropped) once it
        holds `limit` bytes. Only call it when no intent is open: resume() reads the current log."""
        limit = AUDIT_ROTATE_BYTES if limit is None else limit
        keep = AUDIT_GENERATIONS if keep is None else keep
        with self.lock:
            try:
                if os.stat(self.audit_path).st_size < limit:
                    return False
            except FileNotFoundError:
                return False
            for generation in range(keep, 0, -1):
                src = self.audit_path if generation == 1 else f"{self.audit_path}.{generation - 1}"
                if os.path.exists(src):
                    os.replace(src, f"{self.audit_path}.{generation}")
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)                 # the renames survive a crash
            finally:
                os.close(fd)
        log.info("retention_audit_rotated", path=self.audit_path, kept=keep)
        return True

    def objects(self) -> dict:
        try:
            with open(self.objects_path, encoding="utf-8") as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return {}

    def update_object(self, key: str, etag: str | None, *, was: str | None = None, **fields) -> None:
        """Record `fields` for the object `key` holding `etag`; what was recorded for another
        etag is dropped, unless it was `was` (a copy onto itself that kept tags and data)."""
        with self.lock:
            data = self.objects()
            rec = data.get(key) or {}
            if rec.get("etag") not in (etag, was):
                rec = {}
            rec["etag"] = etag
            rec.update(fields)
            data[key] = rec
            tmp = self.objects_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.objects_path)

    def forget_under(self, rel_prefix: str) -> None:
        """Drop the records of objects under a deleted checkpoint (prefix-relative keys)."""
        with self.lock:
            data = self.objects()
            keep = {k: v for k, v in data.items() if not (k == rel_prefix or k.startswith(rel_prefix + "/"))}
            if len(keep) == len(data):
                return
            tmp = self.objects_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(keep, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.objects_path)


# ---- settings ------------------------------------------------------------------------------
@dataclass
class Options:
    pin_lock: str = "legal-hold"
    pin_lock_days: int = 0

    @classmethod
    def of(cls, settings) -> "Options":
        if settings is None:
            return cls()
        mode = getattr(settings, "pin_lock", "legal-hold")
        if mode not in PIN_LOCK_MODES:
            raise RetentionError(f"pin_lock {mode!r} is not one of {PIN_LOCK_MODES}")
        return cls(mode, int(getattr(settings, "pin_lock_days", 0) or 0))


# ---- planning --------------------------------------------------------------------------------
@dataclass
class Action:
    action: str
    series: str
    checkpoint: str
    step: int | None
    age: str
    rule: str
    reason: str
    storage_class: str | None = None
    files: int = 0
    bytes: int = 0
    id: str = ""
    ino: int = 0
    jobs: list = field(default_factory=list, repr=False)    # per-file job payloads (apply)

    def public(self) -> dict:
        d = asdict(self)
        d.pop("jobs")
        return d


@dataclass
class Verdict:
    series: str
    checkpoint: str
    step: int | None
    age: str
    complete: bool
    pinned: bool
    klass: str                 # tag class (uploader.objectlock.CLASSES)
    verdict: str               # keep | delete
    reasons: list


def _storage_rank(sc: str | None) -> int:
    return STORAGE_ORDER.index(sc) if sc in STORAGE_ORDER else 0


def _pending_jobs(store) -> set[tuple]:
    return {(j.get("op"), j.get("ino"), j.get("storage_class") or j.get("klass") or "")
            for _, j in store.queue_list(1 << 30) if j.get("kind") == JOB_KIND}


class _S3View:
    """What the plan needs to know of S3, asked lazily and at most once."""

    def __init__(self, client):
        self.client = client
        self._lock_enabled: bool | None = None
        self.note: str | None = None

    def lock_enabled(self) -> bool:
        if self._lock_enabled is None:
            if self.client is None:
                self._lock_enabled = False
            else:
                try:
                    self._lock_enabled = self.client.object_lock_enabled()
                except ObjectClientError as e:
                    self.note = f"Object Lock state unknown ({e.code}): no lock actions planned"
                    self._lock_enabled = False
        return self._lock_enabled


def _file_objects(store, cp: Checkpoint) -> list[tuple[str, int, str, str | None]]:
    """(path, ino, object key (prefix-relative), etag) of the checkpoint's uploaded files."""
    out = []
    for path, ino in cp.file_inos:
        try:
            remote = store.remote_info(ino)
        except StoreError:
            continue
        if remote.key and remote.etag:
            out.append((path, ino, remote.key, remote.etag))
    return out


def _judge(rule, cps: list[Checkpoint], now: float) -> list[tuple[Checkpoint, Verdict, str | None]]:
    """Verdict per checkpoint, and the storage class it should be in (None: leave it)."""
    complete = [c for c in cps if c.complete]
    newest = complete[-1] if complete else None
    keep_last = {id(c) for c in complete[-rule.keep_last:]} if rule.keep_last else set()
    out = []
    for cp in cps:
        age = cp.age_seconds(now)
        reasons, klass, verdict, target = [], "expirable", "keep", None
        if cp.pinned:
            klass = "pinned"
            top: dict[str, str] = {}            # one path per reason: the highest pinned one
            for p, r in sorted(cp.pins.items(), key=lambda kv: (len(kv[0]), kv[0])):
                top.setdefault(r, p)
            reasons.append("pinned: " + "; ".join(f"{p or '/'} ({r or 'no reason'})" for r, p in top.items()))
        elif not cp.complete:
            klass = "protected"
            reasons.append("incomplete: " + cp.incomplete_reason())
        elif cp is newest:
            klass = "protected"
            reasons.append("newest complete checkpoint")
        if klass == "expirable":
            if id(cp) in keep_last:
                klass = "kept"
                rank = len(complete) - complete.index(cp)
                reasons.append(f"keep_last={rule.keep_last} (#{rank} newest complete)")
            if rule.keep_every and cp.step is not None and cp.step % rule.keep_every == 0:
                klass = "kept"
                reasons.append(f"keep_every={rule.keep_every}")
            if age < rule.min_age:
                reasons.append(f"younger than min_age={fmt_age(rule.min_age)}")
            elif klass == "expirable" and rule.expire_after is not None and age > rule.expire_after:
                verdict = "delete"
                reasons.append(f"age {fmt_age(age)} > expire_after={fmt_age(rule.expire_after)}, "
                               "not kept by keep_last/keep_every")
            else:
                if klass == "expirable":
                    reasons.append("not expired" if rule.expire_after is None
                                   else f"age {fmt_age(age)} <= expire_after={fmt_age(rule.expire_after)}")
                passed = [t for t in rule.transitions if age >= t.after]
                if passed:
                    target = max(passed, key=lambda t: t.after).storage_class
        out.append((cp, Verdict(rule.name, cp.path, cp.step, fmt_age(age), cp.complete, cp.pinned, klass,
                                verdict, reasons), target))
    return out


def _tmp_actions(rule, scan_stale: list[TmpEntry], cps: list[Checkpoint], now: float) -> list[Action]:
    if rule.stale_tmp_after is None:
        return []
    entries = list(scan_stale)
    for cp in cps:
        if not cp.pinned:
            entries.extend(cp.tmp)
    out = []
    for t in entries:
        age = max(0.0, now - t.newest_mtime_ns / 1e9)
        if t.busy or age <= rule.stale_tmp_after:
            continue
        out.append(Action(DELETE_TMP, rule.name, t.path, None, fmt_age(age),
                          f"stale_tmp_after={fmt_age(rule.stale_tmp_after)}",
                          f"temporary {'directory' if t.is_dir else 'file'} untouched for {fmt_age(age)}",
                          id=f"{DELETE_TMP}:{t.path}:{t.ino}", ino=t.ino))
    return out


def build_plan(store, rules, object_client=None, now: float | None = None, settings=None) -> dict:
    """The plan as plain data: {"actions": [...], "checkpoints": [...], "notes": [...]}.
    Blocking (store walks, a few S3 calls): run it in a thread from asyncio code."""
    now = time.time() if now is None else now
    opts = Options.of(settings)
    records = Records(store)
    known = records.objects()
    pending = _pending_jobs(store)
    s3 = _S3View(object_client)
    actions: list[Action] = []
    verdicts: list[Verdict] = []
    notes: list[str] = []
    for rule in rules:
        scan = discover(store, rule.name, parse_pattern(rule.pattern))
        judged = _judge(rule, scan.checkpoints, now)
        for cp, v, target in judged:
            verdicts.append(v)
            rule_of = {"pinned": "pin", "protected": "safety"}.get(v.klass, "")
            if v.verdict == "delete":
                actions.append(Action(DELETE, rule.name, cp.path, cp.step, v.age,
                                      f"expire_after={fmt_age(rule.expire_after)}", v.reasons[-1],
                                      files=cp.files, bytes=cp.bytes, id=f"{DELETE}:{cp.path}:{cp.ino}",
                                      ino=cp.ino))
                continue
            objs = _file_objects(store, cp) if object_client is not None else []
            if target is not None and v.klass in ("kept", "expirable"):
                todo = [o for o in objs
                        if _storage_rank((known.get(o[2]) or {}).get("storage_class")
                                         if (known.get(o[2]) or {}).get("etag") == o[3] else None)
                        < _storage_rank(target)
                        and (TRANSITION, o[1], target) not in pending]
                if todo:
                    after = max((t for t in rule.transitions if t.storage_class == target), key=lambda t: t.after)
                    actions.append(Action(
                        TRANSITION, rule.name, cp.path, cp.step, v.age,
                        f"transitions after={fmt_age(after.after)}",
                        f"age {v.age} >= {fmt_age(after.after)} ({'; '.join(v.reasons)})", storage_class=target,
                        files=len(todo), bytes=sum(store.getattr(o[1]).size for o in todo),
                        id=f"{TRANSITION}:{cp.path}:{cp.ino}:{target}", ino=cp.ino,
                        jobs=[{"op": TRANSITION, "ino": ino, "path": p, "storage_class": target}
                              for p, ino, _, _ in todo]))
            if v.klass == "pinned" and opts.pin_lock != "off" and objs and s3.lock_enabled():
                todo = [o for o in objs if (known.get(o[2]) or {}).get("etag") != o[3]
                        or not (known.get(o[2]) or {}).get("lock")]
                todo = [o for o in todo if (LOCK, o[1], "") not in pending]
                if todo:
                    actions.append(Action(
                        LOCK, rule.name, cp.path, cp.step, v.age, f"pin_lock={opts.pin_lock}",
                        v.reasons[0], files=len(todo), id=f"{LOCK}:{cp.path}:{cp.ino}", ino=cp.ino,
                        jobs=[{"op": LOCK, "ino": ino, "path": p, "mode": opts.pin_lock,
                               "days": opts.pin_lock_days}
                              for p, ino, _, _ in todo]))
            todo = [o for o in objs if ((known.get(o[2]) or {}).get("etag") != o[3]
                                        or (known.get(o[2]) or {}).get("tag") != v.klass)
                    and (TAG, o[1], v.klass) not in pending]
            if todo:
                actions.append(Action(
                    TAG, rule.name, cp.path, cp.step, v.age, rule_of or "lifecycle tags",
                    f"ckptgw-class={v.klass}: {'; '.join(v.reasons)}", files=len(todo),
                    id=f"{TAG}:{cp.path}:{cp.ino}:{v.klass}", ino=cp.ino,
                    jobs=[{"op": TAG, "ino": ino, "path": p, "series": rule.name, "klass": v.klass}
                          for p, ino, _, _ in todo]))
        actions.extend(_tmp_actions(rule, scan.stale_candidates, scan.checkpoints, now))
    if s3.note:
        notes.append(s3.note)
    if object_client is None:
        notes.append("no S3 client: tag, transition and lock actions are not planned")
    return {"generated": now, "actions": actions, "checkpoints": verdicts, "notes": notes}


def iso_time(t: float) -> str:
    """Unix time -> ISO 8601 in UTC, as JSON output gives times ("2026-11-28T02:41:20.612Z")."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _public(p: dict) -> dict:
    return {"generated": iso_time(p["generated"]), "actions": [a.public() for a in p["actions"]],
            "checkpoints": [asdict(v) for v in p["checkpoints"]], "notes": p["notes"],
            "summary": _summary(p)}


def _summary(p: dict) -> dict:
    counts: dict[str, int] = {}
    for a in p["actions"]:
        counts[a.action] = counts.get(a.action, 0) + 1
    kept = sum(1 for v in p["checkpoints"] if v.verdict == "keep")
    return {"actions": counts, "checkpoints": len(p["checkpoints"]), "kept": kept,
            "deleted": len(p["checkpoints"]) - kept}


def _rules_of(rules) -> tuple:
    for r in rules or ():
        parse_pattern(r.pattern)          # refused at config load already; fail loudly if not
    return tuple(rules or ())


async def plan(*, store, rules, object_client=None, now=None, settings=None, **_) -> dict:
    """`ckptgw retention plan`: every action with checkpoint, rule and reason."""
    p = await asyncio.to_thread(build_plan, store, _rules_of(rules), object_client, now, settings)
    return _public(p)


# ---- carrying a plan out -----------------------------------------------------------------------
_apply_lock = threading.Lock()


def _resolve(store, rel: str):
    attr = store.getattr(ROOT_INO)
    parent = None
    for name in [p for p in rel.split("/") if p]:
        if attr.type != FileType.DIR:
            raise StoreError(errno.ENOTDIR, rel)
        parent = attr
        attr = store.lookup(attr.ino, name.encode("utf-8", "surrogateescape"))
    return parent, attr


def _unsafe(attr, store, *, allow_dirty: bool) -> str | None:
    if attr.pinned:
        return "pinned"
    if store.is_open(attr.ino):
        return "open"
    if attr.type == FileType.REG and not allow_dirty and attr.data_state not in _CLEAN:
        return "not clean in S3"
    return None


def remove_tree(store, rel: str, ino: int, *, allow_dirty: bool = False) -> tuple[int, str | None]:
    """Remove `rel` (file or directory subtree) if it is still inode `ino` and nothing in it is
    pinned, open or (unless allow_dirty) dirty. Everything is checked before the first
    removal. Returns (entries removed, refusal or None). Durable on return (store.sync)."""
    try:
        parent, attr = _resolve(store, rel)
    except StoreError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE):
            return 0, "gone"
        raise
    if attr.ino != ino or parent is None:
        return 0, "replaced by another entry"
    entries = [(parent.ino, rel.rsplit("/", 1)[-1], attr)]
    if attr.type == FileType.DIR:
        dirs = {"": attr.ino}                     # walk paths are relative to the subtree
        for path, a in store.walk(attr.ino):      # a directory before its content
            head, _, name = path.rpartition("/")
            entries.append((dirs[head], name, a))
            if a.type == FileType.DIR:
                dirs[path] = a.ino
    for _, name, a in entries:
        why = _unsafe(a, store, allow_dirty=allow_dirty)
        if why:
            return 0, f"{name}: {why}"
    removed = 0
    for d, name, a in reversed(entries):          # children before their directory
        store.remove(d, name.encode("utf-8", "surrogateescape"))
        removed += 1
    store.sync()
    return removed, None


def resume(store) -> list[dict]:
    """Finish deletes an earlier apply started but did not record as done (a crash)."""
    records = Records(store)
    last: dict[str, dict] = {}
    for e in records.entries():
        if e.get("action") in (DELETE, DELETE_TMP) and e.get("id"):
            last[e["id"]] = e
    out = []
    for aid, e in last.items():
        if e.get("status") != "started":
            continue
        removed, refused = remove_tree(store, e["checkpoint"], int(e.get("ino", 0)),
                                       allow_dirty=e["action"] == DELETE_TMP)
        status = "done" if refused in (None, "gone") else "refused"
        out.append(records.audit(**{**{k: v for k, v in e.items() if k != "t"}, "status": status,
                                    "detail": f"resumed after a restart: removed {removed} entries"
                                    + (f" ({refused})" if refused else "")}))
    return out


def _apply_sync(store, rules, object_client, now, settings, only) -> dict:
    with _apply_lock:
        records = Records(store)
        resumed = resume(store)
        records.rotate_if_large()            # resume() closed every open intent
        p = build_plan(store, rules, object_client, now, settings)
        done, skipped, queued_jobs = [], [], 0
        for a in p["actions"]:
            if only is not None and a.id not in only:
                skipped.append({**a.public(), "why": "not in the confirmed plan"})
                continue
            base = {k: v for k, v in a.public().items() if k not in ("age",)}
            if a.action in (DELETE, DELETE_TMP):
                records.audit(**base, status="started")
                removed, refused = remove_tree(store, a.checkpoint, a.ino, allow_dirty=a.action == DELETE_TMP)
                if refused:
                    records.audit(**base, status="refused", detail=refused)
                    skipped.append({**a.public(), "why": refused})
                    continue
                records.audit(**base, status="done", detail=f"removed {removed} entries from the namespace; "
                              "S3 deletes queued")
                records.forget_under(a.checkpoint)
            else:
                for job in a.jobs:
                    store.queue_put({"kind": JOB_KIND, "series": a.series, "checkpoint": a.checkpoint,
                                     "action_id": a.id, **job})
                    queued_jobs += 1
                store.sync()
                records.audit(**base, status="queued", detail=f"{len(a.jobs)} object job(s) queued")
            done.append(a.public())
        if only is not None:
            current = {a.id for a in p["actions"]}
            for aid in sorted(set(only) - current):
                skipped.append({"id": aid, "why": "no longer in the plan"})
        return {"generated": iso_time(p["generated"]), "actions": done, "skipped": skipped, "queued_jobs": queued_jobs,
                "resumed": resumed, "notes": p["notes"], "summary": _summary(p)}


async def apply(*, store, rules, object_client=None, now=None, settings=None, uploader=None,
                only=None, **_) -> dict:
    """`ckptgw retention apply`: carry out the current plan (or only the actions whose ids are
    in `only`, the plan an operator confirmed)."""
    if uploader is None:
        raise RetentionError("retention apply needs the uploader (its queue carries the S3 side out)")
    only_set = set(only) if only is not None else None
    result = await asyncio.to_thread(_apply_sync, store, _rules_of(rules), object_client, now, settings,
                                     only_set)
    uploader.kick()
    return result


async def log_entries(*, store, limit=100, **_) -> dict:
    """`ckptgw retention log`: the newest `limit` audit entries (0: all), oldest first, each
    with its time as ISO 8601 under "time" (the audit file keeps Unix time under "t")."""
    limit = int(limit) if limit is not None else 100
    entries = await asyncio.to_thread(Records(store).newest_entries, max(limit, 0))
    return {"entries": [_public_entry(e) for e in entries]}


def _public_entry(entry: dict) -> dict:
    out = {k: v for k, v in entry.items() if k != "t"}
    if isinstance(entry.get("t"), (int, float)):
        out["time"] = iso_time(entry["t"])
    return out


# ---- pins ------------------------------------------------------------------------------------
def set_pin(store, rel: str, pinned: bool, reason: str = "", settings=None) -> dict:
    """Pin or unpin `rel` and everything under it (files and directories, so a checkpoint
    directory itself carries the pin and its reason), and queue the Object Lock jobs: a lock
    for each uploaded file on pin, lifting legal holds on unpin. Blocking."""
    opts = Options.of(settings)
    _, attr = _resolve(store, rel)
    items = [(rel, attr)]
    if attr.type == FileType.DIR:
        items += store.walk(attr.ino, rel)
    files, jobs = 0, 0
    for path, a in items:
        store.set_pinned(a.ino, pinned, reason)
        if a.type != FileType.REG:
            continue
        files += 1
        if opts.pin_lock == "off" or (not pinned and opts.pin_lock != "legal-hold"):
            continue
        if store.remote_info(a.ino).etag:
            store.queue_put({"kind": JOB_KIND, "op": LOCK if pinned else UNLOCK, "ino": a.ino, "path": path,
                             "mode": opts.pin_lock, "days": opts.pin_lock_days, "checkpoint": rel,
                             "action_id": f"{'pin' if pinned else 'unpin'}:{rel}"})
            jobs += 1
    store.sync()
    Records(store).audit(action="pin" if pinned else "unpin", checkpoint=rel, reason=reason, files=files,
                         status="done", detail=f"{jobs} Object Lock job(s) queued (pin_lock={opts.pin_lock})")
    return {"path": rel, "files": files, "pinned": pinned, "reason": reason, "lock_jobs": jobs}


def pin_reasons(store) -> dict[int, str]:
    return store.pinned()


# ---- the uploader's side: running "retention" jobs -----------------------------------------------
def _job_keys(job: dict) -> list[KeyRef]:
    return [KeyRef(job["path"])] if job.get("path") else []


class JobRunner:
    """Runs retention jobs for one Uploader, every S3 call through its gate."""

    LOCK_CHECK_SECONDS = 60.0

    def __init__(self, uploader):
        self.up = uploader
        self._lock_enabled: tuple[float, bool] | None = None

    async def _call(self, op: str, fn, key: str):
        return await self.up.gate.call(op, fn, what=key)

    async def _bucket_locks(self) -> bool:
        now = time.monotonic()
        if self._lock_enabled is None or now - self._lock_enabled[0] > self.LOCK_CHECK_SECONDS:
            enabled = await self._call("GetObjectLockConfiguration", self.up.client.object_lock_enabled, "")
            self._lock_enabled = (now, enabled)
        return self._lock_enabled[1]

    async def run(self, job: dict) -> str:
        """One job. S3 outages are retried by the gate for as long as they last; an error S3
        will repeat (403, a bucket without Object Lock...) ends the job, loudly: the next plan
        derives it again, and it must not hold back uploads of the same path meanwhile."""
        try:
            return await self._run(job)
        except PermanentError as e:
            Records(self.up.store).audit(action=job.get("op"), job=True, checkpoint=job.get("checkpoint"),
                                         path=job.get("path"), status="failed", detail=f"{e.code}: {e}")
            log.error("retention_job_failed", op=job.get("op"), path=job.get("path"), code=e.code, error=str(e))
            return f"failed: {e.code}"

    async def _run(self, job: dict) -> str:
        store = self.up.store
        records = Records(store)
        op, ino = job.get("op"), job.get("ino")
        try:
            attr = store.getattr(ino)
            remote = store.remote_info(ino)
            path = store.path_of(ino)
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return "gone"
            raise
        if path != job.get("path") or not remote.key or not remote.etag:
            outcome = "moved-or-not-uploaded"
            records.audit(action=op, job=True, checkpoint=job.get("checkpoint"), path=job.get("path"),
                          status="skipped", detail=outcome)
            return outcome
        key = self.up.keys.file_key(remote.key)
        rkey = remote.key                  # records are keyed prefix-relative, like RemoteInfo
        client = self.up.client
        if op == TRANSITION:
            outcome = await self._transition(job, attr, remote, key)
        elif op == TAG:
            tags = tags_for(job["series"], job["klass"])
            await self._call("PutObjectTagging", lambda: client.put_object_tags(key, tags), key)
            records.update_object(rkey, remote.etag, tag=job["klass"])
            outcome = f"tagged {job['klass']}"
        elif op in (LOCK, UNLOCK):
            if not await self._bucket_locks():
                outcome = "bucket has no Object Lock"
            elif op == LOCK:
                if not attr.pinned:
                    outcome = "unpinned meanwhile"
                else:
                    outcome = await self._call("PutObjectLock", lambda: lock_object(
                        client, key, job.get("mode", "legal-hold"), int(job.get("days") or 0)), key)
                    records.update_object(rkey, remote.etag, lock=job.get("mode", "legal-hold"))
            else:
                if attr.pinned:
                    outcome = "pinned again meanwhile"
                else:
                    outcome = await self._call("PutObjectLegalHold", lambda: unlock_object(
                        client, key, job.get("mode", "legal-hold")), key)
                    records.update_object(rkey, remote.etag, lock=None)
        else:
            log.warning("retention_unknown_job", job=job)
            return "ignored"
        records.audit(action=op, job=True, checkpoint=job.get("checkpoint"), path=path, key=key,
                      status="done", detail=outcome)
        return outcome

    async def _transition(self, job: dict, attr, remote, key: str) -> str:
        store, client = self.up.store, self.up.client
        target = job["storage_class"]
        if attr.pinned or attr.data_state not in _CLEAN or store.is_open(attr.ino):
            return "skipped: pinned, open or not clean any more"
        current = await self._call("HeadObject", lambda: client.storage_class(key), key)
        if current is None:
            return "object missing"
        if _storage_rank(current) < _storage_rank(target):
            if remote.size > 5 << 30:
                return "skipped: over 5 GiB (CopyObject limit); the bucket lifecycle rule moves it"
            res = await self._call("CopyObject", lambda: client.change_storage_class(key, target), key)
            cur = store.remote_info(attr.ino)
            if cur.key == remote.key and cur.etag == remote.etag:
                # the copy is a new object (a multipart source gets a new ETag): record it, or
                # `verify` would call the object replaced
                cur.etag, cur.checksum = res.etag or cur.etag, res.checksum or cur.checksum
                await asyncio.to_thread(store.set_remote_info, attr.ino, cur)
            Records(store).update_object(remote.key, cur.etag, was=remote.etag, storage_class=target)
            return f"moved {current} -> {target}"
        Records(store).update_object(remote.key, remote.etag, storage_class=current)
        return f"already {current}"


def install_job_handlers(uploader) -> None:
    """Called by Uploader.__init__: run "retention" jobs of the durable queue."""
    runner = JobRunner(uploader)
    uploader.job_handlers[JOB_KIND] = (runner.run, _job_keys)
