"""Uploads against moto: single PUT, multipart, metadata, markers, flush, status."""
import asyncio
import stat

from cache.api import DataState
from tests.uploader.conftest import SMALL_PART, make_uploader, object_sha, objects, payload, sha, wait_for
from testkit.storefiles import mkdirs, write_file


def test_small_and_multipart_upload_with_metadata(moto, bucket, store):
    small, big = payload(1000, 1), payload(5 * SMALL_PART + 123, 2)

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            i1 = write_file(store, "run/small.bin", small)
            i2 = write_file(store, "run/big.bin", big)
            assert await up.flush("run", timeout=60)
            return up, i1, i2, up.status(), up.file_state(i2)
        finally:
            await up.stop()

    up, i1, i2, status, fstate = asyncio.run(main())
    c = up.client
    objs = objects(c, "gw/")
    assert objs["gw/run/small.bin"] == len(small) and objs["gw/run/big.bin"] == len(big)
    assert object_sha(c, "gw/run/small.bin") == sha(small)
    assert object_sha(c, "gw/run/big.bin") == sha(big)
    head = c.head_object("gw/run/big.bin")
    assert int(head.metadata["mode"]) == stat.S_IFREG | 0o640
    assert head.metadata["uid"] == "1000" and head.metadata["gid"] == "1000"
    assert head.etag.endswith('-6"')                     # 6 parts of 256 KiB (+123 bytes)
    assert store.getattr(i2).data_state == DataState.CLEAN
    assert fstate["state"] == "clean" and fstate["etag"] == head.etag and fstate["checksum"]
    assert status["bytes_uploaded"] == len(small) + len(big)
    assert status["requests"]["UploadPart"] == 6 and status["requests"]["PutObject"] >= 1
    assert status["queue_depth"] == 0 and status["permanent_error"] is None


def test_empty_directory_marker_and_settle_window(moto, bucket, store):
    async def main():
        up = make_uploader(store, moto.endpoint, bucket, settle_seconds=0.5)
        await up.start()
        try:
            mkdirs(store, "empty/sub")
            store.sync()
            write_file(store, "f", b"hello")
            await wait_for(lambda: "gw/f" in objects(up.client, "gw/"), timeout=30)
            await wait_for(lambda: "gw/empty/sub/" in objects(up.client, "gw/"), timeout=30)
            return up
        finally:
            await up.stop()

    up = asyncio.run(main())
    head = up.client.head_object("gw/empty/sub/")
    assert stat.S_ISDIR(int(head.metadata["mode"]))


def test_bytes_rewritten_during_an_upload_with_size_and_mtime_restored_are_sent_again(moto, proxy, bucket, store):
    """A client rewrites the file (same size) while its multipart upload runs, then sets the old
    mtime back (cp -p, rsync -t). Size and mtime say "same"; the store's data sequence does not:
    the object sent first is stale and the new bytes are uploaded."""
    from cache.api import SetAttr
    old, new = payload(8 * SMALL_PART, 21), payload(8 * SMALL_PART, 22)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, bytes_per_second=4 * SMALL_PART,
                           burst_seconds=0.25, max_concurrency=2)
        ino = write_file(store, "ck/model.pt", old)
        mtime = store.getattr(ino).mtime_ns
        await up.start()
        try:
            await up.flush(wait=False)
            await wait_for(lambda: up.file_state(ino).get("bytes_done", 0) > 0, timeout=30, interval=0.01)
            write_file(store, "ck/model.pt", new)
            store.setattr(ino, SetAttr(mtime_ns=mtime))
            assert store.getattr(ino).size == len(old) and store.getattr(ino).mtime_ns == mtime
            assert await up.flush(timeout=120)
            return up, up.file_state(ino)
        finally:
            await up.stop()

    up, fstate = asyncio.run(main())
    assert object_sha(up.client, "gw/ck/model.pt") == sha(new)
    assert fstate["state"] == "clean"


def test_a_failed_upload_never_blocks_the_event_loop_on_the_index_lock(moto, bucket, store):
    """The failure path leaves the file QUEUED with an index write. On the event loop that
    write waited for the index lock, which a batch commit holds through its fdatasync: every
    NFS client stalled behind each failed upload. Here another thread holds the lock for
    1.5 s from the moment the upload fails; the loop must keep running meanwhile."""
    import threading
    import time
    data = payload(1000, 7)
    hold_seconds = 1.5
    released = threading.Event()

    def hold_the_index_lock(held: threading.Event) -> None:
        with store.ix.write():
            held.set()
            time.sleep(hold_seconds)
        released.set()

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        real_put = up.worker._put
        failed = asyncio.Event()

        async def put_fails_while_the_lock_is_held(*args):
            if not failed.is_set():
                failed.set()
                held = threading.Event()
                threading.Thread(target=hold_the_index_lock, args=(held,), daemon=True).start()
                held.wait(10)
                raise RuntimeError("injected upload failure")
            return await real_put(*args)
        up.worker._put = put_fails_while_the_lock_is_held

        lateness = [0.0]

        async def ticker():
            while not released.is_set():
                t0 = time.monotonic()
                await asyncio.sleep(0.01)
                lateness[0] = max(lateness[0], time.monotonic() - t0 - 0.01)
        await up.start()
        ticking = asyncio.create_task(ticker())
        try:
            ino = write_file(store, "run/f.bin", data)
            await wait_for(failed.is_set)
            await ticking
            assert await up.flush("run", timeout=60)     # the job retried: uploaded now
            return ino, lateness[0]
        finally:
            await up.stop()

    ino, late = asyncio.run(main())
    assert late < hold_seconds / 2, f"the event loop stood still for {late:.2f} s"
    assert store.getattr(ino).data_state == DataState.CLEAN


def test_regression_a_waiting_flush_never_spins_the_scheduler(moto, proxy, bucket, store):
    """A flush used to kick a scheduler pass after every look and look after every pass: while
    one upload was in flight, thousands of passes a second (each reading the queue and the
    ready files) took the CPU the uploads needed (bench drain 0.61x TransferManager). A
    waiting flush now looks again when a job ends or a pass queues more (or after
    FLUSH_RECHECK_SECONDS), so passes follow the poll interval."""
    data = payload(3000, 7)
    latency = 1.0

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, poll_interval=0.05)
        await up.start()
        try:
            ino = write_file(store, "run/slow.bin", data)
            proxy.faults.latency = latency       # every request waits: the PUT is in flight
            passes = up.passes
            assert await up.flush("run", timeout=60)
            return up, ino, up.passes - passes
        finally:
            await up.stop()

    up, ino, passes = asyncio.run(main())
    assert object_sha(up.client, "gw/run/slow.bin") == sha(data)
    assert store.getattr(ino).data_state == DataState.CLEAN
    # one pass per poll interval (50 ms) while the PUT waits its second, and a few for the
    # flush's own kick and the job's end: about 25. Before: thousands.
    assert passes <= 3 * latency / 0.05, passes
