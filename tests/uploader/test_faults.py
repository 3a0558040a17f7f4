"""Through the fault proxy: 503 SlowDown + connection resets, and a full outage."""
import asyncio
import os

from cache.api import DataState
from tests.uploader.conftest import SMALL_PART, make_uploader, object_sha, objects, payload, sha
from testkit.storefiles import write_file

LONG = os.environ.get("CKPTGW_LONG") == "1"


def test_slowdowns_and_resets_every_object_ends_correct(moto, proxy, bucket, store):
    files = {f"r/{i}": payload((i % 3) * SMALL_PART + 1000 * i + 1, 100 + i) for i in range(10)}

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, max_concurrency=6)
        proxy.faults.error_rate = 0.30
        proxy.faults.reset_rate = 0.05
        await up.start()
        try:
            inos = {p: write_file(store, p, d) for p, d in files.items()}
            assert await up.flush(timeout=240)
            proxy.clear()
            return up, up.status(), inos
        finally:
            await up.stop()

    up, status, inos = asyncio.run(main())
    assert objects(up.client, "gw/r/") == {f"gw/{p}": len(d) for p, d in files.items()} | {"gw/r/": 0}
    for p, d in files.items():
        assert object_sha(up.client, f"gw/{p}") == sha(d), p
        assert store.getattr(inos[p]).data_state == DataState.CLEAN
    assert status["throttles"] > 0 and status["retries"] >= status["throttles"]
    assert len(proxy.requests(outcome="reset")) > 0
    assert status["bytes_uploaded"] == sum(len(d) for d in files.values())


def test_outage_saves_continue_and_everything_drains(moto, proxy, bucket, store):
    outage = 120.0 if LONG else 12.0

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=0.1, backoff_max=2.0)
        await up.start()
        try:
            write_file(store, "o/before", payload(1000, 1))
            assert await up.flush(timeout=60)
            proxy.blackhole(outage)
            saved = {}
            t_end = asyncio.get_running_loop().time() + outage * 0.8
            i = 0
            while asyncio.get_running_loop().time() < t_end:     # the job keeps saving
                saved[f"o/s{i}"] = payload(SMALL_PART * (i % 3) + 10, 200 + i)
                write_file(store, f"o/s{i}", saved[f"o/s{i}"])
                i += 1
                await asyncio.sleep(outage / 8)
            mid = up.status()
            assert await up.flush(timeout=outage + 120)
            return up, saved, mid
        finally:
            await up.stop()

    up, saved, mid = asyncio.run(main())
    assert mid["queued_uploads"] > 0 and mid["oldest_dirty_age_seconds"] > 0
    for p, d in saved.items():
        assert object_sha(up.client, f"gw/{p}") == sha(d), p
    assert proxy.requests(outcome="blackholed")


def test_a_planned_stop_lets_the_upload_in_flight_finish_and_records_it(moto, proxy, bucket, store):
    """A stop with a grace (the daemon's on SIGTERM: a planned switchover of an HA pair, a restart)
    waits for the PUT S3 is taking and records it; without one the job stays queued and the next
    start PUTs the same bytes again (found as a key with two versions after the HA failback test's
    switchover)."""
    async def main(grace):
        up = make_uploader(store, proxy.endpoint, bucket, settle_seconds=0.05)
        proxy.faults.latency = 1.0
        proxy.faults.only_methods = ("PUT",)
        await up.start()
        try:
            name = f"planned/{'graced' if grace else 'at-once'}"
            ino = write_file(store, name, payload(1000, 7))
            while not [r for r in proxy.requests("PUT") if r.path.endswith(name)]:
                await asyncio.sleep(0.02)                     # the file's PUT is in flight
        finally:
            await up.stop(grace=grace)
            proxy.clear()
        return ino

    ino = asyncio.run(main(grace=10.0))
    assert store.getattr(ino).data_state == DataState.CLEAN
    assert not [j for _, j in store.queue_list() if j.get("ino") == ino]

    ino = asyncio.run(main(grace=0.0))                        # stop at once: queued, to be PUT again
    assert store.getattr(ino).data_state != DataState.CLEAN
    assert [j for _, j in store.queue_list() if j.get("ino") == ino]
