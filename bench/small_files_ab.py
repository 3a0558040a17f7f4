"""Small-file saves (bench/nfsrs_throughput.py `small_files`) through nfs-rs against `python -m
nfsd` from two source trees (e.g. a commit before a change, and after) and NFS-Ganesha,
interleaved round by round so host load hits all three alike; prints every round and the
medians. For before/after figures on a shared, loaded host. With --streams MIB the write
streams too (1 stream of MIB MiB, 8 streams of MIB/8 each, 1 MiB durable writes), same rounds.

    git archive <commit> | tar -x -C /tmp/before
    python -m bench.small_files_ab --before /tmp/before [--after .] [--rounds 3] [--seconds 5]
                                   [--streams 256]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import testkit.crash_server as crash_server  # noqa: E402
from bench.nfsrs_throughput import WRITE1, WRITE8, free_port, measure, small_files  # noqa: E402
from bench.record import MiB, in_turn  # noqa: E402


def small_row(clients: int) -> str:
    return f"{clients} client(s) (files/s)"


def loads(clients: list[int], seconds: float, streams_mib: int) -> list:
    """What one round runs against each side, in order: callables port -> {figure: value}."""
    out = []
    if streams_mib:
        out.append(lambda port: measure(port, streams_mib * MiB, seconds, (WRITE1, WRITE8)))
    for n in clients:
        out.append(lambda port, n=n: {small_row(n): small_files(port, n, seconds, "ab")})
    return out


def ckptgw_round(tree: Path, root: Path, load) -> dict[str, float]:
    """One fresh `python -m nfsd` started from `tree` (its cwd comes first on sys.path)."""
    saved, crash_server.REPO = crash_server.REPO, tree
    try:
        srv = crash_server.ServerProcess(root / "cache", root / "log")
        srv.start()
    finally:
        crash_server.REPO = saved
    try:
        return load(srv.port)
    finally:
        srv.stop()


def ganesha_round(root: Path, load) -> dict[str, float]:
    from testkit.kclient.ganesha import GaneshaServer
    g = GaneshaServer(root, free_port())
    g.start()
    try:
        return load(g.port)
    finally:
        g.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree of the baseline")
    ap.add_argument("--after", type=Path, default=REPO, help="source tree of the change")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--no-ganesha", action="store_true")
    ap.add_argument("--streams", type=int, default=0, metavar="MIB",
                    help="also 1 and 8 write streams of MIB MiB in all (default: none)")
    args = ap.parse_args()
    sides = {"before": lambda r, load: ckptgw_round(args.before.resolve(), r, load),
             "after": lambda r, load: ckptgw_round(args.after.resolve(), r, load)}
    if not args.no_ganesha and shutil.which("ganesha.nfsd"):
        sides["ganesha"] = ganesha_round
    rows = ([WRITE1, WRITE8] if args.streams else []) + [small_row(n) for n in args.clients]
    results = {(s, row): [] for s in sides for row in rows}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for rnd in range(args.rounds):
        for load in loads(args.clients, args.seconds, args.streams):
            for side, run in in_turn(sides.items(), rnd):
                root = Path(tempfile.mkdtemp(prefix="small-ab-", dir="/var/tmp"))
                try:
                    got = run(root, load)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                for row, value in got.items():
                    results[(side, row)].append(value)
                    print(f"round {rnd + 1} {row:32} {side:8} {value:8.1f} "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    print(f"{'figure':32}" + "".join(f"{s:>24}" for s in sides))
    for row in rows:
        cells = [results[(s, row)] for s in sides]
        print(f"{row:32}" + "".join(f"{statistics.median(c):8.1f} ({'/'.join(f'{x:.0f}' for x in c)})".rjust(24)
                                     for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
