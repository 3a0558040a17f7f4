"""The S3 side: a checkpoint save's independence from S3 faults, the uploader's drain rate and
amplification (bench/upload_drain.py), and the read of the last checkpoint after a restart.

Faulty S3 = testkit/faultproxy.py in front of moto: +35 ms per request, 20% of requests
answered 503 SlowDown (the issue's setting), faults switched on once the gateway is up.
"""
from __future__ import annotations

import argparse
import os
import time

from boto3.s3.transfer import TransferConfig

from testkit.faultproxy import ThreadedFaultProxy

from .. import nfsrs_throughput as tp
from .. import upload_drain
from ..procs import CpuMeter, quiesce_disk
from ..record import MiB, Run, in_turn
from ..stack import gateway, s3_client, s3_server

LATENCY, ERROR_RATE = 0.035, 0.20
PART_MIB, CONCURRENCY = 8, 8          # the uploader's defaults; TransferManager gets the same
STEPS = 3                             # consecutive checkpoint saves timed together


def _faulty(proxy: ThreadedFaultProxy, latency: float = LATENCY, error_rate: float = ERROR_RATE) -> None:
    proxy.faults.latency, proxy.faults.error_rate = latency, error_rate


def save_vs_faults(run: Run) -> None:
    """STEPS consecutive checkpoint saves (a training job saving every few steps), the uploader
    starting on each shard as soon as it is closed (settle 0), so every save after the first
    runs while earlier shards drain: its time is what S3's latency and errors may not touch."""
    s = run.sizes
    shards = [os.urandom(s.save_shard_mib * MiB) for _ in range(s.save_shards)]
    paths = []
    for i, b in enumerate(shards):
        paths.append(run.workdir / f"shard{i}")
        paths[-1].write_bytes(b)
    cfg = TransferConfig(multipart_threshold=PART_MIB * MiB, multipart_chunksize=PART_MIB * MiB,
                         max_concurrency=CONCURRENCY)
    group = f"{STEPS} saves of {s.save_shards} x {s.save_shard_mib} MiB"
    for rep in range(s.reps):
        with s3_server(tls=False) as s3:       # the fault proxy speaks http
            proxy = ThreadedFaultProxy(s3.port, seed=rep)
            try:
                secs = {}
                for kind in in_turn(("clean", "faulty"), rep):
                    quiesce_disk()
                    endpoint = s3.endpoint if kind == "clean" else proxy.endpoint
                    with gateway(run.workdir / f"save-{kind}{rep}", endpoint, settle=0.0) as gw:
                        if kind == "faulty":
                            _faulty(proxy)
                        meter = CpuMeter({"ckptgw": gw.pid, "moto": s3.pid}).start()
                        secs[kind] = sum(tp.save_checkpoint(gw.port, f"step{step}", shards)
                                         for step in range(STEPS))
                        cpu = meter.stop()
                        run.cpu.append({"scenario": f"{STEPS} saves, {kind} S3", "server": "ckptgw", "rep": rep,
                                        "wall_s": meter.wall, "cpu_s": cpu})
                        proxy.clear()
                s3_client(s3.endpoint).create_bucket(Bucket="direct")
                _faulty(proxy)
                secs["boto3"] = sum(upload_drain.transfer_manager_upload(
                    proxy.endpoint, [str(p) for p in paths], cfg, "direct",
                    retries={"max_attempts": 10, "mode": "standard"}) for _ in range(STEPS))
            finally:
                proxy.stop()
        run.add("s3indep.faulty_over_clean", secs["faulty"], secs["clean"])
        run.add("s3indep.boto3_over_gateway", secs["faulty"], secs["boto3"])
        for label, key in (("ckptgw, clean S3", "clean"), ("ckptgw, faulty S3", "faulty"),
                           ("boto3 direct, faulty S3", "boto3")):
            run.bar("save vs S3 faults", "s", group, label, secs[key])
    run.ratio_goal_line("save vs S3 faults", "s3indep.faulty_over_clean", "ckptgw, clean S3", group,
                        subject="ckptgw, faulty S3")
    run.ratio_goal_line("save vs S3 faults", "s3indep.boto3_over_gateway", "ckptgw, faulty S3", group,
                        subject="boto3 direct")


def drain(run: Run) -> None:
    s = run.sizes
    blobs = [os.urandom(s.drain_file_mib * MiB) for _ in range(s.drain_files)]
    args = argparse.Namespace(part_mib=PART_MIB, concurrency=CONCURRENCY, rounds=s.reps)
    with s3_server(bucket=None, tls=False) as s3:    # upload_drain: its own clients and proxy, http
        res = upload_drain.bench_drain(s3.handle, args, blobs)
        for rep in range(s.reps):
            amp = upload_drain.bench_amplification(s3.handle, s3.port, mib=s.drain_file_mib)
            run.add("drain.amplification", amp["wire_body_over_saved"] * amp["bytes_saved"] / MiB,
                    amp["bytes_saved"] / MiB)
            if amp["tmp_keys_requested"]:
                run.notes.append(f"drain: {amp['tmp_keys_requested']} request(s) named a .tmp key")
            s3.handle.reset()
    total = res["bytes"]
    for ours, theirs in zip(res["uploader_runs_s"], res["transfer_manager_runs_s"]):
        run.add("drain.rate", total / ours / 1e6, total / theirs / 1e6)
    for label, key in (("ckptgw uploader", "uploader_timelines"), ("boto3 TransferManager", "transfer_manager_timelines")):
        for tl in res[key]:
            run.timeline("drain over time", "MB uploaded", label, [(t, b / 1e6) for t, b in tl])


def restart_read(run: Run) -> None:
    s = run.sizes
    size = s.restart_mib * MiB
    block = os.urandom(MiB)
    for rep in range(s.reps):
        with s3_server(tls=False) as s3:       # the fault proxy speaks http
            proxy = ThreadedFaultProxy(s3.port, seed=rep)
            try:
                cache = run.workdir / f"restart{rep}" / "cache"
                with gateway(run.workdir / f"restart{rep}" / "first", proxy.endpoint, cache_dir=cache) as gw:
                    tp.write_stream(gw.port, "last.ckpt", size, block)
                    r = gw.handle.cli("flush", "--wait", "--timeout", "600")
                    if r.exit_code:
                        raise RuntimeError(f"flush failed: {r.stdout}{r.stderr}")
                with gateway(run.workdir / f"restart{rep}" / "second", proxy.endpoint, cache_dir=cache) as gw:
                    t0 = time.perf_counter()
                    n = tp.read_stream(gw.port, "last.ckpt")
                    cached = n / (time.perf_counter() - t0) / 1e6
                    r = gw.handle.cli_json("evict", "last.ckpt")
                    if not r.get("evicted_files"):
                        raise RuntimeError(f"evict did not drop the file: {r}")
                    _faulty(proxy, error_rate=0.0)
                    t0 = time.perf_counter()
                    n = tp.read_stream(gw.port, "last.ckpt")
                    through = n / (time.perf_counter() - t0) / 1e6
                    proxy.clear()
            finally:
                proxy.stop()
        if n != size:
            raise RuntimeError(f"read back {n} bytes of {size}")
        run.add("restart.read", through, cached)
        run.bar("restart read", "MB/s", f"{s.restart_mib} MiB after restart", "from cache", cached)
        run.bar("restart read", "MB/s", f"{s.restart_mib} MiB after restart", "read-through, S3 +35 ms", through)
