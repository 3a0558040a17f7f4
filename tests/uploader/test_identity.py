"""Issue 13, S3 side: the bucket never lacks the last good version of a file, and every S3
action names the object (ETag / identity) it means. One test per scenario of the issue,
against moto over HTTP behind the fault proxy (switched off and on for outages)."""
import asyncio
import errno
import threading

import pytest

from cache.api import ROOT_INO, DataState, StoreError
from tests.uploader.conftest import (SMALL_PART, make_uploader, object_sha, objects, payload, remove, rename, sha,
                                     wait_for)
from testkit.storefiles import mkdirs, write_file


def _outage(proxy, on: bool) -> None:
    """S3 answers every request 503 SlowDown (on) or works again (off)."""
    if on:
        proxy.faults.error_rate = 1.0
    else:
        proxy.clear()


def test_mv_dir_mkdir_mv_back_during_outage_keeps_the_object(moto, proxy, bucket, store):
    """mv d e; mkdir d; mv e/f d/f while S3 is down: after it recovers d/f is CLEAN *and*
    its object is at gw/d/f with its bytes (before: CLEAN with no object at all)."""
    data = payload(5000, 1)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = write_file(store, "d/f", data)
            assert await up.flush(timeout=60)
            _outage(proxy, True)
            rename(store, "d", "e")
            store.mkdir(ROOT_INO, b"d", 0o755, 1000, 1000)
            rename(store, "e/f", "d/f")
            await asyncio.sleep(1.0)              # the jobs meet the outage and retry
            _outage(proxy, False)
            assert await up.flush(timeout=60)
            return up, up.file_state(ino)
        finally:
            await up.stop()

    up, fstate = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/d/": 0, "gw/d/f": len(data), "gw/e/": 0}
    assert object_sha(up.client, "gw/d/f") == sha(data)
    assert fstate["state"] == "clean" and fstate["key"] == "d/f"
    assert fstate["etag"] == up.client.head_object("gw/d/f").etag


class _Watcher:
    """Polls one key straight at moto (not through the proxy) and records every moment it
    found no object there."""

    def __init__(self, client, key: str):
        self.client, self.key = client, key
        self.missing: list[int] = []
        self.seen: set[str] = set()
        self.polls = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set() and self.polls < 20000:
            info = self.client.head_object(self.key)
            self.polls += 1
            if info is None:
                self.missing.append(self.polls)
            else:
                self.seen.add(info.etag)
            self._stop.wait(0.005)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(10)


@pytest.mark.parametrize("tmp_uploaded", ["settling", "uploaded", "uploading"],
                         ids=["tmp-settling", "tmp-uploaded", "tmp-uploading"])
def test_rename_over_uploaded_file_never_leaves_s3_without_either(moto, proxy, bucket, store, tmp_uploaded):
    """latest.pt.tmp renamed over an uploaded latest.pt: at every moment S3 holds the old
    or the new checkpoint under latest.pt (the proxy shows no DELETE of it at all, and a
    watcher polling moto directly never finds the key empty)."""
    old = payload(3000, 2)
    # uploading: a multipart upload on a slow link, renamed over once bytes are on the wire
    # (it finishes under the temporary name, then the move's copy replaces latest.pt)
    new = payload(8 * SMALL_PART if tmp_uploaded == "uploading" else 4000, 3)
    direct = make_uploader(store, moto.endpoint, bucket).client
    slow = dict(bytes_per_second=4 * SMALL_PART, burst_seconds=0.25, max_concurrency=2)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=1.0,
                           **(slow if tmp_uploaded == "uploading" else {}))
        await up.start()
        try:
            write_file(store, "run/latest.pt", old)
            assert await up.flush(timeout=60)
            with _Watcher(direct, "gw/run/latest.pt") as w:
                tmp = write_file(store, "run/latest.pt.tmp", new)
                if tmp_uploaded == "uploaded":
                    assert await up.flush("run/latest.pt.tmp", timeout=60)
                elif tmp_uploaded == "uploading":
                    await up.flush("run/latest.pt.tmp", wait=False)
                    await wait_for(lambda: up.file_state(tmp).get("bytes_done", 0) > 0, timeout=30,
                                   interval=0.01)
                rename(store, "run/latest.pt.tmp", "run/latest.pt")
                await asyncio.sleep(0.5)           # inside the settle window
                assert await up.flush(timeout=60)
            return up, w
        finally:
            await up.stop()

    up, w = asyncio.run(main())
    assert w.polls >= 1 and w.missing == []      # a sample; the DELETE check below is exact
    assert not [r for r in proxy.requests("DELETE") if r.path.endswith("/gw/run/latest.pt")]
    assert objects(up.client, "gw/run/") == {"gw/run/": 0, "gw/run/latest.pt": len(new)}
    assert object_sha(up.client, "gw/run/latest.pt") == sha(new)


def test_rename_over_then_unlink_before_upload_deletes_the_kept_object(moto, proxy, bucket, store):
    """The object kept for a rename over is not leaked when the file that was to replace it
    goes away first: nothing replaces the key, so it is deleted (conditionally)."""
    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=30.0)
        await up.start()
        try:
            write_file(store, "latest.pt", b"old")
            assert await up.flush(timeout=60)
            write_file(store, "latest.pt.tmp", b"new")
            rename(store, "latest.pt.tmp", "latest.pt")
            remove(store, "latest.pt")
            assert await up.flush(timeout=60)
            return up
        finally:
            await up.stop()

    up = asyncio.run(main())
    assert objects(up.client, "gw/") == {}


def test_first_name_removed_then_link_evicted_moves_the_object_to_the_link(moto, proxy, bucket, store):
    """A clean file's name holding its object is removed while a hard link keeps the file,
    and the file is evicted before the job runs: that object is the only copy of its bytes,
    so it moves (copy, re-key, delete) to the link, never deleted first and uploaded again."""
    data = payload(3000, 7)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = write_file(store, "a", data)
            assert await up.flush(timeout=60)
            store.link(ino, ROOT_INO, b"latest.pt")
            remove(store, "a")
            store.evict(ino)
            assert await up.flush(timeout=20)
            return up, up.file_state(ino)
        finally:
            await up.stop()

    up, fstate = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/latest.pt": len(data)}
    assert object_sha(up.client, "gw/latest.pt") == sha(data)
    assert fstate["key"] == "latest.pt" and fstate["etag"] == up.client.head_object("gw/latest.pt").etag
    # moved by a server-side copy (a PUT without a body), not uploaded again
    assert [r.body_bytes for r in proxy.requests("PUT") if r.path.endswith("/gw/latest.pt")] == [0]


def test_imported_object_deleted_through_the_gateway_is_deleted_in_s3(moto, proxy, bucket, store):
    """An object brought in by import is owned like an uploaded one: unlinking the file
    deletes it, and the next import does not bring it back."""
    foreign = make_uploader(store, moto.endpoint, bucket).client
    foreign.put_object("gw/imp/a.bin", b"A" * 1000, metadata={}, checksum=_crc(foreign, b"A" * 1000))
    foreign.put_object("gw/imp/b.bin", b"B" * 1000, metadata={}, checksum=_crc(foreign, b"B" * 1000))

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            report = await up.import_bucket()
            assert report.imported == 2
            remove(store, "imp/a.bin")
            assert await up.flush(timeout=60)
            again = await up.import_bucket()
            return up, again
        finally:
            await up.stop()

    up, again = asyncio.run(main())
    assert objects(up.client, "gw/") == {"gw/imp/": 0, "gw/imp/b.bin": 1000}
    assert again.imported == 0
    with pytest.raises(StoreError):
        store.lookup(mkdirs(store, "imp"), b"a.bin")


def test_imported_file_renamed_over_then_imported_again_keeps_its_object(moto, proxy, bucket, store):
    """An imported file renamed over an uploaded local one while the move waits (a backlog),
    then a second import: the object under the old name is the gateway's (it is being
    moved), so import must not bring it in again as a new file, whose object the move would
    delete (found by the integrity model; before: that file was CLEAN with no object)."""
    foreign = make_uploader(store, moto.endpoint, bucket).client
    new = payload(700, 3)
    foreign.put_object("gw/z.pt", new, metadata={}, checksum=_crc(foreign, new))

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "latest.pt", b"old" * 100)
            assert await up.flush(timeout=60)
        finally:
            await up.stop()
        return await _import_twice_then_drain(store, proxy.endpoint, bucket,
                                              lambda: rename(store, "z.pt", "latest.pt"))

    up, first, again = asyncio.run(main())
    assert first.imported == 1 and again.imported == 0
    with pytest.raises(StoreError):
        store.lookup(ROOT_INO, b"z.pt")
    assert objects(up.client, "gw/") == {"gw/latest.pt": len(new)}
    assert object_sha(up.client, "gw/latest.pt") == sha(new)


def test_import_into_the_old_name_of_a_moved_directory_keeps_its_object(moto, proxy, bucket, store):
    """`mv imp a` while its move waits (a backlog), then an import brings a new imp/y.pt in:
    the queued move takes imp/x.pt to a/x.pt and leaves imp/y.pt, the object of a file that
    was never in the moved directory (found by the integrity model; before: the move took
    it to a/y.pt and imp/y.pt was CLEAN with no object)."""
    foreign = make_uploader(store, moto.endpoint, bucket).client
    x, y = payload(600, 4), payload(900, 5)
    foreign.put_object("gw/imp/x.pt", x, metadata={}, checksum=_crc(foreign, x))

    def between():
        rename(store, "imp", "a")
        foreign.put_object("gw/imp/y.pt", y, metadata={}, checksum=_crc(foreign, y))

    up, first, again = asyncio.run(_import_twice_then_drain(store, proxy.endpoint, bucket, between))
    assert first.imported == 1 and again.imported == 1
    assert objects(up.client, "gw/") == {"gw/a/": 0, "gw/a/x.pt": len(x), "gw/imp/": 0, "gw/imp/y.pt": len(y)}
    assert object_sha(up.client, "gw/a/x.pt") == sha(x) and object_sha(up.client, "gw/imp/y.pt") == sha(y)
    assert store.remote_info(store.lookup(mkdirs(store, "imp"), b"y.pt").ino).key == "imp/y.pt"


async def _import_twice_then_drain(store, endpoint: str, bucket: str, between):
    """An import while the uploader is stopped (its jobs wait: a backlog), `between()`, a
    second import, then a drain: (the uploader, the first import's report, the second's)."""
    idle = make_uploader(store, endpoint, bucket)     # not started: jobs wait
    first = await idle.import_bucket()
    between()
    again = await idle.import_bucket()
    up = make_uploader(store, endpoint, bucket)
    await up.start()
    try:
        assert await up.flush(timeout=60)
    finally:
        await up.stop()
    return up, first, again


def _crc(client, data: bytes) -> str:
    from uploader.objectclient import checksum_b64
    return checksum_b64(client.checksum_algorithm, data)


def test_temp_directory_marker_never_reaches_s3(moto, proxy, bucket, store):
    """mkdir step_000100.tmp; save into it; mv it to step_000100: no request ever names the
    temporary directory (no marker PUT at mkdir time); the final marker and files are there."""
    data = payload(2000, 4)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=1.0)
        await up.start()
        try:
            mkdirs(store, "ck/step_000100.tmp")
            write_file(store, "ck/step_000100.tmp/model.pt", data)
            await asyncio.sleep(0.3)                   # the uploader runs passes meanwhile
            rename(store, "ck/step_000100.tmp", "ck/step_000100")
            assert await up.flush(timeout=60)
            mkdirs(store, "ck/empty.tmp")              # a temp dir that stays: never in S3
            assert await up.flush(timeout=60)
            return up
        finally:
            await up.stop()

    up = asyncio.run(main())
    assert not [r for r in proxy.requests(outcome=None) if ".tmp" in r.path]
    assert objects(up.client, "gw/") == {"gw/ck/": 0, "gw/ck/step_000100/": 0,
                                        "gw/ck/step_000100/model.pt": len(data)}


def test_readthrough_of_an_object_changed_under_its_name_is_an_error_not_spliced(moto, proxy, bucket, store):
    """An evicted file's object replaced in S3 by other bytes (another writer, a rename over
    mirrored meanwhile): the pinned GET fails (EIO), the file never gets the new bytes."""
    size = 3 * SMALL_PART
    data, other = payload(size, 5), payload(size, 6)
    direct = make_uploader(store, moto.endpoint, bucket).client

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, readahead_chunks=0)
        await up.start()
        try:
            ino = write_file(store, "e.bin", data)
            assert await up.flush(timeout=60)
            assert store.evict(ino) > 0
            await up.fetch_missing(ino, [(0, 10)])          # first chunk: the right object
            direct.put_object("gw/e.bin", other, metadata={}, checksum=_crc(direct, other))
            with pytest.raises(StoreError) as ei:
                await up.fetch_missing(ino, [(size - 10, 10)])
            return ino, ei.value
        finally:
            await up.stop()

    ino, err = asyncio.run(main())
    assert err.errno == errno.EIO
    got = bytearray()
    for e in store.extents(ino):
        if e.state != DataState.ABSENT:
            buf, _ = store.read(ino, e.offset, e.length)
            assert bytes(buf) == data[e.offset:e.offset + e.length]    # only ever our bytes
            got += bytes(buf)
    assert 0 < len(got) < size


def test_file_rewritten_during_multipart_upload_is_aborted_and_good_object_stays(moto, proxy, bucket, store):
    """v2 is uploading (multipart, slow link) when the file is rewritten in place (v3): the
    v2 upload is aborted, never completed (it would mix v2 and v3 parts over the good v1
    object); v3 is uploaded after it."""
    size = 8 * SMALL_PART
    v1, v2, v3 = payload(size, 7), payload(size, 8), payload(size, 9)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, bytes_per_second=4 * SMALL_PART,
                           burst_seconds=0.25, max_concurrency=2)
        await up.start()
        try:
            ino = write_file(store, "big.bin", v1)
            assert await up.flush(timeout=60)
            good = up.client.head_object("gw/big.bin").etag
            write_file(store, "big.bin", v2)
            await up.flush(wait=False)
            await wait_for(lambda: up.file_state(ino).get("bytes_done", 0) > 0, timeout=30, interval=0.01)
            upload_id = store.remote_info(ino).upload_id
            assert upload_id
            store.open_file(ino, True)
            store.write(ino, 0, v3)
            store.commit(ino)
            store.close_file(ino, True)
            store.sync()
            mid = up.client.head_object("gw/big.bin").etag
            assert await up.flush(timeout=120)
            return up, good, mid, upload_id
        finally:
            await up.stop()

    up, good, mid, upload_id = asyncio.run(main())
    completes = [r for r in proxy.requests("POST") if f"uploadId={upload_id}" in r.query]
    aborts = [r for r in proxy.requests("DELETE") if f"uploadId={upload_id}" in r.query]
    assert completes == [] and len(aborts) == 1
    assert object_sha(up.client, "gw/big.bin") == sha(v3)
    assert up.status()["uploads_aborted"] >= 1
    assert mid == good


@pytest.mark.parametrize("what", ["file", "dir"])
def test_crash_between_copy_and_rekey_leaves_no_stale_key(moto, proxy, bucket, store, what):
    """The gateway dies right after a rename's CopyObject, before the record is re-keyed
    (the record write fails, the uploader is stopped, a new one starts on the same store):
    the replay ends with the record naming the object that exists (before: the source was
    deleted first, and the replay left the record at the old, now empty key)."""
    data = payload(5000, 10)
    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        ino = write_file(store, "a.bin" if what == "file" else "d/a.bin", data)
        assert await up.flush(timeout=60)
        hit = asyncio.Event()
        real = {name: getattr(store, name) for name in ("rekey_remote", "set_remote_info") if hasattr(store, name)}

        def dies(*args, **kw):
            hit.set()
            raise RuntimeError("power cut after the copy")
        for name in real:
            setattr(store, name, dies)
        try:
            rename(store, *(("a.bin", "b.bin") if what == "file" else ("d", "e")))
            await asyncio.wait_for(hit.wait(), 30)
        finally:
            await up.stop()
            for name in real:
                delattr(store, name)
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            assert await up.flush(timeout=60)
            return up, up.file_state(ino)
        finally:
            await up.stop()

    up, fstate = asyncio.run(main())
    final = "b.bin" if what == "file" else "e/a.bin"
    assert set(objects(up.client, "gw/")) == ({"gw/b.bin"} if what == "file" else {"gw/e/", "gw/e/a.bin"})
    assert fstate["key"] == final and fstate["etag"] == up.client.head_object(f"gw/{final}").etag


def test_complete_checkpoint_gets_a_manifest_written_last(moto, proxy, bucket, store):
    """Point 6: a checkpoint of a [[retention.series]] rule whose files are all in S3 gets
    <checkpoint>/.ckptgw-manifest.json, PUT after every file it lists; it follows a
    rewrite, and goes with the checkpoint."""
    import json
    from types import SimpleNamespace

    from uploader.manifest import MANIFEST_NAME
    from uploader.service import Uploader
    m1, o1, m2 = payload(3000, 11), payload(1000, 12), payload(3500, 13)
    rule = SimpleNamespace(name="run", pattern="runs/*/step_{step}")
    mkey = f"gw/runs/a/step_000100/{MANIFEST_NAME}"

    def manifest(client):
        body = client._s3.get_object(Bucket=client.bucket, Key=mkey)["Body"].read()
        return json.loads(body)

    async def main():
        base = make_uploader(store, proxy.endpoint, bucket)
        up = Uploader(store, base.client, base.settings, prefix="gw/", series=[rule])
        await up.start()
        try:
            write_file(store, "runs/a/step_000100/model.pt", m1)
            write_file(store, "runs/a/step_000100/opt.pt", o1)
            write_file(store, "runs/a/step_000200.tmp/model.pt", m1)      # unfinished: no manifest
            assert await up.flush("runs/a/step_000100", timeout=60)
            first = manifest(up.client)
            puts = [r.path for r in proxy.requests("PUT") if "step_000100" in r.path and "uploadId" not in r.query]
            write_file(store, "runs/a/step_000100/model.pt", m2)
            assert await up.flush("runs/a/step_000100", timeout=60)
            second = manifest(up.client)
            for name in ("model.pt", "opt.pt"):
                remove(store, f"runs/a/step_000100/{name}")
            remove(store, "runs/a/step_000100")
            assert await up.flush(timeout=60)
            return up, first, second, puts
        finally:
            await up.stop()

    up, first, second, puts = asyncio.run(main())
    assert puts[-1].endswith(MANIFEST_NAME) and len([p for p in puts if p.endswith(".pt")]) == 2
    assert first["format"] == "ckptgw-manifest/1" and first["checkpoint"] == "runs/a/step_000100"
    assert first["step"] == 100 and first["series"] == "run"
    assert [(f["name"], f["size"]) for f in first["files"]] == [("model.pt", len(m1)), ("opt.pt", len(o1))]
    assert [(f["name"], f["size"]) for f in second["files"]] == [("model.pt", len(m2)), ("opt.pt", len(o1))]
    assert second["files"][0]["etag"] != first["files"][0]["etag"]
    left = objects(up.client, "gw/runs/")
    assert not [k for k in left if "step_000100" in k]
    assert not [k for k in left if k.endswith(MANIFEST_NAME)]


def test_directory_marker_waits_out_the_settle_window(moto, proxy, bucket, store):
    """A directory renamed inside the settle window is marked once, under its final name;
    a flush of a path inside a held directory does not wait for its settle window."""
    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=30.0)
        await up.start()
        try:
            mkdirs(store, "first")
            await asyncio.sleep(0.5)                       # several scheduler passes
            held = objects(up.client, "gw/")
            rename(store, "first", "final")
            write_file(store, "final/sub/x.bin", b"x" * 100)
            assert await up.flush("final/sub", timeout=20)
            return up, held
        finally:
            await up.stop()

    up, held = asyncio.run(main())
    assert held == {}
    assert not [r for r in proxy.requests(outcome=None) if "first" in r.path]
    assert objects(up.client, "gw/") == {"gw/final/": 0, "gw/final/sub/": 0, "gw/final/sub/x.bin": 100}


def test_versioned_bucket_records_version_and_reads_exactly_it(moto, proxy, bucket, store):
    """On a versioned bucket the record carries the VersionId: a read-through of an evicted
    file reads that version even after another writer replaced the key."""
    size = 2 * SMALL_PART
    data, other = payload(size, 14), payload(size, 15)
    direct = make_uploader(store, moto.endpoint, bucket).client
    direct._s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, readahead_chunks=0)
        await up.start()
        try:
            ino = write_file(store, "v.bin", data)
            assert await up.flush(timeout=60)
            assert store.evict(ino) > 0
            direct.put_object("gw/v.bin", other, metadata={}, checksum=_crc(direct, other))
            await up.fetch_missing(ino, [(0, size)])
            return ino
        finally:
            await up.stop()

    ino = asyncio.run(main())
    assert store.remote_info(ino).version_id
    buf, _ = store.read(ino, 0, size)
    assert bytes(buf) == data
