"""Random namespace histories converge: after a flush S3 holds exactly the namespace.

Writes, overwrites, renames (over existing names too), deletes, mkdir/rmdir and directory
renames are interleaved with short pauses and partial flushes, so some land before, some
during and some after their files' uploads. At the end every file is an object with the
same bytes, every directory a marker, and nothing else is under the prefix.
"""
import asyncio
import random

import pytest

from cache.api import ROOT_INO, FileType
from tests.uploader.conftest import SMALL_PART, make_uploader, objects, remove, rename, sha
from testkit.storefiles import mkdirs, write_file


def _namespace(store):
    files, dirs = {}, set()
    stack = [(ROOT_INO, "")]
    while stack:
        ino, path = stack.pop()
        for ent in store.readdir(ino):
            p = f"{path}{ent.name.decode()}"
            if ent.attr.type == FileType.DIR:
                dirs.add(p)
                stack.append((ent.attr.ino, p + "/"))
            else:
                data, _ = store.read(ent.attr.ino, 0, ent.attr.size + 1)
                files[p] = bytes(data)
    return files, dirs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_converge(moto, bucket, store, seed):
    _check_history(store, moto.endpoint, bucket, seed)


def test_random_history_converges_through_slowdowns_and_resets(proxy, bucket, store):
    proxy.faults.error_rate, proxy.faults.reset_rate = 0.2, 0.05
    try:
        _check_history(store, proxy.endpoint, bucket, 7, on_drained=proxy.clear)   # verify fault-free
    finally:
        proxy.clear()


def _check_history(store, endpoint, bucket, seed, on_drained=lambda: None):
    rng = random.Random(seed)

    async def main():
        up = make_uploader(store, endpoint, bucket, settle_seconds=0.05)
        await up.start()
        try:
            live, dirs = set(), {""}
            for step in range(40):
                op = rng.choice(["write", "write", "overwrite", "rename", "rename", "delete",
                                 "mkdir", "rmdir", "renamedir"])
                d = rng.choice(sorted(dirs))
                base = f"{d}/" if d else ""
                if op == "write" or (op == "overwrite" and not live):
                    p = f"{base}f{step}"
                    write_file(store, p, rng.randbytes(rng.choice([10, 3000, 3 * SMALL_PART])))
                    live.add(p)
                elif op == "overwrite":
                    p = rng.choice(sorted(live))
                    write_file(store, p, rng.randbytes(rng.choice([20, 2 * SMALL_PART + 5])))
                elif op == "rename" and live:
                    src = rng.choice(sorted(live))
                    dst = rng.choice([f"{base}r{step}", rng.choice(sorted(live))])   # maybe over a file
                    if src != dst:
                        rename(store, src, dst)
                        live.discard(src)
                        live.add(dst)
                elif op == "delete" and live:
                    p = rng.choice(sorted(live))
                    remove(store, p)
                    live.discard(p)
                elif op == "mkdir":
                    p = f"{base}d{step}"
                    mkdirs(store, p)
                    store.sync()
                    dirs.add(p)
                elif op == "rmdir" and d and not any(x.startswith(d + "/") for x in live | dirs):
                    remove(store, d)
                    dirs.discard(d)
                elif op == "renamedir" and d:
                    parent = d.rpartition("/")[0]
                    new = f"{parent}/m{step}" if parent else f"m{step}"
                    rename(store, d, new)
                    live = {new + x[len(d):] if x.startswith(d + "/") else x for x in live}
                    dirs = {new + x[len(d):] if x == d or x.startswith(d + "/") else x for x in dirs}
                await asyncio.sleep(rng.choice([0, 0, 0.02, 0.1, 0.3]))
                if rng.random() < 0.1:
                    await up.flush(wait=False)
            assert await up.flush(timeout=180)
            on_drained()
            return up
        finally:
            await up.stop()

    up = asyncio.run(main())
    files, dirs = _namespace(store)
    expected = {f"gw/{p}": len(b) for p, b in files.items()} | {f"gw/{d}/": 0 for d in dirs}
    assert objects(up.client, "gw/") == expected
    for p, b in files.items():
        body = up.client._s3.get_object(Bucket=bucket, Key=f"gw/{p}")["Body"].read()
        assert sha(body) == sha(b), p
