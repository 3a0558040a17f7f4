"""Helpers for the retention tests: a synthetic checkpoint series written through the store,
rules as the config builds them, an uploader against moto."""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass

from cache.api import ROOT_INO, SetAttr, StoreError
from testkit.storefiles import mkdirs

PREFIX = "gw/"
DAY = 86400.0
HOUR = 3600.0
_seq = itertools.count()


def s3_settings(endpoint: str, bucket: str):
    from uploader.settings import S3Settings
    return S3Settings(bucket=bucket, endpoint_url=endpoint, access_key="testing", secret_key="testing",
                      addressing_style="path", prefix=PREFIX, read_timeout=5.0, connect_timeout=2.0)


def client(endpoint: str, bucket: str):
    from uploader.objectclient import Boto3ObjectClient
    return Boto3ObjectClient(s3_settings(endpoint, bucket))


def new_bucket(endpoint: str, *, object_lock: bool = False) -> str:
    name = f"ret{next(_seq)}-{os.getpid()}"
    kwargs = {"ObjectLockEnabledForBucket": True} if object_lock else {}
    client(endpoint, name)._s3.create_bucket(Bucket=name, **kwargs)
    return name


def make_uploader(store, endpoint: str, bucket: str, **over):
    from uploader.service import Uploader
    from uploader.settings import UploadSettings
    base = dict(settle_seconds=0.0, max_concurrency=4, poll_interval=0.05, backoff_base=0.02, backoff_max=0.3,
                evict_interval=3600.0, abort_orphan_uploads=False)
    base.update(over)
    return Uploader(store, client(endpoint, bucket), UploadSettings(**base), prefix=PREFIX)


@dataclass(frozen=True)
class T:
    after: float
    storage_class: str


@dataclass(frozen=True)
class Rule:
    name: str = "llama-70b"
    pattern: str = "runs/*/step_{step}"
    keep_last: int = 3
    keep_every: int = 0
    min_age: float = HOUR
    expire_after: float | None = None
    stale_tmp_after: float | None = DAY
    transitions: tuple = ()


@dataclass(frozen=True)
class Settings:
    pin_lock: str = "legal-hold"
    pin_lock_days: int = 0
    schedule: float | None = None
    abort_incomplete_multipart_days: int = 7


def write_file(store, path: str, data: bytes, *, keep_open: bool = False) -> int:
    head, _, name = path.rpartition("/")
    parent = mkdirs(store, head)
    attr, _, _ = store.create(parent, name.encode(), 0o640, 1000, 1000)
    store.open_file(attr.ino, True)
    store.write(attr.ino, 0, data)
    store.commit(attr.ino)
    if not keep_open:
        store.close_file(attr.ino, True)
    store.sync()
    return attr.ino


def resolve(store, path: str):
    attr = store.getattr(ROOT_INO)
    for part in [p for p in path.split("/") if p]:
        attr = store.lookup(attr.ino, part.encode())
    return attr


def exists(store, path: str) -> bool:
    try:
        resolve(store, path)
        return True
    except StoreError:
        return False


def set_age(store, path: str, age: float, now: float) -> None:
    """Set the mtime of `path` and everything under it to `age` seconds before `now`."""
    t = int((now - age) * 1e9)
    attr = resolve(store, path)
    stack = [attr]
    while stack:
        a = stack.pop()
        store.setattr(a.ino, SetAttr(mtime_ns=t))
        if a.type == 2:
            stack.extend(e.attr for e in store.readdir(a.ino))
    store.sync()


FILES = {"model.pt": 1500, "optim.pt": 700}


def ckpt(step: int, run: str = "a") -> str:
    return f"runs/{run}/step_{step:06d}"


def age_of(step: int) -> float:
    """The synthetic series' ages: step 5000 is half an hour old, each 100 steps older one day more."""
    return (5000 - step) / 100 * DAY + 0.5 * HOUR


STEPS = list(range(100, 5001, 100))          # 50 checkpoints
INCOMPLETE = 5100
PINNED = 1500


def write_series(store, *, steps=STEPS, run: str = "a") -> None:
    for step in steps:
        for name, size in FILES.items():
            write_file(store, f"{ckpt(step, run)}/{name}", bytes([step % 251]) * size)


def age_series(store, now: float, *, steps=STEPS, run: str = "a") -> None:
    for step in steps:
        set_age(store, ckpt(step, run), age_of(step), now)


def mark_clean(store, path: str) -> None:
    """Record files under `path` as uploaded without S3 (plan-only tests)."""
    from cache.api import RemoteInfo
    attr = resolve(store, path)
    stack = [(path, attr)]
    while stack:
        p, a = stack.pop()
        if a.type == 2:
            stack.extend((f"{p}/{e.name.decode()}", e.attr) for e in store.readdir(a.ino))
        elif a.type == 1:
            store.mark_uploaded(a.ino, RemoteInfo(key=p, etag='"x"', uploaded_change=store.getattr(a.ino).change,
                                                  size=a.size))


def objects(cl, prefix: str = PREFIX) -> set[str]:
    return {o.key for o in cl.list_objects(prefix)}


def run(coro):
    return asyncio.run(coro)


async def drain(up, timeout: float = 30.0) -> None:
    """Until the durable queue is empty."""
    deadline = time.monotonic() + timeout
    while up.store.queue_list(1):
        if time.monotonic() > deadline:
            raise AssertionError(f"queue not drained: {up.store.queue_list(5)} "
                                 f"running={list(up._running_jobs.values())}")
        up.kick()
        await asyncio.sleep(0.05)
