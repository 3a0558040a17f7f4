"""Checkpoint manifests: a small object written LAST into each complete checkpoint.

A job or tool reading the bucket directly (not through the gateway) must never load a
half-uploaded step. For every directory a `[[retention.series]]` rule calls a checkpoint,
once every file in it is clean in S3 (uploaded, no namespace job still moving it, none
open, no temporary entry inside), the uploader PUTs `<checkpoint>/.ckptgw-manifest.json`:

    {"format": "ckptgw-manifest/1", "checkpoint": "runs/a/step_000100", "series": "llama",
     "step": 100, "written": "2026-11-23T21:00:00Z", "store": "<store id>",
     "files": [{"name": "model.pt", "size": 123, "etag": "\"...\"", "checksum": "crc32:...",
                "version_id": null, "ino": 12, "data_seq": 3}, ...]}

Names are relative to the checkpoint and sorted. A loader checks a checkpoint is complete
and untorn by HEAD-ing `<prefix><checkpoint>/<name>` for every entry: size and ETag must
match (the object's x-amz-meta-ckptgw-seq equals data_seq too). Invariant: a manifest
is written only after every object it lists is in place under its final key; when the
checkpoint changes the manifest is rewritten (its ETags stop matching in the meantime,
which the loader's check catches), and when the checkpoint directory is removed or stops
being complete for good (a file deleted) it is deleted. Import never turns a manifest into
a file. Passes run after jobs finish (debounced) and at the end of a flush.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time

import structlog

from cache.api import StoreError

from .jobs import NS, UPLOAD, ns_keys
from .objectclient import ObjectClientError, checksum_b64
from .series import discover, parse_pattern

log = structlog.get_logger(__name__)

MANIFEST_NAME = ".ckptgw-manifest.json"
FORMAT = "ckptgw-manifest/1"
DIGEST_META = "ckptgw-manifest-sha256"     # of the manifest's content without "written"


def manifest_path(checkpoint: str) -> str:
    return f"{checkpoint.rstrip('/')}/{MANIFEST_NAME}"


def is_manifest_key(path: str) -> bool:
    return path.rsplit("/", 1)[-1] == MANIFEST_NAME


def _unsettled(store) -> tuple[list[str], list[str]]:
    """Paths with a queued job, whose objects are not final yet: (paths a job writes or
    deletes: they matter inside a checkpoint; directories being renamed: they matter
    around one too). A pending marker of a parent directory does not hold a checkpoint."""
    inside, moving = [], []
    for _, job in store.queue_list(1 << 30):
        if job.get("kind") == UPLOAD:
            try:
                p = store.path_of(job["ino"])
            except StoreError:
                continue
            if p:
                inside.append(p)
        elif job.get("kind") == NS:
            paths = [k.path.rstrip("/") for k in ns_keys(job)]
            (moving if job.get("op") == "rename" and job.get("type") == "dir" else inside).extend(paths)
    return inside, moving


def _under(path: str, cp: str) -> bool:
    return path == cp or path.startswith(cp + "/")


def build(store, rules, store_id: str) -> dict[str, dict]:
    """*Blocking.* {checkpoint path: manifest body} of every complete checkpoint."""
    inside, moving = _unsettled(store)
    complete: dict[str, dict] = {}
    for rule in rules:
        scan = discover(store, rule.name, parse_pattern(rule.pattern))
        for cp in scan.checkpoints:
            if (not cp.complete or any(_under(p, cp.path) for p in inside)
                    or any(_under(p, cp.path) or _under(cp.path, p) for p in moving)):
                continue
            files = []
            for path, ino in sorted(cp.file_inos):
                try:
                    r = store.remote_info(ino)
                except StoreError:
                    break
                if r.key != path or not r.etag:
                    break                        # not (yet) under its final key
                files.append({"name": path[len(cp.path) + 1:], "size": r.size, "etag": r.etag,
                              "checksum": r.checksum, "version_id": r.version_id, "ino": ino,
                              "data_seq": r.data_seq})
            else:
                complete[cp.path] = {"format": FORMAT, "checkpoint": cp.path, "series": rule.name,
                                     "step": cp.step, "store": store_id, "files": files}
    return complete


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class Manifests:
    """Writes and removes the manifests of the uploader's series (see the module doc)."""

    def __init__(self, uploader, rules):
        self.up = uploader
        self.rules = tuple(rules or ())
        self._written: dict[str, str] = {}     # checkpoint -> digest in S3 (this run's knowledge)
        self._lock = asyncio.Lock()

    async def run_pass(self) -> int:
        """Write the manifests that are missing or out of date, delete those of checkpoints
        that are no longer complete. Returns the number of S3 writes and deletes."""
        if not self.rules:
            return 0
        async with self._lock:
            complete = await asyncio.to_thread(build, self.up.store, self.rules, self.up.worker.store_id)
            changes = 0
            for path, body in complete.items():
                digest = _digest(body)
                if self._written.get(path) == digest:
                    continue
                if path not in self._written and await self._in_s3(path) == digest:
                    self._written[path] = digest
                    continue
                await self._put(path, body, digest)
                self._written[path] = digest
                changes += 1
            for path in [p for p in self._written if p not in complete]:
                # changed (a file dirty, deleted, renamed) or gone: the manifest goes until the
                # checkpoint is complete again
                await self._delete(path)
                del self._written[path]
                changes += 1
            return changes

    async def _in_s3(self, path: str) -> str | None:
        key = self.up.keys.file_key(manifest_path(path))
        info = await self.up.gate.call("HeadObject", lambda: self.up.client.head_object(key), what=key)
        return None if info is None else info.metadata.get(DIGEST_META)

    async def _put(self, path: str, body: dict, digest: str) -> None:
        key = self.up.keys.file_key(manifest_path(path))
        data = json.dumps({**body, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                          indent=1, sort_keys=True).encode()
        algo = self.up.client.checksum_algorithm
        await self.up.gate.call("PutObject", lambda: self.up.client.put_object(
            key, data, metadata={DIGEST_META: digest}, checksum=checksum_b64(algo, data),
            content_type="application/json"), what=key)
        log.info("manifest_written", checkpoint=path, files=len(body["files"]), key=key)

    async def _delete(self, path: str) -> None:
        key = self.up.keys.file_key(manifest_path(path))
        await self.up.gate.call("DeleteObject", lambda: self.up.client.delete_object(key), what=key)
        log.info("manifest_deleted", checkpoint=path, key=key)

    async def run_quietly(self) -> None:
        try:
            await self.run_pass()
        except (ObjectClientError, StoreError) as e:
            log.warning("manifest_pass_failed", error=str(e))
