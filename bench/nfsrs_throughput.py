"""nfs-rs throughput against `python -m nfsd` (and NFS-Ganesha in the same run, for ratios).

Figures, as in shared/README.md's nfs-rs measurements:
  write 1 stream     one client writes one file in 1 MiB write() calls (each durable on return)
  write 8 streams    8 clients (threads) each write their own file at once; aggregate MB/s
  read 1 stream      one client reads the 1-stream file back in 1 MiB reads
  small files 1/8    4 KiB file: open "wb" + write + close + rename + unlink, files/s from 1 and
                     8 clients
The machine is shared and loaded: compare ckptgw with the reference measured in the same run,
not with absolute numbers.

    python bench/nfsrs_throughput.py [--size-mib 256] [--seconds 5] [--runs 1] [--no-ganesha]
With --runs N each figure is the median of N runs (each on a fresh server).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.crash_server import ServerProcess  # noqa: E402
from testkit.nfsrs_support import RETRIES, connect, retrying, write_file  # noqa: E402

MiB = 1 << 20


def write_stream(port: int, path: str, size: int, block: bytes) -> None:
    c = connect(port)
    try:
        def once():
            with c.open(path, "wb") as f:
                for _ in range(size // MiB):
                    f.write(block)
        retrying(once)
    finally:
        c.close()


def read_stream(port: int, path: str) -> int:
    c = connect(port)
    try:
        def once():
            n = 0
            with c.open(path, "rb") as f:
                while piece := f.read(MiB):
                    n += len(piece)
            return n
        return retrying(once)
    finally:
        c.close()


def mkdir(port: int, path: str) -> None:
    """mkdir -p of one directory, over a connection of its own."""
    c = connect(port)
    try:
        retrying(c.mkdir, path, exist_ok=True)
    finally:
        c.close()


def timed_parallel(fns) -> float:
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as e:          # re-raised below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


STREAMS = 8


def stream_share(size: int) -> int:
    """Bytes per stream when `size` is split over STREAMS (whole MiB, at least one)."""
    return max(MiB, size // STREAMS // MiB * MiB)


def write_streams(port: int | list[int], prefix: str, per: int, block: bytes) -> float:
    """STREAMS clients at once, each writing its own file `prefix`N of `per` bytes; seconds.
    A list of ports: client N writes to server ports[N % len(ports)]."""
    ports = port if isinstance(port, list) else [port]
    return timed_parallel([lambda i=i: write_stream(ports[i % len(ports)], f"{prefix}{i}", per, block)
                           for i in range(STREAMS)])


def save_small_file(c, d: str, n: int, payload: bytes) -> None:
    """One small-file save as a training job's checkpoint code does it: open "wb" + write +
    close (DIR/tmpN), rename it over DIR/final, unlink DIR/final. The one body of the
    small-file figures (`small_files`) and of their anatomy (bench/small_file_anatomy.py)."""
    def once():
        with c.open(f"{d}/tmp{n}", "wb") as f:
            f.write(payload)
    retrying(once)
    retrying(c.rename, f"{d}/tmp{n}", f"{d}/final")
    retrying(c.remove, f"{d}/final")


def small_files(port: int | list[int], nclients: int, seconds: float, tag: str) -> float:
    """files/s of nclients small-file loops at once (a list of ports: client N uses
    ports[N % len(ports)])."""
    ports = port if isinstance(port, list) else [port]
    counts = [0] * nclients
    payload = os.urandom(4096)
    for p in ports:
        setup = connect(p)
        for i in range(nclients):
            retrying(setup.mkdir, f"small-{tag}-{i}", exist_ok=True)
        setup.close()

    def worker(i: int) -> None:
        c = connect(ports[i % len(ports)])
        try:
            d, n, stop = f"small-{tag}-{i}", 0, time.monotonic() + seconds
            while time.monotonic() < stop:
                save_small_file(c, d, n, payload)
                n += 1
            counts[i] = n
        finally:
            c.close()
    elapsed = timed_parallel([lambda i=i: worker(i) for i in range(nclients)])
    return sum(counts) / elapsed


WRITE1, WRITE8, READ1 = "write 1 stream (MB/s)", "write 8 streams (MB/s)", "read 1 stream (MB/s)"
SMALL1, SMALL8 = "small files, 1 client (files/s)", "small files, 8 clients (files/s)"
FIGURES = (WRITE1, WRITE8, READ1, SMALL1, SMALL8)


def measure(port: int | list[int], size: int, seconds: float,
            only: tuple[str, ...] = FIGURES) -> dict[str, float]:
    """The figures named in `only` (read 1 stream needs write 1 stream first), in FIGURES order.
    A list of ports (independent servers): the 8 streams and the 8 small-file clients are
    split over them, the one-client figures use the first."""
    ports = port if isinstance(port, list) else [port]
    port = ports[0]
    block = os.urandom(MiB)
    out = {}
    for p in ports:
        mkdir(p, "bench")
    if WRITE1 in only or READ1 in only:
        t = timed_parallel([lambda: write_stream(port, "bench/one", size, block)])
        out[WRITE1] = size / t / 1e6
    if WRITE8 in only:
        per = stream_share(size)
        t = write_streams(ports, "bench/s", per, block)
        out[WRITE8] = STREAMS * per / t / 1e6
    if READ1 in only:
        t0 = time.perf_counter()
        n = read_stream(port, "bench/one")
        out[READ1] = n / (time.perf_counter() - t0) / 1e6
    if SMALL1 in only:
        out[SMALL1] = small_files(port, 1, seconds, "a")
    if SMALL8 in only:
        out[SMALL8] = small_files(ports, 8, seconds, "b")
    return {k: v for k, v in out.items() if k in only}


def save_checkpoint(port: int, directory: str, shards: list[bytes]) -> float:
    """A sharded checkpoint save as a training job does it: one client per shard writes
    DIR/shardI.tmp in 1 MiB durable writes, then renames it to DIR/shardI. Returns seconds from
    the first byte to the last rename's reply."""
    setup = connect(port)
    retrying(setup.mkdir, directory, exist_ok=True)
    setup.close()

    def one(i: int) -> None:
        c = connect(port)
        try:
            write_file(c, f"{directory}/shard{i}.tmp", shards[i])
            retrying(c.rename, f"{directory}/shard{i}.tmp", f"{directory}/shard{i}")
        finally:
            c.close()
    return timed_parallel([lambda i=i: one(i) for i in range(len(shards))])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=256, help="the 1-stream file (8 streams: 1/8 each)")
    ap.add_argument("--seconds", type=float, default=5, help="per small-file measurement")
    ap.add_argument("--dir", default=None, help="where the servers keep their data (default /var/tmp)")
    ap.add_argument("--runs", type=int, default=1, help="median of this many runs")
    ap.add_argument("--no-ganesha", action="store_true", help="skip the NFS-Ganesha reference")
    args = ap.parse_args()
    size = args.size_mib * MiB
    root = Path(tempfile.mkdtemp(prefix="nfsrs-bench-", dir=args.dir or "/var/tmp"))
    results: dict[str, dict[str, float]] = {}
    try:
        runs: dict[str, list[dict[str, float]]] = {"ckptgw": []}
        ganesha = not args.no_ganesha and shutil.which("ganesha.nfsd")
        for run in range(args.runs):
            srv = ServerProcess(root / f"ckptgw-cache{run}", root / "ckptgw.log")
            srv.start()
            try:
                runs["ckptgw"].append(measure(srv.port, size, args.seconds))
            finally:
                srv.stop()
            if ganesha:
                from testkit.kclient.ganesha import GaneshaServer
                g = GaneshaServer(root / f"ganesha{run}", free_port())
                g.start()
                try:
                    runs.setdefault("ganesha", []).append(measure(g.port, size, args.seconds))
                finally:
                    g.stop()
        results = {name: {fig: statistics.median(r[fig] for r in rs) for fig in rs[0]}
                   for name, rs in runs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    names = list(results)
    print(f"nfs-rs against ckptgw (python -m nfsd){' and NFS-Ganesha' if 'ganesha' in results else ''}; "
          f"file {args.size_mib} MiB, small files {args.seconds:g} s each, "
          f"median of {args.runs} run(s)")
    header = f"{'figure':34}" + "".join(f"{n:>12}" for n in names)
    if "ganesha" in results:
        header += f"{'ratio':>10}"
    print(header)
    for fig in results["ckptgw"]:
        row = f"{fig:34}" + "".join(f"{results[n][fig]:12.1f}" for n in names)
        if "ganesha" in results:
            row += f"{results['ckptgw'][fig] / results['ganesha'][fig]:10.2f}"
        print(row)
    print(f"retryable errors retried: {len(RETRIES.retries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
