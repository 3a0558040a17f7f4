"""Run an Uploader over a store directory until killed (for the kill -9 resume test).

python uploader_proc.py STORE_DIR ENDPOINT BUCKET BYTES_PER_SECOND [STALL_FILE]

STALL_FILE: every store.mark_uploaded first creates that file and then never returns (its
thread sleeps), so the test can kill -9 the process between S3's acceptance of an upload and
its record: the window of issue 38.
"""
import asyncio
import os
import sys
import time

# Run as a script: put the repository root on sys.path so `tests.` and the rooms import.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from cache.store import Store  # noqa: E402
from tests.uploader.conftest import make_uploader  # noqa: E402


async def main(store_dir, endpoint, bucket, bps, stall_file=None):
    store = Store.open(store_dir, capacity=1 << 30)
    if stall_file:
        def stalled_mark_uploaded(ino, remote):
            with open(stall_file, "w") as f:
                f.write(f"{ino} {remote.key} {remote.etag}\n")
            while True:
                time.sleep(60)
        store.mark_uploaded = stalled_mark_uploaded
    up = make_uploader(store, endpoint, bucket, settle_seconds=0.0, bytes_per_second=float(bps),
                       burst_seconds=0.01, max_concurrency=1)
    await up.start()
    print("started", flush=True)
    await up.flush(timeout=3600)
    print("drained", flush=True)
    await up.stop()
    store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
