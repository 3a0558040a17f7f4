"""Read-through of evicted and imported files; import of a bucket written by another gateway."""
import asyncio
import errno

import pytest

from cache.api import DataState, StoreError
from tests.uploader.conftest import SMALL_PART, fill_bucket_from_another_gateway, make_uploader, payload, sha
from testkit.storefiles import write_file


async def read_all(store, up, ino, size, count=100_000):
    """Read like the NFS server does: on EAGAIN fetch `.missing`, then retry."""
    out = bytearray()
    off = 0
    while off < size:
        try:
            data, eof = store.read(ino, off, count)
        except StoreError as e:
            assert e.errno == errno.EAGAIN
            await up.fetch_missing(ino, e.missing)
            continue
        out += data
        off += len(data)
        if eof:
            break
    return bytes(out)


async def evicted(store, up, path, data) -> int:
    """A file written, uploaded and evicted: every byte of it ABSENT."""
    ino = write_file(store, path, data)
    assert await up.flush(timeout=60)
    assert store.evict(ino) > 0
    assert store.getattr(ino).data_state == DataState.ABSENT
    return ino


def test_read_through_of_an_evicted_file(moto, proxy, bucket, store):
    data = payload(5 * SMALL_PART + 77, 11)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = await evicted(store, up, "ev/big", data)
            gets_before = len(proxy.requests("GET"))
            # two concurrent readers of the same range share one fetch
            with pytest.raises(StoreError) as ei:
                store.read(ino, 0, 4096)
            await asyncio.gather(up.fetch_missing(ino, ei.value.missing), up.fetch_missing(ino, ei.value.missing))
            first_gets = len(proxy.requests("GET")) - gets_before
            got = await read_all(store, up, ino, len(data))
            return ino, got, first_gets, up.status()
        finally:
            await up.stop()

    ino, got, first_gets, status = asyncio.run(main())
    assert sha(got) == sha(data)
    assert first_gets >= 1
    assert status["bytes_fetched"] == len(data)          # each byte fetched once
    assert store.getattr(ino).data_state == DataState.CLEAN


def test_fetched_bytes_are_counted_before_a_reader_can_see_them(moto, proxy, bucket, store):
    """Regression (1 run in 20 of the test above failed, 77 bytes short): a readahead task
    counted its bytes after its fill, on the event loop, so a reader that had already read
    them (and a stop that cancelled the task there) saw them uncounted. Now every fill
    happens with its bytes already in bytes_fetched."""
    data = payload(3 * SMALL_PART + 77, 14)
    seen = []

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = await evicted(store, up, "ev/c", data)
            real = store.fill

            def fill(i, off, buf):
                seen.append((up.status()["bytes_fetched"], len(buf)))
                return real(i, off, buf)
            store.fill = fill
            try:
                return await read_all(store, up, ino, len(data))
            finally:
                store.fill = real
        finally:
            await up.stop()

    got = asyncio.run(main())
    assert sha(got) == sha(data) and seen
    filled = 0
    for counted, n in seen:
        filled += n
        assert counted >= filled


def test_import_into_an_empty_gateway_then_read_and_rename(moto, proxy, bucket, store, tmp_path):
    a, b = payload(3 * SMALL_PART, 12), payload(900, 13)

    def fill(other):
        write_file(other, "run/a", a)
        write_file(other, "run/sub/b", b)
    fill_bucket_from_another_gateway(tmp_path / "other", moto.endpoint, bucket, fill)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "run/sub/b", b"local wins")      # local data beats the object
            report = await up.import_bucket()
            ra = up.readthrough.resolve("run/a")
            got = await read_all(store, up, ra.ino, ra.size)
            assert ra.mode == 0o640 and ra.uid == 1000
            rb = up.readthrough.resolve("run/sub/b")
            local = await read_all(store, up, rb.ino, rb.size)
            # an imported file renamed is moved in S3 by copy, never uploaded
            from tests.uploader.conftest import rename
            rename(store, "run/a", "run/a2")
            assert await up.flush(timeout=60)
            return report, got, local, up.status()
        finally:
            await up.stop()

    report, got, local, status = asyncio.run(main())
    # run/sub/b exists here; run/ and run/sub/ count as existing too when this gateway's own
    # markers (its mkdirs) replaced the other gateway's before the listing: a race with its
    # uploader (3 seen once under load), so 1 to 3, never an import of them
    assert report.imported == 1 and 1 <= report.skipped_existing <= 3
    assert report.skipped_existing + report.directories >= 3, report
    assert got == a and local == b"local wins"
    assert status["moves_done"] == 1
    assert status["requests"].get("UploadPart", 0) == 0


def test_warmup_fetches_a_tree(moto, bucket, store):
    data = [payload(SMALL_PART + i, 20 + i) for i in range(3)]

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            paths = ("w/f0", "w/sub/f1", "w/sub/deep/f2")          # every level of the tree
            inos = [write_file(store, p, d) for p, d in zip(paths, data)]
            assert await up.flush(timeout=60)
            for ino in inos:
                store.evict(ino)
            fetched = await up.warmup("w")
            states = [store.getattr(i).data_state for i in inos]
            return fetched, states
        finally:
            await up.stop()

    fetched, states = asyncio.run(main())
    assert fetched == sum(len(d) for d in data)
    assert states == [DataState.CLEAN] * 3


def test_clean_data_is_evicted_by_the_store_watermarks(moto, bucket, tmp_path):
    from cache.store import Store
    from tests.uploader.conftest import make_uploader, wait_for
    store = Store.open(str(tmp_path / "small"), capacity=8 * SMALL_PART, high_watermark=0.5,
                       low_watermark=0.25)
    data = [payload(SMALL_PART + i, 30 + i) for i in range(4)]       # ~4/8 of capacity

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            inos = [write_file(store, f"e/{i}", d) for i, d in enumerate(data)]
            assert await up.flush(timeout=60)
            # once everything is clean, the evictor brings usage down to the low watermark
            await wait_for(lambda: store.usage()["used"] <= store.usage()["low"], timeout=30)
            usage = store.usage()
            states = [store.getattr(i).data_state for i in inos]
            evicted = next(i for i, st in zip(inos, states) if st == DataState.ABSENT)
            got = await read_all(store, up, evicted, len(data[inos.index(evicted)]))   # still readable
            return states, got == data[inos.index(evicted)], usage
        finally:
            await up.stop()

    try:
        states, got, usage = asyncio.run(main())
    finally:
        store.close()
    assert DataState.ABSENT in states and got
    assert usage["used"] <= usage["low"] and usage["dirty"] == 0


def test_partial_write_to_an_imported_file_uploads_old_plus_new_bytes(moto, bucket, store):
    from cache.api import ROOT_INO
    from tests.uploader.conftest import s3_settings
    from uploader.objectclient import Boto3ObjectClient, checksum_b64
    original = payload(3 * SMALL_PART, 40)
    client = Boto3ObjectClient(s3_settings(moto.endpoint, bucket))
    client.put_object("gw/imp", original, metadata={"mode": str(0o100600)},
                      checksum=checksum_b64("CRC32", original))
    patch = b"P" * 1000
    expected = original[:SMALL_PART] + patch + original[SMALL_PART + len(patch):]

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            await up.import_bucket()
            ino = store.lookup(ROOT_INO, b"imp").ino
            store.open_file(ino, True)
            store.write(ino, SMALL_PART, patch)
            store.commit(ino)
            store.close_file(ino, True)
            assert await up.flush(timeout=60)
        finally:
            await up.stop()

    asyncio.run(main())
    assert sha(client._s3.get_object(Bucket=bucket, Key="gw/imp")["Body"].read()) == sha(expected)


def test_a_reader_giving_up_does_not_cancel_the_shared_fetch(moto, proxy, bucket, store):
    data = payload(2 * SMALL_PART, 50)

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            ino = write_file(store, "slow", data)
            assert await up.flush(timeout=60)
            store.evict(ino)
            proxy.faults.latency = 0.5
            impatient = asyncio.create_task(asyncio.wait_for(up.fetch_missing(ino, [(0, 100)]), 0.1))
            patient = asyncio.create_task(up.fetch_missing(ino, [(0, 100)]))
            with pytest.raises(asyncio.TimeoutError):
                await impatient
            await patient
            proxy.faults.latency = 0.0
            return store.read(ino, 0, 100)[0]
        finally:
            await up.stop()

    assert bytes(asyncio.run(main())) == data[:100]


async def read_sequentially(store, up, ino, size, count):
    """A reader slower than S3: every readahead ends before its next READ. Reports each READ
    answered from local bytes (note_read), as the NFS server does. Returns the bytes and
    the offsets of the READs that had to wait for a fetch."""
    out, waited, off = bytearray(), [], 0
    while off < size:
        try:
            data, _ = store.read(ino, off, count)
        except StoreError as e:
            waited.append(off)
            await up.fetch_missing(ino, e.missing)
            continue
        up.note_read(ino, off, len(data))
        await asyncio.gather(*up.readthrough._background)
        out += data
        off += len(data)
    return bytes(out), waited


def test_readahead_moves_with_a_sequential_reader(moto, bucket, store):
    """Regression: readahead was started only by a READ that missed, so a reader that kept
    finding its chunks local waited for a whole GET again at the end of every window (here
    at chunks 0, 3 and 6 of 8). Now only the first READ waits, and a reader that starts in
    the middle gets no readahead until it goes on from where it started."""
    chunks = 8
    data = payload(chunks * SMALL_PART, 51)

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)      # readahead_chunks = 2
        await up.start()
        try:
            ino = write_file(store, "seq", data)
            assert await up.flush(timeout=60)
            store.evict(ino)
            got, waited = await read_sequentially(store, up, ino, len(data), SMALL_PART // 2)
            fetched = up.status()["bytes_fetched"]
            store.evict(ino)
            middle = 5 * SMALL_PART
            await up.fetch_missing(ino, [(middle, 100)])       # a random read: no readahead
            alone = [e.offset for e in store.extents(ino) if e.state != DataState.ABSENT]
            up.note_read(ino, middle + 100, 100)                 # it goes on: readahead
            await asyncio.gather(*up.readthrough._background)
            ahead = [e for e in store.extents(ino) if e.state != DataState.ABSENT]
            return got, waited, fetched, alone, ahead
        finally:
            await up.stop()

    got, waited, fetched, alone, ahead = asyncio.run(main())
    assert sha(got) == sha(data)
    assert waited == [0]
    assert fetched == len(data)                                  # each byte fetched once
    assert alone == [5 * SMALL_PART]
    assert [(e.offset, e.offset + e.length) for e in ahead] == [(5 * SMALL_PART, 8 * SMALL_PART)]
