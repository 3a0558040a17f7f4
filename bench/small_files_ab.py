"""Small-file saves (bench/nfsrs_throughput.py `small_files`) through nfs-rs against `python -m
nfsd` from two source trees (e.g. a commit before a change, and after) and NFS-Ganesha,
interleaved round by round so host load hits all three alike; prints every round and the
medians. For before/after figures on a shared, loaded host.

    git archive <commit> | tar -x -C /tmp/before
    python -m bench.small_files_ab --before /tmp/before [--after .] [--rounds 3] [--seconds 5]
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

import tests.e2e.crash_server as crash_server  # noqa: E402
from bench.nfsrs_throughput import free_port, small_files  # noqa: E402


def ckptgw_round(tree: Path, root: Path, clients: int, seconds: float) -> float:
    """One fresh `python -m nfsd` started from `tree` (its cwd comes first on sys.path)."""
    saved, crash_server.REPO = crash_server.REPO, tree
    try:
        srv = crash_server.ServerProcess(root / "cache", root / "log")
        srv.start()
    finally:
        crash_server.REPO = saved
    try:
        return small_files(srv.port, clients, seconds, "ab")
    finally:
        srv.stop()


def ganesha_round(root: Path, clients: int, seconds: float) -> float:
    from tests.kclient.ganesha import GaneshaServer
    g = GaneshaServer(root, free_port())
    g.start()
    try:
        return small_files(g.port, clients, seconds, "ab")
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
    args = ap.parse_args()
    sides = {"before": lambda r, n: ckptgw_round(args.before.resolve(), r, n, args.seconds),
             "after": lambda r, n: ckptgw_round(args.after.resolve(), r, n, args.seconds)}
    if not args.no_ganesha and shutil.which("ganesha.nfsd"):
        sides["ganesha"] = lambda r, n: ganesha_round(r, n, args.seconds)
    results = {(s, n): [] for s in sides for n in args.clients}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for rnd in range(args.rounds):
        for n in args.clients:
            # odd rounds in reverse: a side never always follows the same one (the one
            # before leaves writeback behind that the next one's fdatasyncs wait for)
            order = list(sides.items())
            for side, run in (order if rnd % 2 == 0 else order[::-1]):
                root = Path(tempfile.mkdtemp(prefix="small-ab-", dir="/var/tmp"))
                try:
                    fps = run(root, n)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                results[(side, n)].append(fps)
                print(f"round {rnd + 1} {n} client(s) {side:8} {fps:8.1f} files/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    print(f"{'clients':>8}" + "".join(f"{s:>24}" for s in sides))
    for n in args.clients:
        cells = [results[(s, n)] for s in sides]
        print(f"{n:>8}" + "".join(f"{statistics.median(c):8.1f} ({'/'.join(f'{x:.0f}' for x in c)})".rjust(24)
                                  for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
