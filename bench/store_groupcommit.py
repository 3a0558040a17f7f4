"""Group commit effect: durable namespace ops/s (create + rename + sync) with 1 and N threads.

Each op is what a checkpointing rank does at the end of a save: create a temp file, rename
it over the final name, and wait until that is durable (Store.sync(), as nfsd does before
replying). With one thread every op pays an LMDB sync; with many, one sync covers every
op waiting at that moment. Also prints the store's hot-path costs (getattr, lookup,
1 MiB write) for reference.

    python bench/store_groupcommit.py [--dir DIR] [--seconds 3] [--threads 1,32]
DIR should be on the disk you care about (default: a temp dir under /var/tmp).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import threading
import time

import structlog

from cache.api import ROOT_INO
from cache.store import Store


def run_threads(store: Store, nthreads: int, seconds: float) -> tuple[float, int]:
    stop = time.monotonic() + seconds
    counts = [0] * nthreads
    syncs0 = store.committer.syncs

    def worker(t: int) -> None:
        d = store.mkdir(ROOT_INO, b"t%d-%d" % (nthreads, t), 0o755, 0, 0)[0].ino
        i = 0
        while time.monotonic() < stop:
            tmp = b"tmp%d" % i
            store.create(d, tmp, 0o644, 0, 0)
            store.rename(d, tmp, d, b"final")
            store.sync()
            i += 1
        counts[t] = i

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(counts) / (time.monotonic() - t0), store.committer.syncs - syncs0


def hot_path(store: Store) -> None:
    f = store.create(ROOT_INO, b"hot", 0o644, 0, 0)[0].ino
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        store.getattr(f)
    t1 = time.perf_counter()
    for _ in range(n):
        store.lookup(ROOT_INO, b"hot")
    t2 = time.perf_counter()
    buf = os.urandom(1 << 20)
    for i in range(256):
        store.write(f, i << 20, buf)
    t3 = time.perf_counter()
    store.commit(f)
    t4 = time.perf_counter()
    print(f"getattr {1e6 * (t1 - t0) / n:.1f} us, lookup {1e6 * (t2 - t1) / n:.1f} us, "
          f"write 1 MiB {1e3 * (t3 - t2) / 256:.2f} ms ({256 / (t3 - t2):.0f} MiB/s "
          f"to page cache), commit 256 MiB {1e3 * (t4 - t3):.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", default="1,32")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    base = args.dir or tempfile.mkdtemp(prefix="ckptgw-bench-", dir="/var/tmp")
    path = os.path.join(base, "store")
    store = Store.open(path)
    try:
        for n in (int(x) for x in args.threads.split(",")):
            rate, syncs = run_threads(store, n, args.seconds)
            ops = rate * args.seconds
            print(f"{n:3d} threads: {rate:8.0f} durable create+rename ops/s, "
                  f"{syncs} LMDB syncs for ~{ops:.0f} ops ({ops / max(syncs, 1):.1f} ops/sync)")
        hot_path(store)
    finally:
        store.close()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
