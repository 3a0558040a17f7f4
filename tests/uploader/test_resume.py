"""Crash safety: kill -9 mid multipart upload, restart, resume from the recorded UploadId."""
import asyncio
from urllib.parse import parse_qs

from cache.store import Store
from tests.uploader.conftest import (SMALL_PART, kill_uploader_when, make_uploader, object_sha, objects, payload,
                                     s3_settings, sha)
from testkit.storefiles import write_file
from uploader.objectclient import Boto3ObjectClient


def _part_number(query: str) -> int:
    return int(parse_qs(query)["partNumber"][0])


def test_multipart_resumes_after_kill_9_and_orphans_are_aborted(moto, proxy, bucket, tmp_path):
    nparts = 12
    data = payload(nparts * SMALL_PART, 42)
    store_dir = str(tmp_path / "store")
    store = Store.open(store_dir, capacity=1 << 30)
    write_file(store, "ck/model.pt", data)
    store.close()

    kill_uploader_when(tmp_path, [store_dir, proxy.endpoint, bucket, str(3 * SMALL_PART)],
                       lambda: len([r for r in proxy.requests("PUT")
                                    if "partNumber" in r.query and r.status == 200]) >= 4,
                       "the uploader did not get going")
    sent_first = {r.query for r in proxy.requests("PUT") if "partNumber" in r.query and r.status == 200}

    # a multipart upload under our prefix that no job knows: aborted at start
    client = Boto3ObjectClient(s3_settings(moto.endpoint, bucket))
    orphan = client.create_multipart_upload("gw/stray", metadata={})

    store = Store.open(store_dir, capacity=1 << 30)
    try:
        remote = store.remote_info(store.lookup(store.lookup(1, b"ck").ino, b"model.pt").ino)
        # the parts are noted lazily (Store.note_parts), each with the next batch or LAZY_DELAY
        # after it: at 3 parts a second, all but the last one sent are recorded by the kill
        assert remote.upload_id and len(remote.parts) >= 3
        n_before = len(proxy.records)

        async def main():
            up = make_uploader(store, proxy.endpoint, bucket)
            await up.start()
            try:
                assert await up.flush(timeout=120)
                return up.status()
            finally:
                await up.stop()

        status = asyncio.run(main())
    finally:
        store.close()
    second = [r for r in proxy.records[n_before:] if r.method == "PUT" and "partNumber" in r.query
              and r.status == 200]
    assert status["parts_resumed"] >= 3
    assert len(second) == nparts - status["parts_resumed"]        # kept parts are not sent again
    recorded = {int(n) for n, _, _ in remote.parts}
    assert not {_part_number(r.query) for r in second} & recorded  # recorded parts never re-sent
    assert recorded <= {_part_number(q) for q in sent_first}
    assert status["orphans_aborted"] == 1
    assert [u.upload_id for u in client.list_multipart_uploads("gw/")] == []
    assert orphan
    assert objects(client, "gw/ck/") == {"gw/ck/": 0, "gw/ck/model.pt": len(data)}
    assert object_sha(client, "gw/ck/model.pt") == sha(data)


def test_an_upload_aborted_behind_our_back_is_restarted(moto, proxy, bucket, store):
    """Somebody aborts our multipart upload mid-way (moto then answers UploadPart with 500,
    S3 with NoSuchUpload): the uploader notices and starts a new upload."""
    import asyncio as aio

    from tests.uploader.conftest import wait_for
    data = payload(6 * SMALL_PART, 43)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, bytes_per_second=2 * SMALL_PART,
                           burst_seconds=0.1, max_concurrency=1)
        await up.start()
        try:
            ino = write_file(store, "victim", data)
            await up.flush(wait=False)
            await wait_for(lambda: up.file_state(ino).get("bytes_done", 0) > 0, timeout=30, interval=0.01)
            uid = store.remote_info(ino).upload_id
            up.client.abort_multipart_upload("gw/victim", uid)
            assert await up.flush(timeout=120)
            return up, uid
        finally:
            await up.stop()

    up, uid = aio.run(main())
    assert object_sha(up.client, "gw/victim") == sha(data)
    assert up.client.list_multipart_uploads("gw/") == []
