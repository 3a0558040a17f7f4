"""The drain yields to clients (uploader/foreground.py): few requests in flight while clients
save or read, full concurrency again under a flush or with dirty data at half the capacity."""
import asyncio
import threading
import time

from cache.api import DataState
from cache.store import Store

from .conftest import SMALL_PART, make_uploader, payload, wait_for
from testkit.storefiles import write_file


class PeakParts:
    """Wraps the client's upload_part: how many ran at once, at most (each made slow enough
    that parts admitted together overlap)."""

    def __init__(self, client):
        self.real = client.upload_part
        self.lock = threading.Lock()
        self.now = self.peak = 0
        client.upload_part = self

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(0.05)
            return self.real(*args, **kwargs)
        finally:
            with self.lock:
                self.now -= 1


def _save(store, tag: str, files: int = 3) -> list[int]:
    return [write_file(store, f"{tag}/f{i}", payload(4 * SMALL_PART, i)) for i in range(files)]


def _clean(store, inos) -> bool:
    return all(store.getattr(i).data_state == DataState.CLEAN for i in inos)


def test_while_clients_work_the_drain_keeps_the_ceiling_and_a_flush_lifts_it(moto, bucket, store):
    async def main():
        up = make_uploader(store, moto.endpoint, bucket, max_concurrency=4, foreground_concurrency=1)
        up.foreground.last_client_op = time.monotonic       # a client busy at every moment
        parts = PeakParts(up.client)
        await up.start()
        try:
            inos = _save(store, "busy")
            await wait_for(lambda: _clean(store, inos), timeout=60)   # slower, never stopped
            during_work, parts.peak = parts.peak, 0
            status = up.status()
            more = _save(store, "flushed")
            assert await up.flush("flushed", timeout=60)
            return during_work, parts.peak, status, _clean(store, more)
        finally:
            await up.stop()

    during_work, during_flush, status, flushed = asyncio.run(main())
    assert during_work == 1 and status["foreground_ceiling"] is True
    assert during_flush > 1 and flushed


def test_quiet_clients_or_half_full_dirty_data_get_full_concurrency(moto, bucket, tmp_path):
    store = Store.open(str(tmp_path / "small"), capacity=8 * SMALL_PART)
    try:
        async def main(last_op):
            up = make_uploader(store, moto.endpoint, bucket, max_concurrency=4, foreground_concurrency=1)
            up.foreground.last_client_op = last_op
            parts = PeakParts(up.client)
            await up.start()
            try:
                inos = _save(store, f"t{id(last_op)}", files=1)     # 4 parts: half the capacity
                await wait_for(lambda: _clean(store, inos), timeout=60)
                return parts.peak
            finally:
                await up.stop()

        assert asyncio.run(main(lambda: float("-inf"))) > 1     # nobody worked lately
        assert asyncio.run(main(time.monotonic)) > 1            # busy, but dirty at half
    finally:
        store.close()
