"""Issue 13 at the NFS level: nfs-rs against a real `ckptgw serve` (uploader on) whose S3 is
moto over HTTP behind the fault proxy, switched off (every request 503 SlowDown) and on again.

One test per scenario of the issue (the uploader-level twins are tests/uploader/test_identity.py),
each checking the bucket straight at moto with boto3 (bytes and the ckptgw-ino identity
metadata) once S3 is back and `ckptgw flush --wait` has returned; then a checkpoint save loop
through a 30 % 503 run and an outage, reporting one line of figures per run for RELIABILITY.md.
CKPTGW_LONG=1 makes the save-loop runs longer (a 2-minute outage) and bigger.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

nfs_rs = pytest.importorskip("nfs_rs")
boto3 = pytest.importorskip("boto3")

from tests.appliance.appliance_live import LiveDaemon  # noqa: E402
from tests.e2e.nfsrs_support import connect, read_file, retrying, write_file  # noqa: E402
from tests.support.faultproxy import ThreadedFaultProxy  # noqa: E402
from tests.support.motoserver import MotoServer  # noqa: E402
from uploader.keys import INO_META  # noqa: E402

LONG = os.environ.get("CKPTGW_LONG") == "1"
PREFIX = "gw/"
pytestmark = pytest.mark.timeout(900 if LONG else 120)


# ---- S3 (moto), the proxy in front of it, the gateway, the client -------------------------

@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(moto):
    p = ThreadedFaultProxy(moto.port, seed=13)
    yield p
    p.stop()


@pytest.fixture
def s3(moto):
    """boto3 straight at moto (never through the proxy): what a job reading the bucket sees."""
    return boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def bucket(s3, request):
    name = "e2e-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def gateway(tmp_path, proxy, bucket):
    """start(*extra): `ckptgw serve` whose S3 is the proxy; stopped (exit 0 asserted) at teardown."""
    daemons: list[LiveDaemon] = []

    def start(*extra: str) -> LiveDaemon:
        d = LiveDaemon(tmp_path, "--s3-endpoint", proxy.endpoint, "--s3-bucket", bucket,
                       "--s3-prefix", PREFIX, "--s3-access-key", "testing", "--s3-secret-key", "testing",
                       "--s3-addressing-style", "path", "--s3-connect-timeout", "2",
                       "--s3-read-timeout", "5", "--upload-poll-interval", "0.05",
                       "--upload-backoff-base", "0.05", "--upload-backoff-max", "1", *extra)
        daemons.append(d)
        return d.start()
    yield start
    for d in daemons:
        code = d.stop()
        d.close()
        faults = [ln for ln in d.read_log().splitlines() if "Traceback" in ln or "SERVERFAULT" in ln]
        assert code == 0 and not faults, d.read_log()[-4000:]


@pytest.fixture
def client_of():
    clients = []

    def make(daemon: LiveDaemon):
        c = connect(daemon.nfs_port)
        clients.append(c)
        return c
    yield make
    for c in clients:
        c.close()


def s3_off(proxy) -> None:
    """S3 answers every request 503 SlowDown, as during a regional outage."""
    proxy.faults.error_rate = 1.0


def s3_on(proxy) -> None:
    proxy.clear()


def flush_wait(daemon: LiveDaemon, path: str = "", timeout: float = 60) -> float:
    """`ckptgw flush --wait` (asserted to succeed); returns how long it took."""
    t0 = time.monotonic()
    r = daemon.cli("flush", "--wait", "--timeout", str(timeout), *([path] if path else []))
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
    return time.monotonic() - t0


# ---- the bucket, read directly ---------------------------------------------------------------

def bucket_keys(s3, bucket: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def object_bytes(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def object_ino(s3, bucket: str, key: str) -> int:
    return int(s3.head_object(Bucket=bucket, Key=key)["Metadata"][INO_META])


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def writes_naming(proxy, fragment: str) -> list[str]:
    """Every request that could create an object (PUT, POST: whatever its outcome) whose key
    names `fragment`. (Reads may name it: a directory rename LISTs the old prefix.)"""
    return [f"{r.method} {r.path}?{r.query}" for r in proxy.requests(outcome=None)
            if r.method in ("PUT", "POST") and fragment in r.path]


# ---- scenario 1: mv d e; mkdir d; mv e/f d/f while uploads are behind -----------------------

def test_dir_moved_away_recreated_and_file_moved_back_during_outage(gateway, client_of, proxy, s3, bucket):
    gw = gateway()
    c = client_of(gw)
    data = payload(70_000, 1)
    retrying(c.mkdir, "d")
    write_file(c, "d/f", data)
    flush_wait(gw)
    assert object_bytes(s3, bucket, "gw/d/f") == data
    ino = c.stat("d/f").fileid

    s3_off(proxy)
    retrying(c.rename, "d", "e")
    retrying(c.mkdir, "d")
    retrying(c.rename, "e/f", "d/f")
    time.sleep(1.5)                         # the re-key jobs meet the outage and retry
    assert proxy.requests(outcome="slowdown"), "the outage was never hit"
    s3_on(proxy)
    flush_wait(gw)

    assert read_file(c, "d/f") == data
    assert bucket_keys(s3, bucket) == {"gw/d/": 0, "gw/d/f": len(data), "gw/e/": 0}
    assert object_bytes(s3, bucket, "gw/d/f") == data
    assert object_ino(s3, bucket, "gw/d/f") == ino


# ---- scenario 2: latest.pt.tmp renamed over an uploaded latest.pt ----------------------------

class BucketSampler:
    """Reads one key in full straight from moto, as often as it can, in a thread; records
    what each read found: "old", "new", "absent" or "other" (bytes of neither)."""

    def __init__(self, s3, bucket: str, key: str, old: bytes, new: bytes):
        self.s3, self.bucket, self.key = s3, bucket, key
        self.names = {sha(old): "old", sha(new): "new"}
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            body = object_bytes(self.s3, self.bucket, self.key)
            self.samples.append("absent" if body is None else self.names.get(sha(body), "other"))
            self._stop.wait(0.01)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(10)


@pytest.mark.parametrize("fault", ["off", "slow"])
def test_tmp_renamed_over_uploaded_latest_never_leaves_bucket_without_a_checkpoint(
        gateway, client_of, proxy, s3, bucket, fault):
    gw = gateway("--upload-settle", "1.0")
    c = client_of(gw)
    old, new = payload(200_000, 2), payload(300_000, 3)
    retrying(c.mkdir, "run")
    write_file(c, "run/latest.pt", old)
    flush_wait(gw)
    with BucketSampler(s3, bucket, "gw/run/latest.pt", old, new) as sampler:
        if fault == "off":
            s3_off(proxy)
        else:
            proxy.faults.latency = 0.5      # every request half a second: a slow drain
        write_file(c, "run/latest.pt.tmp", new)
        retrying(c.rename, "run/latest.pt.tmp", "run/latest.pt")
        time.sleep(2.0)                     # past the settle window, S3 still off or slow
        s3_on(proxy)
        flush_wait(gw)
        time.sleep(0.2)
    samples = sampler.samples
    assert len(samples) >= 20, samples
    assert set(samples) <= {"old", "new"}, {s: samples.count(s) for s in set(samples)}
    assert samples[0] == "old" and samples[-1] == "new"
    assert "old" not in samples[samples.index("new"):], "the bucket went back to the old checkpoint"
    assert bucket_keys(s3, bucket) == {"gw/run/": 0, "gw/run/latest.pt": len(new)}
    assert object_ino(s3, bucket, "gw/run/latest.pt") == c.stat("run/latest.pt").fileid
    assert writes_naming(proxy, "latest.pt.tmp") == []     # renamed inside the settle window


# ---- scenario 3: client-set mtimes and temp names -------------------------------------------

HOUR_NS = 3600 * 10**9


def test_future_mtime_file_is_uploaded_and_flush_wait_finishes(gateway, client_of, proxy, s3, bucket):
    """touch -d '+1 hour' (clock skew): the settle window runs on the gateway's clock, so the
    file is uploaded and `flush --wait` returns, with S3 off for a while after the setattr."""
    gw = gateway("--upload-settle", "0.5")
    c = client_of(gw)
    data = payload(50_000, 4)
    write_file(c, "skewed.pt", data)
    future = time.time_ns() + HOUR_NS
    s3_off(proxy)
    retrying(c.utime, "skewed.pt", ns=(future, future))
    assert c.stat("skewed.pt").mtime == future          # the SETATTR took
    time.sleep(1.0)
    s3_on(proxy)
    flush_wait(gw, timeout=30)
    assert object_bytes(s3, bucket, "gw/skewed.pt") == data
    assert object_ino(s3, bucket, "gw/skewed.pt") == c.stat("skewed.pt").fileid
    assert s3.head_object(Bucket=bucket, Key="gw/skewed.pt")["Metadata"]["mtime"].startswith(
        str(future // 10**9))              # s3fs metadata carries the client's mtime


def test_old_mtime_temp_file_renamed_in_settle_window_never_reaches_s3_by_its_temp_name(
        gateway, client_of, proxy, s3, bucket):
    """cp -p / rsync -t: a temp file whose mtime is a day old, renamed within the settle
    window, is uploaded only under its final name (no write ever names the temp)."""
    gw = gateway("--upload-settle", "2")
    c = client_of(gw)
    data = payload(60_000, 5)
    write_file(c, ".ckpt.pt.XXXXXX", data)
    old = time.time_ns() - 24 * HOUR_NS
    retrying(c.utime, ".ckpt.pt.XXXXXX", ns=(old, old))
    time.sleep(0.5)                          # the uploader polls; nothing is due yet
    retrying(c.rename, ".ckpt.pt.XXXXXX", "ckpt.pt")
    flush_wait(gw)
    assert writes_naming(proxy, "XXXXXX") == []
    assert bucket_keys(s3, bucket) == {"gw/ckpt.pt": len(data)}
    assert object_bytes(s3, bucket, "gw/ckpt.pt") == data
    assert c.stat("ckpt.pt").mtime == old


def test_temp_directory_never_puts_a_marker(gateway, client_of, proxy, s3, bucket):
    """mkdir step_000100.tmp; save into it; mv it to step_000100 (within the settle window,
    S3 off meanwhile): no write ever names the temp directory; the final one is complete."""
    gw = gateway("--upload-settle", "2")
    c = client_of(gw)
    shards = {f"shard{i}.pt": payload(20_000 + i, 10 + i) for i in range(3)}
    s3_off(proxy)
    retrying(c.mkdir, "step_000100.tmp")
    for name, data in shards.items():
        write_file(c, f"step_000100.tmp/{name}", data)
    retrying(c.rename, "step_000100.tmp", "step_000100")
    time.sleep(1.0)
    s3_on(proxy)
    flush_wait(gw)
    assert writes_naming(proxy, "step_000100.tmp") == []
    keys = bucket_keys(s3, bucket)
    assert [k for k in keys if ".tmp" in k] == []
    assert {k for k in keys if k != "gw/step_000100/"} == {f"gw/step_000100/{n}" for n in shards}
    for name, data in shards.items():
        assert object_bytes(s3, bucket, f"gw/step_000100/{name}") == data


# ---- scenario 4: an imported object deleted through NFS -------------------------------------

def test_imported_object_deleted_through_nfs_is_deleted_in_s3_and_not_reimported(
        gateway, client_of, proxy, s3, bucket):
    for name in ("a.bin", "b.bin"):
        s3.put_object(Bucket=bucket, Key=f"gw/imp/{name}", Body=name.encode() * 1000)
    gw = gateway()
    first = gw.cli_json("import")
    c = client_of(gw)
    assert first["imported"] == 2 and sorted(c.listdir("imp")) == ["a.bin", "b.bin"], first
    s3_off(proxy)
    retrying(c.remove, "imp/a.bin")
    time.sleep(1.0)
    s3_on(proxy)
    flush_wait(gw)
    assert "gw/imp/a.bin" not in bucket_keys(s3, bucket)
    again = gw.cli_json("import")
    assert again["imported"] == 0 and sorted(c.listdir("imp")) == ["b.bin"], again
    flush_wait(gw)
    assert "gw/imp/a.bin" not in bucket_keys(s3, bucket)
    assert object_bytes(s3, bucket, "gw/imp/b.bin") == b"b.bin" * 1000
    assert read_file(c, "imp/b.bin") == b"b.bin" * 1000
