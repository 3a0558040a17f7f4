"""The admin commands: what `ckptgw <command>` asks the daemon, one method each.

Each `cmd_<name>(args, progress)` returns a JSON-able result or raises AdminError. They run
on the daemon's event loop; store walks and S3 calls go to worker threads. Each declares the
arguments a caller may send (`@takes`, appliance.argschema); `dispatch` refuses anything else
before the command runs, so a command only ever sees declared, type-checked, bounded args.
"""
from __future__ import annotations

import asyncio
import errno
import importlib
import os
import time
from dataclasses import fields
from typing import Any

import structlog

from cache.api import DataState, FileType, StoreError
from uploader.verify import FORMS, verify_file

from . import tree
from .admin import AdminError
from .argschema import MAX_ITEMS, PATH, Arg, validate
from .units import fmt_seconds

log = structlog.get_logger(__name__)

STATE_NAMES = {s: s.name.lower() for s in DataState}
PROGRESS_INTERVAL = 0.5


def _state_name(attr) -> str:
    return STATE_NAMES.get(DataState(attr.data_state), str(attr.data_state))


def _store_error(e: StoreError, path: str) -> AdminError:
    if e.errno in (errno.ENOENT, errno.ESTALE):
        return AdminError("not_found", f"{path or '/'} does not exist in the cache")
    if e.errno == errno.ENOTDIR:
        return AdminError("not_found", f"{path or '/'}: a component of the path is not a directory")
    return AdminError("failed", f"{path or '/'}: {os.strerror(e.errno) if e.errno else e}")


def takes(**schema: Arg):
    """Declare the arguments a command accepts (name -> Arg); none given: it takes none."""
    def mark(fn):
        fn.schema = schema
        return fn
    return mark


def schemas() -> dict[str, dict[str, Arg]]:
    """Wire command name -> its declared arguments (for docs and tests)."""
    return {name[len("cmd_"):]: fn.schema for name, fn in vars(Commands).items() if name.startswith("cmd_")}


class Commands:
    def __init__(self, daemon):
        self.d = daemon

    async def dispatch(self, cmd: str, args: dict, progress) -> Any:
        handler = getattr(self, "cmd_" + cmd.replace("-", "_"), None)
        if handler is None:
            raise AdminError("bad_request", f"unknown command {cmd!r}")
        schema = getattr(handler, "schema", None)
        if schema is None:           # every command declares its arguments: no schema, no call
            raise AdminError("bad_request", f"unknown command {cmd!r}")
        args = validate(cmd, schema, args)
        try:
            return await handler(args, progress)
        except StoreError as e:
            raise _store_error(e, str(args.get("path", ""))) from None
        except Exception as e:
            if type(e).__name__ in ("RetentionError", "LifecycleError"):     # the modules' own refusals
                raise AdminError("failed", str(e)) from None
            raise

    # -- helpers ----------------------------------------------------------------------
    def _rel(self, args: dict) -> str:
        try:
            return tree.store_path(str(args.get("path") or ""), [e.path for e in self.d.config.exports])
        except ValueError as e:
            raise AdminError("bad_request", str(e)) from None

    @property
    def store(self):
        if self.d.store is None:
            raise AdminError("unavailable", "the cache store is not open")
        return self.d.store

    @property
    def uploader(self):
        if self.d.uploader is None:
            raise AdminError("unavailable", "the uploader is not running in this daemon")
        return self.d.uploader

    async def _files(self, rel: str) -> list[tuple[str, Any]]:
        return await asyncio.to_thread(lambda: list(tree.files(self.store, rel)))

    def _file_row(self, path: str, attr) -> dict:
        row = {"path": path, "ino": attr.ino, "type": FileType(attr.type).name.lower(), "size": attr.size,
               "state": _state_name(attr), "pinned": bool(attr.pinned), "progress": None}
        if attr.type == FileType.REG and self.d.uploader is not None and hasattr(self.d.uploader, "file_state"):
            info = self.d.uploader.file_state(attr.ino)
            if info:
                row["state"] = info.get("state", row["state"])
                done, total = info.get("bytes_done"), info.get("size")
                if info.get("progress") is not None:
                    row["progress"] = float(info["progress"])
                elif done is not None and total:
                    row["progress"] = done / total
        return row

    # -- status and inventory -------------------------------------------------------------
    @takes()
    async def cmd_status(self, args, progress):
        return await asyncio.to_thread(self.d.status)

    @takes(path=PATH, recursive=Arg("bool", "the whole subtree"))
    async def cmd_ls(self, args, progress):
        rel = self._rel(args)
        store = self.store

        def listing():
            entries = tree.walk(store, rel) if args.get("recursive") else tree.children(store, rel)
            # by name, a directory's content right after it (the store gives creation order)
            entries = sorted(entries, key=lambda e: e[0].split("/"))
            reasons = store.pinned()
            rows = [self._file_row(p, a) for p, a in entries]
            for row in rows:
                if row["pinned"] or row["ino"] in reasons:
                    row["pinned"], row["pin_reason"] = True, reasons.get(row["ino"], "")
            return rows
        return {"path": rel, "entries": await asyncio.to_thread(listing)}

    @takes()
    async def cmd_clients(self, args, progress):
        nfs = self.d.nfs
        sessions = getattr(nfs, "sessions", None)
        if sessions is None:
            return {"clients": []}
        now = time.monotonic()
        out = []
        for c in list(sessions.clients.values()):
            out.append({"clientid": f"{c.clientid:016x}", "owner": c.owner.decode(errors="replace"),
                        "peer": ":".join(str(x) for x in c.peer) if c.peer else None,
                        "minorversion": c.minorversion, "confirmed": c.confirmed,
                        "sessions": len(c.sessions), "idle_s": round(now - c.last_renew, 3)})
        return {"clients": out}

    @takes()
    async def cmd_exports(self, args, progress):
        """Every declared export option, as the config file would spell it."""
        return {"exports": [{f.name: _export_value(f.name, getattr(e, f.name)) for f in fields(e)}
                            for e in self.d.config.exports]}

    @takes()
    async def cmd_check(self, args, progress):
        problems = await asyncio.to_thread(self.store.check)
        return {"consistent": not problems, "problems": list(problems)}

    @takes()
    async def cmd_reload(self, args, progress):
        return await self.d.reload()

    # -- uploads ------------------------------------------------------------------------
    async def _pending(self, rel: str) -> tuple[int, int, int]:
        """(files not clean, their bytes, all bytes) under rel."""
        files = await self._files(rel)
        pending = [a for _, a in files if a.data_state not in (DataState.CLEAN, DataState.ABSENT)]
        return len(pending), sum(a.size for a in pending), sum(a.size for _, a in files)

    @takes(path=PATH, wait=Arg("bool", "wait until in S3"),
               timeout=Arg("number", "seconds to wait at most", lo=0, hi=366 * 86400))
    async def cmd_flush(self, args, progress):
        rel = self._rel(args)
        uploader = self.uploader
        await asyncio.to_thread(tree.resolve, self.store, rel)         # not found -> clear error
        wait = bool(args.get("wait"))
        timeout = args.get("timeout")
        timeout = float(timeout) if timeout is not None else None
        if not wait:
            await uploader.flush(rel, wait=False)
            n, pending, total = await self._pending(rel)
            return {"path": rel, "waited": False, "pending_files": n, "pending_bytes": pending,
                    "total_bytes": total}
        task = asyncio.ensure_future(uploader.flush(rel, wait=True, timeout=timeout))
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PROGRESS_INTERVAL)
                n, pending, total = await self._pending(rel)
                await progress({"pending_files": n, "pending_bytes": pending, "total_bytes": total})
                if task in done:
                    break
                if deadline is not None and time.monotonic() > deadline + 5.0:
                    break               # the uploader overran its own timeout: stop waiting anyway
        finally:
            if not task.done():
                task.cancel()
        flushed = task.done() and not task.cancelled() and task.exception() is None and task.result()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise AdminError("failed", f"flush of {rel or '/'} failed: {task.exception()}")
        n, pending, total = await self._pending(rel)
        if not flushed:
            raise AdminError("timeout", f"flush of {rel or '/'} timed out after {fmt_seconds(timeout)} with "
                             f"{n} file(s), {pending} bytes not yet in S3")
        return {"path": rel, "waited": True, "pending_files": n, "pending_bytes": pending, "total_bytes": total}

    # -- cache residency --------------------------------------------------------------------
    async def _set_pinned(self, args, pinned: bool):
        rel = self._rel(args)
        store = self.store
        reason = str(args.get("reason") or "admin")
        try:
            from uploader.retention import set_pin
        except ImportError:
            set_pin = None
        if set_pin is not None:
            # pins the directories too (a checkpoint carries its reason) and queues Object Lock jobs
            res = await asyncio.to_thread(set_pin, store, rel, pinned, reason if pinned else "",
                                          self.d.config.retention)
            if res["lock_jobs"] and self.d.uploader is not None:
                self.d.uploader.kick()
            log.info("pinned" if pinned else "unpinned", path=rel, files=res["files"], reason=reason,
                     lock_jobs=res["lock_jobs"])
            return res

        def run():                                  # no retention module: the store's pin alone
            n = 0
            for _, attr in tree.files(store, rel):
                store.set_pinned(attr.ino, pinned, reason)
                n += 1
            store.sync()
            return n
        result = {"path": rel, "files": await asyncio.to_thread(run), "pinned": pinned, "reason": reason}
        log.info("pinned" if pinned else "unpinned", path=rel, files=result["files"], reason=reason)
        return result

    @takes(path=PATH, reason=Arg("str", "why (shown in ls, plans, logs)"))
    async def cmd_pin(self, args, progress):
        return await self._set_pinned(args, True)

    @takes(path=PATH)
    async def cmd_unpin(self, args, progress):
        return await self._set_pinned(args, False)

    @takes(path=PATH)
    async def cmd_evict(self, args, progress):
        if self.d.embedded is not None:
            raise AdminError("unavailable", "eviction is off in try-out mode: the embedded S3 is in memory, "
                             "so the cache holds the only durable copy")
        rel = self._rel(args)
        store = self.store

        def run():
            freed, evicted, skipped = 0, 0, {}
            for _, attr in tree.files(store, rel):
                reason = None
                if attr.pinned:
                    reason = "pinned"
                elif attr.data_state == DataState.ABSENT:
                    continue
                elif attr.data_state != DataState.CLEAN:
                    reason = "not yet in S3"
                else:
                    try:
                        freed += store.evict(attr.ino)
                        evicted += 1
                    except StoreError as e:
                        reason = os.strerror(e.errno) if e.errno else str(e)
                if reason:
                    skipped[reason] = skipped.get(reason, 0) + 1
            return freed, evicted, skipped
        freed, evicted, skipped = await asyncio.to_thread(run)
        log.info("evicted", path=rel, files=evicted, bytes=freed, skipped=skipped)
        return {"path": rel, "evicted_files": evicted, "freed_bytes": freed, "skipped": skipped}

    @takes(path=PATH)
    async def cmd_warmup(self, args, progress):
        rel = self._rel(args)
        uploader = self.uploader
        store = self.store

        def absent_files():
            out = []
            for path, attr in tree.files(store, rel):
                missing = sum(e.length for e in store.extents(attr.ino) if e.state == DataState.ABSENT)
                if missing:
                    out.append((path, missing))
            return out
        files = await asyncio.to_thread(absent_files)
        total = sum(n for _, n in files)
        done = fetched = 0
        await progress({"done_bytes": 0, "total_bytes": total, "file": None})
        for path, missing in files:
            fetched += await uploader.warmup(path)
            done += missing
            await progress({"done_bytes": done, "total_bytes": total, "file": path})
        return {"path": rel, "files": len(files), "bytes": fetched}

    @takes(path=PATH)
    async def cmd_verify(self, args, progress):
        rel = self._rel(args)
        store = self.store
        client, prefix = self.d.object_client, self.d.s3_prefix
        if client is None:
            raise AdminError("unavailable", "no S3 client in this daemon")
        files = [(p, a) for p, a in await self._files(rel)
                 if a.data_state in (DataState.CLEAN, DataState.ABSENT)]
        results = {"path": rel, "checked": 0, "ok": 0, "mismatches": [], "skipped_not_local": 0,
                   "not_uploaded": 0}
        results["not_uploaded"] = sum(1 for _, a in await self._files(rel)
                                      if a.data_state not in (DataState.CLEAN, DataState.ABSENT))
        total = sum(a.size for _, a in files)
        done = 0
        # the part layout of our own multipart uploads, for their composite checksums
        settings = getattr(self.d.uploader, "settings", None) or self.d.config.upload_settings()
        matched_by = results["matched_by"] = dict.fromkeys(FORMS, 0)    # what showed each match
        for path, attr in files:
            verdict = await asyncio.to_thread(verify_file, store, client, prefix, attr,
                                              part_size_min=settings.part_size_min)
            results["checked"] += 1
            if verdict.problem == "not local":
                results["skipped_not_local"] += 1
            elif verdict.problem:
                results["mismatches"].append({"path": path, "problem": verdict.problem,
                                              "compared": verdict.form})
            else:
                results["ok"] += 1
                matched_by[verdict.form] += 1
            done += attr.size
            await progress({"done_bytes": done, "total_bytes": total, "file": path})
        if results["mismatches"]:
            log.error("verify_mismatch", path=rel, mismatches=results["mismatches"][:20])
        log.info("verified", path=rel, checked=results["checked"], ok=results["ok"],
                 differ=len(results["mismatches"]), matched_by=matched_by)
        return results

    @takes()
    async def cmd_import(self, args, progress):
        """Objects under the bucket prefix that the namespace lacks become ABSENT files."""
        report = await self.uploader.import_bucket()
        log.info("imported", imported=report.imported, directories=report.directories, symlinks=report.symlinks,
                 kept_local=report.skipped_existing, invalid=len(report.skipped_invalid))
        return {"imported": report.imported, "directories": report.directories, "symlinks": report.symlinks,
                "already_present": report.skipped_existing, "invalid_keys": list(report.skipped_invalid)}

    # -- retention and lifecycle (uploader.retention / uploader.lifecycle) -------------------
    async def _rules_module(self, name: str, action: str, args: dict):
        try:
            module = importlib.import_module(f"uploader.{name}")
        except ImportError:
            module = None
        fn = getattr(module, action, None) if module else None
        if fn is None:
            raise AdminError("unavailable", f"{name} {action} is not available in this version")
        # the caller's (declared, checked) arguments first; the daemon's own last, so they win
        kwargs = {**args, "store": self.store, "rules": self.d.config.retention.series,
                  "settings": self.d.config.retention, "object_client": self.d.object_client,
                  "uploader": self.d.uploader, "prefix": self.d.s3_prefix, "now": time.time()}
        result = fn(**kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    @takes()
    async def cmd_retention_plan(self, args, progress):
        return await self._rules_module("retention", "plan", args)

    @takes(only=Arg("str_list", "ids of the plan's actions to apply (the plan shown)",
                              max_len=MAX_ITEMS))
    async def cmd_retention_apply(self, args, progress):
        return await self._rules_module("retention", "apply", args)

    @takes(limit=Arg("int", "newest N entries (0: all)", lo=0, hi=MAX_ITEMS))
    async def cmd_retention_log(self, args, progress):
        return await self._rules_module("retention", "log_entries", args)

    @takes()
    async def cmd_lifecycle_plan(self, args, progress):
        return await self._rules_module("lifecycle", "plan", args)

    @takes()
    async def cmd_lifecycle_sync(self, args, progress):
        return await self._rules_module("lifecycle", "sync", args)


def _export_value(name: str, value):
    if value is None:
        return None
    if name == "owner":
        return f"{value[0]}:{value[1]}"
    if name == "mode":
        return f"{value:04o}"
    return list(value) if isinstance(value, tuple) else value
