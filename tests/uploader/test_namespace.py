"""Renames and deletes are mirrored by server-side copy + delete, in order, never re-uploaded."""
import asyncio

from tests.uploader.conftest import (SMALL_PART, make_uploader, object_sha, objects, payload, remove, rename, sha,
                                     wait_for)
from testkit.storefiles import write_file
from uploader.worker import UploadProgress


def _uploads_of(proxy, name):
    """Requests that sent file data for a key containing `name` (PUT/POST with a body or create)."""
    return [r for r in proxy.requests(outcome=None) if name in r.path and r.method in ("PUT", "POST")
            and "x-id=CopyObject" not in r.query]


def test_rename_before_upload_never_sends_the_temp_name(moto, proxy, bucket, store):
    data = payload(3 * SMALL_PART, 3)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=1.0)
        await up.start()
        try:
            write_file(store, "ck/step1.pt.tmp", data)
            rename(store, "ck/step1.pt.tmp", "ck/step1.pt")      # inside the settle window
            assert await up.flush("ck", timeout=60)
            return up, up.status()
        finally:
            await up.stop()

    up, status = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/ck/": 0, "gw/ck/step1.pt": len(data)}
    assert object_sha(up.client, "gw/ck/step1.pt") == sha(data)
    assert not [r for r in proxy.requests(outcome=None) if ".tmp" in r.path]   # never in S3, not even asked
    assert status["bytes_uploaded"] == len(data)


def test_rename_after_upload_is_a_server_side_move(moto, proxy, bucket, store):
    data = payload(3 * SMALL_PART, 4)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = write_file(store, "a.bin", data)
            assert await up.flush(timeout=60)
            rename(store, "a.bin", "b.bin")
            assert await up.flush(timeout=60)
            return up, up.status(), up.file_state(ino)
        finally:
            await up.stop()

    up, status, fstate = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/b.bin": len(data)}
    assert object_sha(up.client, "gw/b.bin") == sha(data)
    assert status["bytes_uploaded"] == len(data) and status["bytes_copied"] == len(data)
    assert status["moves_done"] == 1
    assert fstate["key"] == "b.bin" and fstate["state"] == "clean"
    assert fstate["etag"] == up.client.head_object("gw/b.bin").etag


def test_rename_of_a_file_written_again_after_its_upload_never_puts_old_bytes_under_the_new_name(
        moto, proxy, bucket, store):
    """Found by tests/ha (issue 38): after a failover the survivor uploaded a client's tmp file
    before the client reclaimed it (empty: its unstable writes died with the old node); the client
    wrote it again, committed and renamed it to the shard's name, and the move copied the empty
    object there: the bucket held an empty object under an acknowledged shard's name until the
    re-upload. The move now copies only an object that holds the file's current bytes."""
    old, new = payload(2 * SMALL_PART, 16), payload(2 * SMALL_PART, 17)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        up.client._s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        await up.start()
        try:
            ino = write_file(store, "ck/shard.tmp", old)
            assert await up.flush(timeout=60)
            write_file(store, "ck/shard.tmp", new)           # written again after its upload
            rename(store, "ck/shard.tmp", "ck/shard")
            assert await up.flush(timeout=60)
            return up, up.file_state(ino)
        finally:
            await up.stop()

    up, fstate = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/ck/": 0, "gw/ck/shard": len(new)}
    versions = up.client._s3.list_object_versions(Bucket=bucket, Prefix="gw/ck/shard")
    bodies = {v["Key"]: [] for v in versions.get("Versions", [])}
    for v in versions.get("Versions", []):
        body = up.client._s3.get_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
        bodies[v["Key"]].append(sha(body))
    assert bodies["gw/ck/shard"] == [sha(new)], "old bytes were written under the new name"
    assert fstate["key"] == "ck/shard" and fstate["state"] == "clean"


def test_rename_during_multipart_upload_finishes_then_moves(moto, proxy, bucket, store):
    data = payload(8 * SMALL_PART, 5)

    async def main():
        # a slow link: ~4 parts per second
        up = make_uploader(store, proxy.endpoint, bucket, bytes_per_second=4 * SMALL_PART,
                           burst_seconds=0.25, max_concurrency=2)
        await up.start()
        try:
            ino = write_file(store, "d.bin.tmp", data)
            await up.flush(wait=False)
            await wait_for(lambda: up.file_state(ino).get("bytes_done", 0) > 0, timeout=30, interval=0.01)
            rename(store, "d.bin.tmp", "d.bin")
            assert await up.flush(timeout=60)
            return up, up.status()
        finally:
            await up.stop()

    up, status = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/d.bin": len(data)}
    assert object_sha(up.client, "gw/d.bin") == sha(data)
    assert status["bytes_uploaded"] == len(data)        # finished, not restarted
    assert status["uploads_aborted"] == 0 and status["moves_done"] == 1


def test_rename_before_any_byte_is_sent_aborts_and_restarts():
    prog = UploadProgress(ino=5, path="x.tmp", size=100, multipart=True)
    assert prog.on_namespace_change("rename") == "abort" and prog.abort_requested
    prog = UploadProgress(ino=5, path="x.tmp", size=100, multipart=True, bytes_in_flight=10)
    assert prog.on_namespace_change("rename") == "finish" and not prog.abort_requested
    prog = UploadProgress(ino=5, path="x.tmp", size=100, multipart=True, bytes_done=90)
    assert prog.on_namespace_change("unlink") == "abort"


def test_directory_rename_moves_every_object_then_file_rename_follows(moto, proxy, bucket, store):
    x, y = payload(1000, 6), payload(3 * SMALL_PART, 7)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "d1/x", x)
            write_file(store, "d1/sub/y", y)
            assert await up.flush(timeout=60)
            rename(store, "d1", "d2")
            rename(store, "d2/sub/y", "y2")          # queued behind the directory move
            assert await up.flush(timeout=60)
            return up, up.status()
        finally:
            await up.stop()

    up, status = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/d2/": 0, "gw/d2/x": len(x), "gw/d2/sub/": 0, "gw/y2": len(y)}
    assert object_sha(up.client, "gw/d2/x") == sha(x) and object_sha(up.client, "gw/y2") == sha(y)
    assert status["bytes_uploaded"] == len(x) + len(y)


def test_delete_and_replace_and_modify(moto, proxy, bucket, store):
    v1, v2, v3 = payload(2000, 8), payload(3 * SMALL_PART, 9), payload(1500, 10)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "gone", b"bye")
            write_file(store, "ck", v1)
            assert await up.flush(timeout=60)
            remove(store, "gone")
            write_file(store, "ck.tmp", v2)
            rename(store, "ck.tmp", "ck")            # replaces the uploaded ck
            write_file(store, "never", b"x")
            remove(store, "never")                   # never uploaded
            assert await up.flush(timeout=60)
            first = object_sha(up.client, "gw/ck")
            write_file(store, "ck", v3)              # modified after upload: sent again
            assert await up.flush(timeout=60)
            return up, first
        finally:
            await up.stop()

    up, first = asyncio.run(main())
    assert first == sha(v2)
    assert objects(up.client, "gw/") == {"gw/ck": len(v3)}
    assert object_sha(up.client, "gw/ck") == sha(v3)
    # never uploaded: its data is never sent, nothing is deleted (a HEAD checks ownership)
    assert {r.method for r in proxy.requests(outcome=None) if "never" in r.path} <= {"HEAD"}
    assert not _uploads_of(proxy, "ck.tmp")


def test_rename_while_parts_wait_for_rate_tokens_aborts_and_restarts(moto, proxy, bucket, store):
    data = payload(2 * SMALL_PART, 14)

    async def main():
        # 128 KiB/s with a 32 KiB bucket: the first 256 KiB part waits ~1.8 s for its tokens
        up = make_uploader(store, proxy.endpoint, bucket, bytes_per_second=SMALL_PART / 2,
                           burst_seconds=0.25, max_concurrency=1)
        await up.start()
        try:
            ino = write_file(store, "w.tmp", data)
            await up.flush(wait=False)
            # the upload's progress, not only its state: the store says UPLOADING a moment
            # before the worker registers its progress (it syncs in between)
            await wait_for(lambda: "bytes_in_flight" in up.file_state(ino), timeout=30, interval=0.005)
            assert up.file_state(ino)["bytes_in_flight"] == 0
            rename(store, "w.tmp", "w")
            assert await up.flush(timeout=60)
            return up, up.status()
        finally:
            await up.stop()

    up, status = asyncio.run(main())
    assert status["uploads_aborted"] == 1 and status["moves_done"] == 0
    assert objects(up.client, "gw/") == {"gw/w": len(data)}
    assert object_sha(up.client, "gw/w") == sha(data)
    assert status["bytes_uploaded"] == len(data)
    assert not [r for r in proxy.requests(outcome=None) if "w.tmp" in r.path and "partNumber" in r.query]


def test_short_lived_files_cost_no_s3_request(moto, proxy, bucket, store):
    """Issue 15 (small-file saves through `ckptgw serve`): write tmp, rename over `final`,
    remove `final`, all before any upload. The journal jobs run after the inode is gone, so
    they cannot read its record; they record that no object was ever written for it
    (`sent: False`) and send nothing, not even the HEAD that looked for one (two or three
    botocore requests per file, which cost the gateway a third of its small-file rate).
    A file that was uploaded, then renamed and removed before its jobs ran, still has its
    object moved and deleted (its jobs say `sent`)."""
    kept = payload(2000, 11)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=30.0)
        await up.start()
        try:
            write_file(store, "up", kept)
            assert await up.flush("up", timeout=60)
            for i in range(5):
                write_file(store, f"tmp{i}", b"x" * 4096)
                rename(store, f"tmp{i}", "final")
                remove(store, "final")
            rename(store, "up", "up2")
            remove(store, "up2")                   # reclaimed before its jobs run
            assert await up.flush(timeout=60)
            return up
        finally:
            await up.stop()

    up = asyncio.run(main())
    assert objects(up.client, "gw/") == {}
    assert not [r for r in proxy.requests(outcome=None) if "tmp" in r.path or "final" in r.path]
    assert [r.method for r in proxy.requests(outcome=None) if r.path.endswith("/up2")]   # moved, then deleted
