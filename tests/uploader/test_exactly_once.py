"""Issue 38, exactly once: an upload S3 accepted but the store never recorded (kill -9 between
the PUT's or CompleteMultipartUpload's answer and `mark_uploaded`, or a reply lost on the way
back) is adopted by the next attempt, not sent again: the key keeps one version. The next
attempt HEADs the key only when its job's durable note (`sent_seq`) says an attempt at the same
data sequence went before it; it adopts only an object of this store, inode, generation and data
sequence with the local bytes' size and checksum. Anything else at the key: uploaded as before.

The kill lands in the window on purpose: the uploader subprocess (uploader_proc.py) has a
`mark_uploaded` that never returns, and is killed once it was called. Versioned buckets count
the PUTs that stuck (the HA failover test's `repeated`).
"""
import asyncio

import pytest

from cache.api import DataState
from cache.store import Store
from tests.uploader.conftest import (SMALL_PART, kill_uploader_when, make_uploader, object_sha, payload,
                                     s3_settings, sha, uploader_settings)
from testkit.storefiles import write_file
from uploader.keys import SEQ_META, STORE_META
from uploader.objectclient import Boto3ObjectClient, ThrottledError, TransientError, checksum_b64
from uploader.service import Uploader
from uploader.worker import COPY_SENT, SENT_SEQ


def _client(moto, bucket) -> Boto3ObjectClient:
    client = Boto3ObjectClient(s3_settings(moto.endpoint, bucket))
    client._s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return client


def _versions(client, key: str) -> list[dict]:
    resp = client._s3.list_object_versions(Bucket=client.bucket, Prefix=key)
    return [v for v in resp.get("Versions", []) if v["Key"] == key]


def _kill_before_record(proxy, bucket, store_dir, tmp_path) -> str:
    """Run the uploader over the store until it calls mark_uploaded (S3 has the object), then
    kill -9 it. Returns what it was about to record."""
    stall = tmp_path / "stalled"
    kill_uploader_when(tmp_path, [store_dir, proxy.endpoint, bucket, str(1 << 30), str(stall)],
                       lambda: stall.exists() and stall.read_text().endswith("\n"),
                       "the upload did not reach mark_uploaded")
    return stall.read_text()


def _restart_and_drain(store, proxy, bucket) -> dict:
    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            assert await up.flush(timeout=120)
            return up.status()
        finally:
            await up.stop()
    return asyncio.run(main())


def _sends_to(records, key: str) -> list:
    """PUTs (PutObject, UploadPart) and POSTs (Create/CompleteMultipartUpload) on `key`."""
    path = f"/{key}"
    return [r for r in records if r.method in ("PUT", "POST") and r.path.endswith(path)]


def _lose_first_put_reply(proxy, key: str) -> list:
    """The proxy drops the answer to the first PUT on `key` (S3 applied it); the list returned
    notes it."""
    lost: list = []

    def drop(method, path, head):
        if method == "PUT" and path.endswith("/" + key) and not lost:
            lost.append(path)
            raise ConnectionResetError("reply lost")
        return head

    proxy.proxy.rewrite_head = drop
    return lost


def _ino(store, path: str) -> int:
    ino = 1
    for part in path.split("/"):
        ino = store.lookup(ino, part.encode()).ino
    return ino


def test_regression_a_put_that_reached_s3_before_a_crash_is_adopted_not_sent_again(moto, proxy, bucket, tmp_path):
    client = _client(moto, bucket)
    data = payload(10_000, 38)
    store_dir = str(tmp_path / "store")
    store = Store.open(store_dir, capacity=1 << 30)
    write_file(store, "run/shard-00025", data)
    store.close()

    _kill_before_record(proxy, bucket, store_dir, tmp_path)
    key = "gw/run/shard-00025"
    assert len(_versions(client, key)) == 1                  # S3 took it...

    store = Store.open(store_dir, capacity=1 << 30)
    try:
        ino = _ino(store, "run/shard-00025")
        assert store.remote_info(ino).etag is None            # ...the store never heard
        n_before = len(proxy.records)
        _restart_and_drain(store, proxy, bucket)
        versions = _versions(client, key)
        assert len(versions) == 1, versions                   # exactly once
        assert _sends_to(proxy.records[n_before:], key) == []  # one HEAD, no bytes
        remote = store.remote_info(ino)
        assert (remote.etag, remote.version_id) == (versions[0]["ETag"], versions[0]["VersionId"])
        assert remote.checksum and remote.checksum.startswith("crc32:")
        assert store.getattr(ino).data_state == DataState.CLEAN
        assert object_sha(client, key) == sha(data)
    finally:
        store.close()


@pytest.mark.parametrize("note", ["kept", "dropped"])
def test_regression_a_completed_multipart_upload_before_a_crash_is_adopted_not_sent_again(
        moto, proxy, bucket, tmp_path, note):
    """kept: the job's note makes the next attempt HEAD first. dropped (a job queued by an
    older version, no note): the recorded upload id is unknown to S3 (ListParts: NoSuchUpload,
    it was completed), so the attempt HEADs before it starts over."""
    client = _client(moto, bucket)
    data = payload(3 * SMALL_PART + 123, 39)
    store_dir = str(tmp_path / "store")
    store = Store.open(store_dir, capacity=1 << 30)
    write_file(store, "run/model.pt", data)
    store.close()

    _kill_before_record(proxy, bucket, store_dir, tmp_path)
    key = "gw/run/model.pt"
    assert len(_versions(client, key)) == 1

    store = Store.open(store_dir, capacity=1 << 30)
    try:
        ino = _ino(store, "run/model.pt")
        assert store.remote_info(ino).upload_id and not store.remote_info(ino).etag
        [(job_id, job)] = [(i, j) for i, j in store.queue_list(1 << 30) if j.get("ino") == ino]
        assert job[SENT_SEQ] == store.getattr(ino).data_seq
        if note == "dropped":
            del job[SENT_SEQ]
            store.queue_update(job_id, job)
            store.sync()
        n_before = len(proxy.records)
        _restart_and_drain(store, proxy, bucket)
        versions = _versions(client, key)
        assert len(versions) == 1, versions
        assert _sends_to(proxy.records[n_before:], key) == []
        remote = store.remote_info(ino)
        assert (remote.etag, remote.version_id) == (versions[0]["ETag"], versions[0]["VersionId"])
        assert remote.upload_id is None and remote.checksum.endswith("-4")
        assert store.getattr(ino).data_state == DataState.CLEAN
        assert client.list_multipart_uploads("gw/") == []
        assert object_sha(client, key) == sha(data)
    finally:
        store.close()


@pytest.mark.parametrize("other", ["store", "data_seq"])
def test_an_object_at_the_key_not_from_this_upload_is_replaced_by_it(moto, proxy, bucket, tmp_path, other):
    """The crash as above, then the key gets an object with the same bytes but another store's
    identity (another gateway) or another data sequence of the file: not this upload's, so it
    is sent."""
    client = _client(moto, bucket)
    data = payload(10_000, 40)
    store_dir = str(tmp_path / "store")
    store = Store.open(store_dir, capacity=1 << 30)
    write_file(store, "run/shard-1", data)
    store.close()
    _kill_before_record(proxy, bucket, store_dir, tmp_path)
    key = "gw/run/shard-1"
    head = client.head_object(key)
    meta = dict(head.metadata)
    if other == "store":
        meta[STORE_META] = "0" * len(meta[STORE_META])
    else:
        meta[SEQ_META] = str(int(meta[SEQ_META]) + 1)
    client.put_object(key, data, metadata=meta, checksum=checksum_b64("CRC32", data))

    store = Store.open(store_dir, capacity=1 << 30)
    try:
        ino = _ino(store, "run/shard-1")
        n_before = len(proxy.records)
        _restart_and_drain(store, proxy, bucket)
        assert len([r for r in _sends_to(proxy.records[n_before:], key) if r.method == "PUT"]) == 1
        versions = _versions(client, key)
        assert len(versions) == 3
        latest = client.head_object(key)
        assert latest.metadata[STORE_META] == store.instance_id.hex()
        assert latest.metadata[SEQ_META] == str(store.getattr(ino).data_seq)
        assert store.remote_info(ino).etag == latest.etag
        [newest] = [v for v in versions if v["IsLatest"]]
        assert store.remote_info(ino).version_id == newest["VersionId"] == latest.version_id
        assert object_sha(client, key) == sha(data)
    finally:
        store.close()


def test_regression_a_put_whose_reply_was_lost_is_adopted_by_its_retry(moto, proxy, bucket, store):
    """S3 stored the PUT, its answer never came back (the connection dropped): the gate's
    retry HEADs first and records that object instead of storing a second one."""
    client = _client(moto, bucket)
    key = "gw/run/lost-reply"
    lost = _lose_first_put_reply(proxy, key)
    data = payload(5000, 41)
    ino = write_file(store, "run/lost-reply", data)
    _restart_and_drain(store, proxy, bucket)
    assert lost
    versions = _versions(client, key)
    assert len(versions) == 1, versions
    assert len([r for r in proxy.records if r.method == "PUT" and r.path.endswith("/" + key)]) == 1
    remote = store.remote_info(ino)
    assert (remote.etag, remote.version_id) == (versions[0]["ETag"], versions[0]["VersionId"])
    assert store.getattr(ino).data_state == DataState.CLEAN


class _FirstPutFails:
    """The ObjectClient, but the first PutObject of `key` fails with `err`, after S3 stored it
    (`applied`) or before; counts HEADs."""

    def __init__(self, inner, key: str, err, applied: bool):
        self.inner, self.key, self.err, self.applied = inner, key, err, applied
        self.failed = False
        self.heads: list[str] = []
        self.puts = 0               # PutObject calls on `key`

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_object(self, key, *args, **kwargs):
        self.puts += key == self.key
        if key == self.key and not self.failed:
            self.failed = True
            if self.applied:
                self.inner.put_object(key, *args, **kwargs)
            raise self.err
        return self.inner.put_object(key, *args, **kwargs)

    def head_object(self, key):
        self.heads.append(key)
        return self.inner.head_object(key)


@pytest.mark.parametrize("case", ["throttled", "timeout-after-store", "500-not-stored"])
def test_regression_a_retried_put_heads_only_after_an_ambiguous_failure_and_through_the_gate(
        moto, bucket, store, case):
    """553abfe's retry HEAD ran inside the PutObject's gate call on every retry: a second
    request on one request token, outside the rate limit (under 503 SlowDown every retry was
    HEAD + PUT). A throttle says nothing was stored: no HEAD. A timeout or a 500 may have
    stored it: one HEAD, gated (its own token, counted as HeadObject), then adopt or send."""
    client = _client(moto, bucket)
    key = "gw/run/retried"
    err, applied = {"throttled": (ThrottledError("SlowDown", "reduce your request rate", 503), False),
                    "timeout-after-store": (TransientError("ReadTimeoutError", "read timed out"), True),
                    "500-not-stored": (TransientError("InternalError", "", 500), False)}[case]
    failing = _FirstPutFails(client, key, err, applied)
    data = payload(5000, 42)
    ino = write_file(store, "run/retried", data)

    async def main():
        up = Uploader(store, failing, uploader_settings(), s3=s3_settings(moto.endpoint, bucket))
        await up.start()
        try:
            assert await up.flush(timeout=60)
            return up.counters
        finally:
            await up.stop()

    counters = asyncio.run(main())
    assert failing.failed
    assert failing.heads.count(key) == (0 if case == "throttled" else 1)
    assert counters.requests["HeadObject"] == len(failing.heads)     # every HEAD went through the gate
    versions = _versions(client, key)
    assert len(versions) == 1, versions
    assert failing.puts == (1 if case == "timeout-after-store" else 2)   # adopted, or sent again
    remote = store.remote_info(ino)
    assert (remote.etag, remote.version_id) == (versions[0]["ETag"], versions[0]["VersionId"])
    assert store.getattr(ino).data_state == DataState.CLEAN
    assert object_sha(client, key) == sha(data)


@pytest.mark.parametrize("size", [5000, 3 * SMALL_PART])
@pytest.mark.parametrize("window", ["reply-lost", "crash-before-rekey"])
def test_regression_a_move_whose_copy_reached_s3_is_not_copied_again(moto, proxy, bucket, store, window, size):
    """A rename's CopyObject that S3 applied: its reply lost (the gate's retry HEADs the new key
    first), or the attempt cut between the copy and the re-key (the job's durable `copy_sent`
    note: the next attempt HEADs the new key first). Either way the record is re-keyed to that
    copy and the new key keeps one version. 3 parts: a multipart source, whose ETag a copy does
    not keep (moto), recognised by the identity metadata."""
    client = _client(moto, bucket)
    data = payload(size, 44)
    ino = write_file(store, "run/a", data)
    _restart_and_drain(store, proxy, bucket)
    src_etag = store.remote_info(ino).etag
    key = "gw/run/shard"
    lost, cut = [], []
    if window == "reply-lost":
        lost = _lose_first_put_reply(proxy, key)      # (a CopyObject is a PUT on the new key)
    else:
        rekey = store.rekey_remote

        def cut_first_rekey(*args):
            if not cut:
                # what a kill -9 here leaves: the store's job notes the copy (synced before it)
                cut.append([j.get(COPY_SENT) for _, j in store.queue_list() if j.get("op") == "rename"])
                raise OSError("cut between the copy and the re-key")
            return rekey(*args)
        store.rekey_remote = cut_first_rekey
    run = _ino(store, "run")
    store.rename(run, b"a", run, b"shard")
    n_before = len(proxy.records)
    _restart_and_drain(store, proxy, bucket)
    assert lost or cut == [[["run/a", src_etag, "run/shard"]]]
    versions = _versions(client, key)
    assert len(versions) == 1, versions                               # exactly once
    assert len(_sends_to(proxy.records[n_before:], key)) == 1         # one CopyObject
    remote = store.remote_info(ino)
    assert (remote.key, remote.etag, remote.version_id) == ("run/shard", versions[0]["ETag"],
                                                            versions[0]["VersionId"])
    assert _versions(client, "gw/run/a")[0]["Key"] == "gw/run/a"      # (versioned: the old one's history)
    assert client.head_object("gw/run/a") is None
    assert object_sha(client, key) == sha(data)
