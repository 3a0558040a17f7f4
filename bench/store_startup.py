"""Start-up (open + crash recovery) time of a store holding many files.

Builds a store with N files in directories of 1,000 (all still dirty, i.e. not uploaded:
the worst case for recovery, which visits the dirty index), leaves K of them with
uncommitted writes, "crashes" (drops the store without close()), and times Store.open().
Recovery reads only the dirty/orphan indexes and touches data files of the K files that
may hold uncommitted bytes, so open time grows with dirty files, not with all files.

    python bench/store_startup.py [--files 200000] [--uncommitted 100] [--dir DIR]
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

import structlog

from cache.api import ROOT_INO
from cache.store import Store


def build(path: str, files: int, uncommitted: int, *, crash: bool = True, quiet: bool = False) -> None:
    """N files d<i//1000>/f<i>, the first `uncommitted` with an uncommitted 4 KiB write; then
    drop the store without close() (crash=True) or close it cleanly."""
    s = Store.open(path)
    t0 = time.monotonic()
    for first in range(0, files, 1000):
        d = s.mkdir(ROOT_INO, b"d%d" % (first // 1000), 0o755, 0, 0)[0].ino
        # queued together: the batch committer writes up to 512 creates per index commit
        futs = [s.submit("create", d, b"f%d" % i, 0o644, 0, 0, False)
                for i in range(first, min(first + 1000, files))]
        for i, fut in enumerate(futs, first):
            ino = fut.result()[0].ino
            if i < uncommitted:
                s.write(ino, 0, b"x" * 4096)
    s.sync()
    if not quiet:
        print(f"built {files} files in {time.monotonic() - t0:.1f} s")
    if not crash:
        s.close()
        return
    s.data.close()                 # crash: no close(), no commit of the live files
    s.ix.close()
    os.close(s._lockfd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--uncommitted", type=int, default=100)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    base = args.dir or tempfile.mkdtemp(prefix="ckptgw-bench-", dir="/var/tmp")
    path = os.path.join(base, "store")
    try:
        build(path, args.files, args.uncommitted)
        t0 = time.monotonic()
        s = Store.open(path)
        elapsed = time.monotonic() - t0
        print(f"open with recovery: {elapsed:.2f} s  {s.recovery_stats}")
        s.close()
        t0 = time.monotonic()
        s = Store.open(path)
        print(f"clean open: {time.monotonic() - t0:.2f} s")
        s.close()
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
