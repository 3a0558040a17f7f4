"""Which COMPOUND of a small-file save pays which sync: `python -m nfsd` under
`strace -f` (debug log, so each COMPOUND's log line is a write(1, ...) in the same trace),
one nfs-rs client saving N files (bench/nfsrs_throughput.py `save_small_file`), and every
fdatasync / fsync / msync / sync_file_range and LMDB commit (the 120-byte meta page pwrite
of data.mdb) attributed to the COMPOUND whose log line follows it (one client: one COMPOUND
in flight), by file kind (index data.mdb, extent file, extent directory) and thread id.

    python -m bench.sync_attribution [--files 50] [--warmup 10] [--port 20650]

Needs strace. Runs a server of its own in a temporary directory (a minute at most)."""
from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SYNCS = ("fdatasync", "fsync", "msync", "sync_file_range")
TRACE = "trace=" + ",".join(SYNCS + ("pwrite64", "write"))
ANSI = re.compile(r"\\33\[[0-9;]*m")
LINE = re.compile(r"(\d+)\s+\S+ (.*)")
OPEN_NOENT = ("['SEQUENCE', 'PUTFH', 'OPEN', 'GETFH', 'GETATTR']", "NFS4ERR_NOENT")


def _kind(path: str) -> str:
    if path.endswith("data.mdb"):
        return "index data.mdb"
    if re.search(r"/data/[0-9a-f]{2}/\d+$", path):
        return "extent file"
    if re.search(r"/data/[0-9a-f]{2}$", path):
        return "extent dir"
    return path


def events(trace: str):
    """(tid, syscall, rest) per completed call, <unfinished ...> lines joined."""
    pending = {}
    for raw in open(trace, errors="replace"):
        m = LINE.match(raw.rstrip("\n"))
        if not m:
            continue
        tid, rest = m.groups()
        if rest.endswith("<unfinished ...>"):
            pending[tid] = rest[:-len("<unfinished ...>")]
            continue
        r = re.match(r"<\.\.\. \w+ resumed>(.*)", rest)
        if r:
            rest = pending.pop(tid, "") + r.group(1)
        yield tid, rest.split("(", 1)[0], ANSI.sub("", rest)


def attribute(trace: str):
    """[(ops, status, [(tid, what, kind)])] per COMPOUND, in order."""
    comps, cur = [], []
    for tid, name, rest in events(trace):
        if name == "write" and rest.startswith("write(1<"):
            m = re.search(r"compound .*?ops=(\[.*?\]).*?status=(\w+)", rest)
            if m:
                comps.append((m.group(1), m.group(2), cur))
                cur = []
            continue
        m = re.search(r"\(\d+<([^>]*)>", rest)
        if not m:
            continue
        kind = _kind(m.group(1))
        if name == "pwrite64":
            if kind == "index data.mdb" and re.search(r", 120, (32|4128)\) =", rest):
                cur.append((tid, "LMDB commit", kind))
        elif name in SYNCS:
            cur.append((tid, name, kind))
    return comps


def per_file(comps, skip: int):
    """COMPOUNDs grouped per saved file: each starts with the LOOKUP before OPEN's NOENT."""
    starts = [i for i, c in enumerate(comps) if (c[0], c[1]) == OPEN_NOENT]
    files = [comps[a - 1:b - 1] for a, b in zip(starts, starts[1:])]
    return files[skip:]


def report(files) -> None:
    n = len(files)
    seen, tally = collections.Counter(), collections.Counter()
    for f in files:
        for i, (ops, status, what) in enumerate(f):
            key = f"{i:2d} {ops} {status}"
            seen[key] += 1
            for tid, call, kind in what:
                tally[(key, call, kind, tid)] += 1
    print(f"{n} files, {sum(len(f) for f in files) / n:.2f} COMPOUNDs per file")
    for key in sorted(seen):
        print(f"{key}  x{seen[key] / n:.2f}")
        for (k, call, kind, tid), v in sorted(tally.items()):
            if k == key:
                print(f"      {call:12s} {kind:16s} tid {tid:>7s}  {v / n:.2f}/file")
    syncs = sum(v for (_, call, _, _), v in tally.items() if call in SYNCS)
    commits = sum(v for (_, call, _, _), v in tally.items() if call == "LMDB commit")
    print(f"syncs per file {syncs / n:.2f}; LMDB commits per file {commits / n:.2f}")


def _drive(port: int, files: int, warmup: int) -> None:
    from bench.nfsrs_throughput import save_small_file
    from testkit.nfsrs_support import connect, retrying
    c = connect(port)
    retrying(c.mkdir, "sf", exist_ok=True)
    payload = os.urandom(4096)
    t0 = time.monotonic()
    for i in range(warmup + files):
        save_small_file(c, "sf", i, payload)
    print(f"{warmup + files} saves in {time.monotonic() - t0:.2f}s (under strace)")
    c.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--port", type=int, default=20650)
    ap.add_argument("--keep", help="keep the trace in this file")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="syncattr-") as tmp:
        trace = args.keep or os.path.join(tmp, "trace")
        srv = subprocess.Popen(
            ["strace", "-f", "-tt", "-y", "-s", "300", "-e", TRACE, "-o", trace,
             sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{args.port}",
             "--cache-dir", os.path.join(tmp, "cache"), "--export", "/checkpoints",
             "--log-level", "debug"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _drive(args.port, args.files, args.warmup)
                    break
                except Exception:                    # noqa: BLE001 - not listening yet
                    if time.monotonic() > deadline or srv.poll() is not None:
                        raise
                    time.sleep(0.5)
        finally:
            server = subprocess.run(["pgrep", "-P", str(srv.pid)], capture_output=True,
                                    text=True).stdout.split()
            for pid in server:
                os.kill(int(pid), signal.SIGINT)
            srv.wait(30)
        report(per_file(attribute(trace), args.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
