"""Run `retention apply` over a store directory with an uploader, slowly, until killed (for the
kill -9 test). python apply_proc.py STORE_DIR ENDPOINT BUCKET NOW"""
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cache.store import Store  # noqa: E402
from tests.retention.rhelp import Settings, make_uploader  # noqa: E402
from tests.retention.test_crash import RULE  # noqa: E402
from uploader import retention  # noqa: E402


async def main(store_dir, endpoint, bucket, now):
    store = Store.open(store_dir, capacity=1 << 30)
    real_remove = store.remove

    def slow_remove(parent, name):          # one namespace removal at a time, announced
        out = real_remove(parent, name)
        store.sync()
        print("removed", name.decode(), flush=True)
        time.sleep(0.1)
        return out
    store.remove = slow_remove
    up = make_uploader(store, endpoint, bucket)
    await up.start()
    print("started", flush=True)
    await retention.apply(store=store, rules=[RULE], object_client=up.client, now=float(now), settings=Settings(),
                          uploader=up)
    print("applied", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
