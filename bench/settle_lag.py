"""How late the event loop runs while the uploader queues a checkpoint's settled files.

    python bench/settle_lag.py [--files 1000] [--rounds 2]

A store with N committed 4 KiB files (a checkpoint's shards, closed together); one scheduler
pass of the uploader (`Uploader._enqueue_ready`, the settle window skipped as `ckptgw flush`
does) queues them all, while a task on the same loop sleeps 1 ms at a time and records how late
it wakes: the time every NFS client would have waited. Prints the pass's duration and the
loop's total and largest lateness; compare two commits side by side (PYTHONPATH=TREE).
The S3 endpoint (moto) is only named, never called: the pass sends nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import structlog  # noqa: E402

from bench.upload_drain import s3settings  # noqa: E402
from cache.api import ROOT_INO  # noqa: E402
from cache.store import Store  # noqa: E402
from uploader.objectclient import Boto3ObjectClient  # noqa: E402
from uploader.service import Uploader  # noqa: E402
from uploader.settings import UploadSettings  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
ENDPOINT = "http://127.0.0.1:9"          # never contacted


def checkpoint(root: Path, files: int) -> Store:
    store = Store.open(str(root / "store"), capacity=4 << 30)
    step = store.mkdir(ROOT_INO, b"step100", 0o755, 0, 0)[0].ino
    for i in range(files):
        ino = store.create(step, b"shard-%05d.pt" % i, 0o644, 0, 0)[0].ino
        store.open_file(ino, True)
        store.write(ino, 0, b"x" * 4096)
        store.commit(ino)
        store.close_file(ino, True)
    return store


async def one_pass(store: Store) -> tuple[float, float, float]:
    """(seconds of the pass, total lateness of the loop, largest lateness)."""
    s3 = s3settings(ENDPOINT, "bench")
    up = Uploader(store, Boto3ObjectClient(s3), UploadSettings(settle_seconds=0), s3=s3)
    late: list[float] = []
    done = False

    async def ticker():
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    late.clear()
    t0 = time.perf_counter()
    await up._enqueue_ready()
    secs = time.perf_counter() - t0
    done = True
    await tick
    queued = sum(1 for _, job in store.queue_list(1 << 30) if job.get("kind") == "upload")
    if queued == 0:
        raise SystemExit("nothing was queued: the benchmark measured nothing")
    return secs, sum(late), max(late, default=0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2, help="median of this many fresh stores")
    ap.add_argument("--dir", default=None, help="where the stores go (default /var/tmp)")
    args = ap.parse_args()
    results = []
    for _ in range(args.rounds):
        root = Path(tempfile.mkdtemp(prefix="settle-lag-", dir=args.dir or "/var/tmp"))
        try:
            store = checkpoint(root, args.files)
            try:
                results.append(asyncio.run(one_pass(store)))
            finally:
                store.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    secs, total, worst = (statistics.median(r[k] for r in results) for k in range(3))
    print(f"{args.files} settled files, one uploader pass, median of {args.rounds}: "
          f"pass {secs * 1e3:.0f} ms, loop late {total * 1e3:.0f} ms in total, at most {worst * 1e3:.1f} ms at once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
