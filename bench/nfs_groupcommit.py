"""Group commit through the NFS server: durable namespace ops/s with 1 and N concurrent clients.

Each client (its own TCP connection and NFSv4.1 session, as separate training ranks would be)
repeats what a rank does at the end of a save: OPEN(create) a temp file and CLOSE it (one
COMPOUND, CLOSE using the current stateid, RFC 8881 16.2.3.1.2), then RENAME it over its final
name. The server replies to each only once the change is durable, so with one client every op
pays a sync; with many, one sync covers all ops waiting at that moment.

    python bench/nfs_groupcommit.py [--seconds 5] [--clients 1,32] [--dir DIR]
The server is `python -m nfsd` in its own process; the clients share one asyncio loop here.
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nfsd.xdr.nfs4 import (  # noqa: E402
    CLAIM_NULL, CLOSE4args, CREATE4args, NF4DIR, OPEN4_CREATE, OPEN4_SHARE_ACCESS_WRITE,
    OPEN4_SHARE_DENY_NONE, OPEN4args, OP_CLOSE, OP_CREATE, OP_GETFH, OP_OPEN, OP_PUTFH,
    PUTFH4args, UNCHECKED4, createhow4, createtype4, fattr4, open_claim4, openflag4, stateid4,
)
from testkit.crash_server import ServerProcess  # noqa: E402
from testkit.nfsclient import NfsClient, check, op  # noqa: E402

CURRENT_STATEID = stateid4(1, bytes(12))       # RFC 8881 16.2.3.1.2


async def client_loop(port: int, index: int, stop_at: float, counts: list[int],
                      latencies: list[float]) -> None:
    c = await NfsClient.connect("127.0.0.1", port)
    try:
        await c.setup_session()
        base = await c.lookup_path("/checkpoints")
        name = f"rank{index}-{time.monotonic_ns()}".encode()
        res = check(await c.compound([op(OP_PUTFH, PUTFH4args(base)),
                                      op(OP_CREATE, CREATE4args(createtype4(NF4DIR), name,
                                                                fattr4([], b""))),
                                      op(OP_GETFH)]))
        d = res.resarray[2].value.value.object
        n = 0
        while time.monotonic() < stop_at:
            tmp = b"tmp%d" % n
            t0 = time.perf_counter()
            check(await c.compound([
                op(OP_PUTFH, PUTFH4args(d)),
                op(OP_OPEN, OPEN4args(seqid=0, share_access=OPEN4_SHARE_ACCESS_WRITE,
                                      share_deny=OPEN4_SHARE_DENY_NONE, owner=c._owner(),
                                      openhow=openflag4(OPEN4_CREATE, createhow4(
                                          UNCHECKED4, fattr4([], b""))),
                                      claim=open_claim4(CLAIM_NULL, tmp))),
                op(OP_CLOSE, CLOSE4args(0, CURRENT_STATEID))]))
            t1 = time.perf_counter()
            await c.rename(d, tmp, d, b"final")
            t2 = time.perf_counter()
            latencies += [t1 - t0, t2 - t1]
            n += 2
        counts[index] = n
    finally:
        await c.close()


async def measure(port: int, nclients: int, seconds: float) -> tuple[float, float, float]:
    counts, latencies = [0] * nclients, []
    stop_at = time.monotonic() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(port, i, stop_at, counts, latencies)
                           for i in range(nclients)))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3  # noqa: E731
    return sum(counts) / elapsed, pct(0.5), pct(0.99)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--clients", default="1,32", help="comma-separated client counts")
    ap.add_argument("--dir", default=None, help="where the store lives (default /var/tmp)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nfs-groupcommit-", dir=args.dir or "/var/tmp"))
    rows = []
    try:
        srv = ServerProcess(root / "cache", root / "server.log")
        srv.start()
        try:
            for n in (int(x) for x in args.clients.split(",")):
                rows.append((n, *asyncio.run(measure(srv.port, n, args.seconds))))
        finally:
            srv.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"durable namespace ops through python -m nfsd (OPEN-create+CLOSE, RENAME); "
          f"{args.seconds:g} s each")
    print(f"{'clients':>8}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'vs 1':>8}")
    base = rows[0][1] if rows else 1
    for n, rate, p50, p99 in rows:
        print(f"{n:>8}{rate:10.1f}{p50:10.2f}{p99:10.2f}{rate / base:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
