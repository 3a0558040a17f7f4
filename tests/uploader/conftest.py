"""Fixtures for the uploader tests: one moto server per session, a fault proxy per test."""
from __future__ import annotations

import os
import sys

import pytest

# the checkout root is not on sys.path by default; make `tests` and `testkit` importable.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from testkit.faultproxy import ThreadedFaultProxy  # noqa: E402
from testkit.motoserver import MotoServer  # noqa: E402

SMALL_PART = 256 * 1024   # moto's minimum part size is lowered to this for tests


@pytest.fixture(scope="session")
def moto():
    server = MotoServer(min_part_size=SMALL_PART)
    yield server
    server.stop()


@pytest.fixture
def proxy(moto):
    p = ThreadedFaultProxy(moto.port, seed=1234)
    yield p
    p.stop()


# ---- store + uploader helpers ----------------------------------------------------------
import asyncio  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402

from testkit.storefiles import mkdirs  # noqa: E402
from cache.store import Store  # noqa: E402
from uploader.objectclient import Boto3ObjectClient  # noqa: E402
from uploader.service import Uploader  # noqa: E402
from uploader.settings import S3Settings, UploadSettings  # noqa: E402

_bucket_seq = itertools.count()


def uploader_settings(**over) -> UploadSettings:
    base = dict(settle_seconds=0.3, part_size_min=SMALL_PART, allow_small_parts=True,
                multipart_threshold=2 * SMALL_PART, max_concurrency=4, poll_interval=0.05,
                backoff_base=0.02, backoff_max=0.5, evict_interval=0.2, readahead_chunk=SMALL_PART)
    base.update(over)
    return UploadSettings(**base)


def s3_settings(endpoint: str, bucket: str, prefix: str = "gw/", **over) -> S3Settings:
    return S3Settings(bucket=bucket, endpoint_url=endpoint, access_key="testing", secret_key="testing",
                      addressing_style="path", prefix=prefix, read_timeout=over.pop("read_timeout", 5.0),
                      connect_timeout=2.0, **over)


@pytest.fixture
def bucket(moto):
    name = f"bkt{next(_bucket_seq)}-{os.getpid()}"
    Boto3ObjectClient(s3_settings(moto.endpoint, name))._s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def store(tmp_path):
    s = Store.open(str(tmp_path / "store"), capacity=1 << 30)
    yield s
    s.close()


def make_uploader(store, endpoint, bucket, prefix="gw/", **over):
    s3 = s3_settings(endpoint, bucket, prefix)
    return Uploader(store, Boto3ObjectClient(s3), uploader_settings(**over), s3=s3)



def import_and_flush(store, endpoint: str, bucket: str):
    """`ckptgw import` on a running uploader, then a flush: the import's report."""
    async def run():
        up = make_uploader(store, endpoint, bucket)
        await up.start()
        try:
            report = await up.import_bucket()
            assert await up.flush(timeout=60)
            return report
        finally:
            await up.stop()
    return asyncio.run(run())

def flush_uploads(store, endpoint: str, bucket: str) -> None:
    """Run the store's uploader until everything it has to send is in the bucket."""
    async def run():
        up = make_uploader(store, endpoint, bucket)
        await up.start()
        try:
            assert await up.flush(timeout=60)
        finally:
            await up.stop()
    asyncio.run(run())


def fill_bucket_from_another_gateway(store_dir, endpoint: str, bucket: str, fill) -> None:
    """What another gateway leaves in the bucket: `fill(store)` on a store of its own, flushed."""
    other = Store.open(str(store_dir), capacity=1 << 30)

    async def run():
        up = make_uploader(other, endpoint, bucket)
        await up.start()
        try:
            fill(other)
            assert await up.flush(timeout=60)
        finally:
            await up.stop()
    try:
        asyncio.run(run())
    finally:
        other.close()


def rename(store, old: str, new: str) -> None:
    oh, _, on = old.rpartition("/")
    nh, _, nn = new.rpartition("/")
    store.rename(mkdirs(store, oh), on.encode(), mkdirs(store, nh), nn.encode())
    store.sync()


def remove(store, path: str) -> None:
    head, _, name = path.rpartition("/")
    store.remove(mkdirs(store, head), name.encode())
    store.sync()


def objects(client: Boto3ObjectClient, prefix: str = "") -> dict[str, int]:
    return {o.key: o.size for o in client.list_objects(prefix)}


def object_sha(client: Boto3ObjectClient, key: str) -> str:
    body = client._s3.get_object(Bucket=client.bucket, Key=key)["Body"].read()
    return hashlib.sha256(body).hexdigest()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload(n: int, seed: int = 0) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


async def wait_for(pred, timeout: float = 30.0, interval: float = 0.05):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if loop.time() > deadline:
            raise AssertionError("condition not reached within %.0f s" % timeout)
        await asyncio.sleep(interval)


def pytest_collection_modifyitems(items):
    # a hang is a failure with a traceback, not a stuck CI job (pytest-timeout)
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600 if os.environ.get("CKPTGW_LONG") == "1" else 240))


def kill_uploader_when(tmp_path, args: list[str], ready, what: str) -> None:
    """Run uploader_proc.py (its `args`: store dir, endpoint, bucket, byte rate[, stall file])
    in a subprocess until `ready()` holds, then kill -9 it: the crash-safety tests' one way of
    killing the uploader at a chosen point. `what`: the failure message if it never gets there."""
    import signal
    import subprocess
    import time
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(tmp_path / "uploader.log", "w") as log:
        proc = subprocess.Popen([sys.executable, os.path.join(here, "uploader_proc.py"), *args],
                                stdout=log, stderr=log, env=env)
        try:
            deadline = time.monotonic() + 60
            while not ready():
                assert proc.poll() is None, open(tmp_path / "uploader.log").read()
                assert time.monotonic() < deadline, what
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
