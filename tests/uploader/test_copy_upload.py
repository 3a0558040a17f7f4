"""Issue 14 point 4: a file made by a whole-file COPY/CLONE (store.copy_range) of a file
whose object is in S3 is mirrored by a server-side S3 copy of that object, carrying the
copy's own identity; a copy written since, or whose source object was replaced, is sent
as bytes. Against moto over HTTP; the uploader's per-operation request counters say
which requests carried the file."""
import asyncio

import pytest

from cache.api import ROOT_INO, DataState
from uploader.keys import GEN_META, INO_META, SEQ_META
from uploader.objectclient import checksum_b64
from tests.uploader.conftest import SMALL_PART, make_uploader, object_sha, payload, sha
from testkit.storefiles import write_file


def _copy_file(store, src: int, name: bytes, size: int) -> int:
    """What a client's `cp --reflink` does through COPY/CLONE: a new file, the whole source
    copied into it in the store, committed."""
    dst = store.create(ROOT_INO, name, 0o644, 1000, 1000)[0].ino
    store.copy_range(src, dst, 0, 0, size)
    store.commit(dst)
    store.sync()
    return dst


def _run(store, endpoint, bucket, data: bytes, between):
    """Upload a source file, then `between(up, src)` (which makes the copy), then flush:
    returns the uploader and the request counts of the second flush alone."""
    async def main():
        up = make_uploader(store, endpoint, bucket)
        await up.start()
        try:
            src = write_file(store, "src", data)
            assert await up.flush(timeout=60)
            before = dict(up.counters.requests)
            dst = between(up, src)
            assert await up.flush(timeout=60)
            after = {op: n - before.get(op, 0) for op, n in up.counters.requests.items()}
            return up, dst, {op: n for op, n in after.items() if n}
        finally:
            await up.stop()
    return asyncio.run(main())


@pytest.mark.parametrize("size", [5000, 3 * SMALL_PART], ids=["put-source", "multipart-source"])
def test_a_whole_copy_is_uploaded_by_copyobject_with_its_own_identity(moto, bucket, store, size):
    data = payload(size, 7)
    up, dst, reqs = _run(store, moto.endpoint, bucket, data, lambda up, src: _copy_file(store, src, b"dst", size))
    assert reqs.get("CopyObject") == 1
    assert not {"PutObject", "UploadPart", "CreateMultipartUpload"} & reqs.keys(), reqs
    assert up.counters.uploads_copied == 1
    assert object_sha(up.client, "gw/dst") == sha(data)
    a = store.getattr(dst)
    meta = up.client.head_object("gw/dst").metadata
    assert (meta[INO_META], meta[GEN_META], meta[SEQ_META]) == (str(dst), str(a.gen), str(a.data_seq))
    assert a.data_state == DataState.CLEAN
    assert up.client.head_object("gw/src").metadata[INO_META] != str(dst)   # the source keeps its own


def test_a_copy_written_after_the_copy_is_sent_as_bytes(moto, bucket, store):
    data = payload(5000, 8)

    def copy_then_write(up, src):
        dst = _copy_file(store, src, b"dst", len(data))
        store.write(dst, 100, b"changed")
        store.commit(dst)
        store.sync()
        return dst

    up, dst, reqs = _run(store, moto.endpoint, bucket, data, copy_then_write)
    assert reqs.get("PutObject") == 1 and "CopyObject" not in reqs, reqs
    assert object_sha(up.client, "gw/dst") == sha(data[:100] + b"changed" + data[107:])


def test_a_copy_whose_source_object_was_replaced_falls_back_to_put(moto, bucket, store):
    """Another writer replaced the source's object in S3 after it was uploaded: the
    ETag-pinned copy is refused and the file's own bytes are sent."""
    data = payload(5000, 9)

    def copy_then_replace_source(up, src):
        dst = _copy_file(store, src, b"dst", len(data))
        other = b"somebody else's"
        up.client.put_object("gw/src", other, metadata={}, checksum=checksum_b64(up.client.checksum_algorithm, other))
        return dst

    up, dst, reqs = _run(store, moto.endpoint, bucket, data, copy_then_replace_source)
    assert reqs.get("PutObject") == 1 and "CopyObject" not in reqs, reqs
    assert object_sha(up.client, "gw/dst") == sha(data)
    assert store.getattr(dst).data_state == DataState.CLEAN
