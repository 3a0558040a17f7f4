"""Reads through `python -m nfsd` with the page cache cold vs warm (a gateway host after a reboot).

    python bench/cold_read.py [--mib-per-file 96] [--rounds 1]

8 nfs-rs clients each read their own file back: sequential 1 MiB reads, then 48 random 256 KiB
reads each; "cold" first drops the store's extent files from the page cache (fdatasync +
POSIX_FADV_DONTNEED on each, no root needed), "warm" reads them again as they are. A ninth client
times an exists() every 5 ms meanwhile: how long the other clients wait while the readers' disk
reads are under way. Figures are MB/s and the probe's p50/p99 in ms; compare cold with warm and
two commits side by side (run each tree with PYTHONPATH=TREE), never absolute numbers: the disk of
a VM may be served from the hypervisor's memory.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import nfsrs_throughput as tp  # noqa: E402
from testkit.crash_server import ServerProcess  # noqa: E402
from testkit.nfsrs_support import connect  # noqa: E402

MiB = 1 << 20
RANDOM_READ = 256 << 10
RANDOM_READS = 48


def drop_store_pages(cache_dir: Path) -> None:
    """Evict the store's extent files from the page cache (clean pages only: synced first)."""
    for path in (cache_dir / "data").rglob("*"):
        if not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def random_reads(port: int, name: str, size: int, seed: int) -> None:
    c = connect(port)
    rng = random.Random(seed)
    try:
        with c.open(name, "rb") as f:
            for _ in range(RANDOM_READS):
                f.seek(rng.randrange(size // RANDOM_READ) * RANDOM_READ)
                f.read(RANDOM_READ)
    finally:
        c.close()


def probe(port: int, stop: threading.Event, lat: list[float]) -> None:
    c = connect(port)
    try:
        while not stop.is_set():
            t = time.perf_counter()
            c.exists("f0")
            lat.append(time.perf_counter() - t)
            time.sleep(0.005)
    finally:
        c.close()


def measure(srv: ServerProcess, size: int) -> dict[str, tuple[float, float, float]]:
    """{case: (MB/s, probe p50 ms, probe p99 ms)}."""
    port = srv.port
    cases = {
        "8 sequential": ([lambda i=i: tp.read_stream(port, f"f{i}") for i in range(tp.STREAMS)],
                         size * tp.STREAMS),
        "8 random 256 KiB": ([lambda i=i: random_reads(port, f"f{i}", size, i) for i in range(tp.STREAMS)],
                             RANDOM_READ * RANDOM_READS * tp.STREAMS),
    }
    out = {}
    for name, (fns, nbytes) in cases.items():
        for temp in ("cold", "warm"):
            if temp == "cold":
                drop_store_pages(srv.cache_dir)
            stop, lat = threading.Event(), []
            prober = threading.Thread(target=probe, args=(port, stop, lat))
            prober.start()
            try:
                secs = tp.timed_parallel(fns)
            finally:
                stop.set()
                prober.join()
            lat.sort()
            out[f"{name}, {temp}"] = (nbytes / secs / 1e6, lat[len(lat) // 2] * 1e3,
                                      lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib-per-file", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1, help="median of this many rounds")
    ap.add_argument("--dir", default=None, help="where the server keeps its data (default /var/tmp)")
    args = ap.parse_args()
    size = args.mib_per_file * MiB
    root = Path(tempfile.mkdtemp(prefix="cold-read-", dir=args.dir or "/var/tmp"))
    srv = ServerProcess(root / "cache", root / "nfsd.log")
    try:
        srv.start()
        tp.write_streams(srv.port, "f", size, os.urandom(MiB))
        rounds = [measure(srv, size) for _ in range(args.rounds)]
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"python -m nfsd, {tp.STREAMS} nfs-rs readers of {args.mib_per_file} MiB files, "
          f"median of {args.rounds} round(s)")
    print(f"{'case':30}{'MB/s':>10}{'probe p50 ms':>15}{'probe p99 ms':>15}")
    for case in rounds[0]:
        mbps, p50, p99 = (statistics.median(r[case][k] for r in rounds) for k in range(3))
        print(f"{case:30}{mbps:10.0f}{p50:15.2f}{p99:15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
