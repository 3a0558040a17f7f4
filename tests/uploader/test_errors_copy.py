"""Permanent errors are loud and lose nothing; big moves use UploadPartCopy."""
import asyncio

from cache.api import DataState
from tests.uploader.conftest import (SMALL_PART, make_uploader, object_sha, objects, payload, rename, s3_settings,
                                     sha, wait_for)
from testkit.storefiles import write_file
from uploader import worker
from uploader.objectclient import Boto3ObjectClient


def test_missing_bucket_is_a_permanent_error_and_data_stays_dirty(moto, store):
    name = "notyet-created"
    data = payload(3000, 5)

    async def main():
        up = make_uploader(store, moto.endpoint, name)
        up.permanent_retry_seconds = 0.5
        await up.start()
        try:
            ino = write_file(store, "p/f", data)
            await up.flush(wait=False)
            await wait_for(lambda: up.status()["permanent_error"]
                           and store.getattr(ino).data_state == DataState.DIRTY, timeout=30)
            status = up.status()
            state = store.getattr(ino).data_state
            Boto3ObjectClient(s3_settings(moto.endpoint, name))._s3.create_bucket(Bucket=name)
            assert await up.flush(timeout=60)           # retried until it worked
            return up, status, state, up.status()
        finally:
            await up.stop()

    up, status, state, after = asyncio.run(main())
    assert "NoSuchBucket" in status["permanent_error"] and status["permanent_errors"] >= 1
    assert state == DataState.DIRTY
    assert status["queued_uploads"] == 1
    assert after["permanent_error"] is None
    assert object_sha(up.client, "gw/p/f") == sha(data)


def test_move_above_the_copy_limit_uses_upload_part_copy(moto, bucket, store, monkeypatch):
    monkeypatch.setattr(worker, "S3_MAX_COPY", SMALL_PART)      # pretend 256 KiB is 5 GiB
    monkeypatch.setattr(worker, "COPY_PART", SMALL_PART)
    data = payload(3 * SMALL_PART + 5, 6)

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "big", data)
            assert await up.flush(timeout=60)
            rename(store, "big", "moved")
            assert await up.flush(timeout=60)
            return up, up.status()
        finally:
            await up.stop()

    up, status = asyncio.run(main())
    assert status["requests"]["UploadPartCopy"] == 4 and "CopyObject" not in status["requests"]
    assert objects(up.client, "gw/") == {"gw/moved": len(data)}
    assert object_sha(up.client, "gw/moved") == sha(data)
    assert up.client.head_object("gw/moved").metadata["uid"] == "1000"
