"""Issue 14 point 4 end to end: a file made through NFS by a whole-file COPY or CLONE of a
file whose object is already in S3 is mirrored by a server-side S3 copy of that object.

A real `ckptgw serve` (uploader on) whose S3 is moto over HTTP behind the fault proxy (no
faults: it only records the requests), driven by the project's NFSv4.2 client over TCP.
The bucket is read straight at moto with boto3. That a destination was made by a copy
and not by sending its bytes is told twice: by the gateway's own `ckptgw status`
counters (uploads_copied, S3 requests by operation, bytes uploaded) and on the wire (the
requests that wrote the destination's key carried no body). The uploader-level twins,
with the store's copy_range called directly, are in tests/uploader/test_copy_upload.py.
"""
from __future__ import annotations

import asyncio
import itertools
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import boto3  # noqa: E402 (a dependency of ckptgw: missing fails, it does not skip)

from nfsd.xdr.nfs4 import (  # noqa: E402
    FATTR4_FILEID, FATTR4_TIME_MODIFY, OP_CLONE, OP_COPY, OP_PUTFH, OP_SAVEFH, CLONE4args, COPY4args,
    PUTFH4args, UNSTABLE4)
from testkit.appliance_live import LiveDaemon  # noqa: E402
from testkit.nfsclient import check, op  # noqa: E402
from tests.nfsd.conftest import run_client  # noqa: E402
from testkit.faultproxy import ThreadedFaultProxy  # noqa: E402
from tests.support.fixtures import moto_server  # noqa: E402,F401 (fixture)
from uploader.keys import GEN_META, INO_META, SEQ_META, mtime_str  # noqa: E402

PREFIX = "gw/"
SIZE = 200_001                 # one PUT; not a multiple of the clone block, so CLONE ends at EOF
pytestmark = pytest.mark.timeout(120)
_buckets = itertools.count()


# ---- S3 (moto), the recording proxy, one gateway for the module ------------------------------

@pytest.fixture(scope="module")
def s3(moto_server):
    return boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def proxy(moto_server):
    p = ThreadedFaultProxy(moto_server.port)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def bucket(s3):
    name = f"e2e-copy-{next(_buckets)}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, proxy, bucket):
    """`ckptgw serve` with a settle window longer than any test: a file goes to S3 only when
    the test flushes, so the counters between two flushes count that test's files alone."""
    d = LiveDaemon(tmp_path_factory.mktemp("gw"), "--s3-endpoint", proxy.endpoint, "--s3-bucket", bucket,
                   "--s3-prefix", PREFIX, "--s3-access-key", "testing", "--s3-secret-key", "testing",
                   "--s3-addressing-style", "path", "--upload-poll-interval", "0.05",
                   "--upload-settle", "600")
    d.start()
    yield d
    code = d.stop()
    d.close()
    faults = [ln for ln in d.read_log().splitlines() if "Traceback" in ln or "SERVERFAULT" in ln]
    assert code == 0 and not faults, d.read_log()[-4000:]


def flush(gw: LiveDaemon) -> dict:
    """`ckptgw flush --wait` (asserted to succeed); then the uploader's counters."""
    r = gw.cli("flush", "--wait", "--timeout", "60")
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
    return gw.cli_json("status")["upload"]


def since(before: dict, after: dict) -> dict:
    """What the uploader did between two flushes: the counters' growth, requests by operation."""
    reqs = {k: n - before["requests"].get(k, 0) for k, n in after["requests"].items()}
    return {"requests": {k: n for k, n in reqs.items() if n},
            **{k: after[k] - before[k] for k in ("uploads_done", "uploads_copied", "bytes_uploaded",
                                                  "bytes_copied")}}


def writes_to(proxy, bucket: str, key: str) -> list[int]:
    """The body sizes of the requests that wrote `key` (PUT/POST: a PutObject carries the
    bytes, a CopyObject none)."""
    return [r.body_bytes for r in proxy.requests()
            if r.method in ("PUT", "POST") and r.path == f"/{bucket}/{key}"]


def head(s3, bucket: str, key: str) -> dict:
    return s3.head_object(Bucket=bucket, Key=key)["Metadata"]


def body(s3, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


# ---- NFS: the client's side of `cp` and `cp --reflink` ------------------------------------------

async def write_new(c, exp: bytes, name: str, data: bytes) -> None:
    """OPEN (create), WRITE unstable, COMMIT, CLOSE."""
    fh, sid = await c.open_create(exp, name)
    await c.write(fh, sid, 0, data, UNSTABLE4)
    await c.commit(fh)
    await c.close_file(fh, sid)


async def copy_new(c, exp: bytes, src: str, dst: str, how: int, then_write: bytes = b"") -> dict:
    """A new file `dst` made a whole copy of `src` by COPY (synchronous) or CLONE, count 0
    (to the source's end), optionally written into at offset 100 and committed, then
    closed. Returns the destination's fileid and mtime as the server reports them."""
    sfh, ssid = await c.open_existing(exp, src)
    dfh, dsid = await c.open_create(exp, dst)
    args = (COPY4args(ssid, dsid, 0, 0, 0, False, True, []) if how == OP_COPY
            else CLONE4args(ssid, dsid, 0, 0, 0))
    res = check(await c.compound([op(OP_PUTFH, PUTFH4args(sfh)), op(OP_SAVEFH),
                                  op(OP_PUTFH, PUTFH4args(dfh)), op(how, args)]))
    if how == OP_COPY:
        assert res.resarray[-1].value.value.cr_response.wr_count == SIZE   # all of it, at once
    if then_write:
        await c.write(dfh, dsid, 100, then_write, UNSTABLE4)
        await c.commit(dfh)
    await c.close_file(dfh, dsid)
    await c.close_file(sfh, ssid)
    return await c.getattr(dfh, attrs=(FATTR4_FILEID, FATTR4_TIME_MODIFY))


def source_in_s3(gw: LiveDaemon, s3, bucket: str, name: str, data: bytes) -> tuple[int, dict]:
    """`name` written through NFS and flushed: its object holds `data`. Returns its fileid
    and the counters after the flush."""
    async def run(c):
        exp = await c.lookup_path("/checkpoints")
        await write_new(c, exp, name, data)
        fh = await c.lookup_path(f"/checkpoints/{name}")
        return (await c.getattr(fh, attrs=(FATTR4_FILEID,)))["fileid"]
    ino = run_client(gw.nfs_port, run, minorversion=2)
    counters = flush(gw)
    assert body(s3, bucket, PREFIX + name) == data
    return ino, counters


def mtime_meta(attrs: dict) -> str:
    t = attrs["mtime"]
    return mtime_str(t.seconds * 1_000_000_000 + t.nseconds)


# ---- the scenarios -------------------------------------------------------------------------------

def test_copy_and_clone_of_an_uploaded_file_are_mirrored_by_s3_copy(gateway, proxy, s3, bucket):
    data = random.Random(1).randbytes(SIZE)
    src_ino, before = source_in_s3(gateway, s3, bucket, "src", data)

    async def run(c):
        exp = await c.lookup_path("/checkpoints")
        return {"by-copy": await copy_new(c, exp, "src", "by-copy", OP_COPY),
                "by-clone": await copy_new(c, exp, "src", "by-clone", OP_CLONE)}
    made = run_client(gateway.nfs_port, run, minorversion=2)
    did = since(before, flush(gateway))

    # the gateway copied both in S3 and sent none of their bytes
    assert did["uploads_copied"] == 2 and did["uploads_done"] == 2, did
    assert did["requests"].get("CopyObject") == 2, did
    assert not {"PutObject", "UploadPart", "CreateMultipartUpload"} & did["requests"].keys(), did
    assert did["bytes_uploaded"] == 0 and did["bytes_copied"] == 2 * SIZE, did
    for name, attrs in made.items():
        key = PREFIX + name
        assert writes_to(proxy, bucket, key) == [0], (name, writes_to(proxy, bucket, key))  # one bodiless write
        assert body(s3, bucket, key) == data, name
        meta = head(s3, bucket, key)
        # its own identity (the destination's inode and mtime), not the source's
        assert meta[INO_META] == str(attrs["fileid"]) != str(src_ino), (name, meta)
        assert meta["mtime"] == mtime_meta(attrs), (name, meta)
        assert GEN_META in meta and SEQ_META in meta, (name, meta)
    assert head(s3, bucket, PREFIX + "src")[INO_META] == str(src_ino)     # the source keeps its own


def test_a_copy_written_into_before_the_flush_is_sent_as_bytes(gateway, proxy, s3, bucket):
    data = random.Random(2).randbytes(SIZE)
    _, before = source_in_s3(gateway, s3, bucket, "src2", data)

    async def run(c):
        exp = await c.lookup_path("/checkpoints")
        return await copy_new(c, exp, "src2", "copied-then-written", OP_COPY, then_write=b"changed")
    attrs = run_client(gateway.nfs_port, run, minorversion=2)
    did = since(before, flush(gateway))

    want = data[:100] + b"changed" + data[107:]
    key = PREFIX + "copied-then-written"
    assert body(s3, bucket, key) == want
    assert did["uploads_copied"] == 0 and "CopyObject" not in did["requests"], did
    assert did["requests"].get("PutObject") == 1 and did["bytes_uploaded"] == SIZE, did
    assert [n >= SIZE for n in writes_to(proxy, bucket, key)] == [True]   # one write, with the bytes
    assert head(s3, bucket, key)[INO_META] == str(attrs["fileid"])
