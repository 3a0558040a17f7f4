"""FILE_SYNC WRITEs side by side for two source trees (issue 37: the ack-latency row and the
thread crossings of a durable write).

Each round starts each tree's `python -m nfsd` afresh (its own cache directory, its directory
first on sys.path), our NFSv4.1 test client opens a file and sends --writes FILE_SYNC WRITEs of
each --sizes at increasing offsets (bench/latency.py), and the server's CPU time and voluntary
context switches (every thread, /proc) are read around them. The trees take turns first.

    python -m bench.file_sync_ab --before /tmp/wt-before [--after .] [--rounds 3] [--writes 300]
                                 [--sizes 4096,262144]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .latency import file_sync_writes

REPO = Path(__file__).resolve().parents[1]
WARMUP = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ctxsw(pid: int) -> int:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                total += sum(int(line.split()[1]) for line in f
                             if line.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:        # a thread that ended meanwhile
            pass
    return total


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not listen within 60 s")


def one_run(tree: Path, size: int, writes: int) -> dict:
    """One fresh server of `tree`: per-write latencies (ms), CPU (ms) and context switches."""
    port, work = _free_port(), tempfile.mkdtemp(prefix="ckptgw-fsync-ab-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir",
         f"{work}/c", "--log-level", "warning"],
        cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        file_sync_writes(port, WARMUP, size, name="warmup.bin")
        cpu0, sw0 = _cpu_seconds(proc.pid), _ctxsw(proc.pid)
        lat = file_sync_writes(port, writes, size, name="measured.bin")
        cpu1, sw1 = _cpu_seconds(proc.pid), _ctxsw(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    ms = sorted(x * 1e3 for x in lat)
    return {"p50": ms[len(ms) // 2], "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            "cpu_ms": (cpu1 - cpu0) / writes * 1e3, "ctxsw": (sw1 - sw0) / writes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=REPO)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--sizes", default="4096,262144", help="bytes per WRITE, comma separated")
    a = ap.parse_args(argv)
    trees = [("before", a.before), ("after", a.after)]
    got: dict[tuple[int, str], list[dict]] = {}
    for r in range(a.rounds):
        for size in (int(x) for x in a.sizes.split(",")):
            for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                got.setdefault((size, name), []).append(one_run(tree, size, a.writes))
    for (size, name), runs in sorted(got.items()):
        med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        spread = lambda k: "/".join(f"{run[k]:.2f}" for run in runs)   # noqa: E731
        print(f"{size // 1024:5d} KiB {name:6}  p50 {med['p50']:6.2f} ms ({spread('p50')})  "
              f"p99 {med['p99']:6.2f} ms ({spread('p99')})  server CPU {med['cpu_ms']:.3f} ms"
              f"/write  ctxsw {med['ctxsw']:.2f}/write ({spread('ctxsw')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
