"""kill -9 in the middle of `retention apply`: nothing that should survive is lost, and the
deletes are finished (namespace and S3) after the restart."""
import os
import subprocess
import sys
import time

from tests.retention.rhelp import (DAY, HOUR, PREFIX, Rule, Settings, ckpt, client, drain, exists,
                                   make_uploader, objects, run, set_age, write_series)
from uploader import retention

STEPS = list(range(100, 1201, 100))
RULE = Rule(keep_last=2, expire_after=3 * DAY)
DOOMED = {s for s in STEPS if s <= 900}       # age of step 900: 3 d 1 h


def test_kill_9_during_apply_loses_nothing_and_finishes_after_restart(moto, bucket, tmp_path):
    from cache.store import Store
    store_dir = str(tmp_path / "store")
    now = time.time()
    store = Store.open(store_dir, capacity=1 << 30)

    async def populate():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            write_series(store, steps=STEPS)
            assert await up.flush("runs", timeout=120)
        finally:
            await up.stop()
    run(populate())
    for s in STEPS:
        set_age(store, ckpt(s), (1200 - s) / 100 * DAY + HOUR, now)
    store.close()

    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "apply_proc.py"), store_dir,
                             moto.endpoint, bucket, repr(now)], stdout=subprocess.PIPE, text=True)
    removed = 0
    try:
        for line in proc.stdout:
            if line.startswith("removed"):
                removed += 1
                if removed == 10:                # mid-way through the 4th checkpoint (3 entries each)
                    break
            assert not line.startswith("applied"), "apply finished before the kill"
    finally:
        proc.kill()
        proc.wait()
    assert removed == 10

    store = Store.open(store_dir, capacity=1 << 30)
    try:
        assert not store.check()
        for s in STEPS:
            if s not in DOOMED:
                assert exists(store, ckpt(s)), f"survivor {s} was touched"
        assert any(exists(store, ckpt(s)) for s in DOOMED)     # the crash left work undone

        async def restart():
            up = make_uploader(store, moto.endpoint, bucket)
            await up.start()
            try:
                resumed = retention.resume(store)
                result = await retention.apply(store=store, rules=[RULE], object_client=up.client, now=now,
                                               settings=Settings(), uploader=up)
                await drain(up)
                return resumed, result
            finally:
                await up.stop()
        resumed, result = run(restart())
        assert len(resumed) == 1 and resumed[0]["status"] == "done"      # the interrupted checkpoint
        for s in STEPS:
            assert exists(store, ckpt(s)) == (s not in DOOMED), s
        keys = objects(client(moto.endpoint, bucket))
        for s in STEPS:
            for name in ("model.pt", "optim.pt"):
                assert (f"{PREFIX}{ckpt(s)}/{name}" in keys) == (s not in DOOMED), (s, name)
        log = run(retention.log_entries(store=store, limit=0))["entries"]
        done = {e["checkpoint"] for e in log if e.get("action") == "delete" and e["status"] == "done"}
        assert done == {ckpt(s) for s in DOOMED}
    finally:
        store.close()
