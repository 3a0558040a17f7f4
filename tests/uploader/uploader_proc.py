"""Run an Uploader over a store directory until killed (for the kill -9 resume test).

python uploader_proc.py STORE_DIR ENDPOINT BUCKET BYTES_PER_SECOND
"""
import asyncio
import os
import sys

# Run as a script: put the repository root on sys.path so `tests.` and the rooms import.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from cache.store import Store  # noqa: E402
from tests.uploader.conftest import make_uploader  # noqa: E402


async def main(store_dir, endpoint, bucket, bps):
    store = Store.open(store_dir, capacity=1 << 30)
    up = make_uploader(store, endpoint, bucket, settle_seconds=0.0, bytes_per_second=float(bps),
                       burst_seconds=0.01, max_concurrency=1)
    await up.start()
    print("started", flush=True)
    await up.flush(timeout=3600)
    print("drained", flush=True)
    await up.stop()
    store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
