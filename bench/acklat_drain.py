"""FILE_SYNC ack latency while the uploader drains, against the same probe with nothing draining.

    python bench/acklat_drain.py [--tree PATH] [--rounds 3] [--writes 300]
                                 [--gateway-args "FLAGS"] [--draining-only]

`ckptgw serve` (its uploader to moto at SCHED_IDLE, as bench/stack.py runs it); nfs-rs writes
8 x 64 MiB; then 300 FILE_SYNC writes of 256 KiB, each followed by a local 256 KiB
write+fdatasync (bench/latency.py), while the uploader drains those files (settle 0.5 s) or
with the upload held back (settle 3600 s). Prints p50/p99 of both per round and the CPU the
gateway and moto used during the writes. --tree: the gateway from that checkout (an older
commit), to compare two commits side by side.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--writes", type=int, default=300)
ap.add_argument("--gateway-args", default="", help='more `ckptgw serve` flags, e.g. '
                '"--upload-foreground-concurrency 0", to compare settings side by side')
ap.add_argument("--draining-only", action="store_true", help="skip the quiet rounds")
args = ap.parse_args()
tree = os.path.abspath(args.tree)
sys.path.insert(0, tree)
os.environ["PYTHONPATH"] = tree            # the daemon LiveDaemon spawns runs this tree's code

from bench import nfsrs_throughput as tp  # noqa: E402
from bench.latency import LocalSyncWrites, file_sync_writes  # noqa: E402
from bench.procs import quiesce_disk  # noqa: E402
from bench.stack import gateway, s3_server  # noqa: E402
from bench.stats import percentile  # noqa: E402

MiB = 1 << 20
ACK = 256 * 1024


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(settle: float, workdir: Path) -> str:
    block = os.urandom(MiB)
    with s3_server() as s3, gateway(workdir, s3.endpoint, settle=settle,
                                    extra=tuple(args.gateway_args.split())) as gw:
        tp.mkdir(gw.port, "bench")
        tp.write_streams(gw.port, "bench/s", 64 * MiB, block)
        time.sleep(0.6)                      # past the settle window: the drain begins
        g0, m0, t0 = cpu_seconds(gw.pid), cpu_seconds(s3.pid), time.perf_counter()
        with LocalSyncWrites(str(gw.handle.cache_dir), ACK) as local:
            lat = file_sync_writes(gw.port, args.writes, ACK, between=local.one)
        wall = time.perf_counter() - t0
        g, m = (cpu_seconds(gw.pid) - g0) / wall, (cpu_seconds(s3.pid) - m0) / wall
    ms, lms = [x * 1e3 for x in lat], [x * 1e3 for x in local.seconds]
    return (f"gateway p50 {percentile(ms, 50):.2f} p99 {percentile(ms, 99):.2f} ms; local p50 "
            f"{percentile(lms, 50):.2f} p99 {percentile(lms, 99):.2f} ms; p99 over local "
            f"{percentile(ms, 99) - percentile(lms, 99):.2f} ms; cores: gateway {g:.2f}, moto {m:.2f}")


if __name__ == "__main__":
    print(f"tree {tree}")
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            modes = (("draining", 0.5),) if args.draining_only else (("draining", 0.5), ("quiet", 3600.0))
            for label, settle in modes:
                quiesce_disk()
                print(f"round {r} {label:8s} {one(settle, Path(d) / f'{label}{r}')}", flush=True)
