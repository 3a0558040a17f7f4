"""Uploader benchmarks against moto on loopback (numbers are ratios within one run).

  python bench/upload_drain.py [--files 4] [--file-mib 32] [--part-mib 8] [--concurrency 8]

1. drain: MB/s of the uploader draining N committed files (flush) vs boto3's
   TransferManager uploading the same bytes (same part size, concurrency, endpoint).
2. save amplification: bytes sent to S3 / bytes saved, for tmp + fsync + rename saves.
3. burst: 64 writers close a shard each at the same moment; requests/s moto sees
   (1-second windows, through the recording proxy) without and with a requests/s limit.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import boto3  # noqa: E402
import structlog  # noqa: E402
from boto3.s3.transfer import TransferConfig, create_transfer_manager  # noqa: E402
from s3transfer.subscribers import BaseSubscriber  # noqa: E402

from bench.procs import quiesce_disk  # noqa: E402
from cache.api import ROOT_INO  # noqa: E402
from cache.store import Store  # noqa: E402
from testkit.faultproxy import ThreadedFaultProxy  # noqa: E402
from testkit.motoserver import MotoServer  # noqa: E402
from uploader.objectclient import Boto3ObjectClient  # noqa: E402
from uploader.service import Uploader  # noqa: E402
from uploader.settings import MiB, S3Settings, UploadSettings  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))   # warnings and up


def s3settings(endpoint, bucket, prefix="gw/"):
    return S3Settings(bucket=bucket, endpoint_url=endpoint, access_key="testing", secret_key="testing",
                      addressing_style="path", prefix=prefix)


def make_bucket(endpoint, bucket):
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)


def save(store, name: str, data: bytes, *, tmp_rename: bool = False) -> None:
    target = name + ".tmp" if tmp_rename else name
    attr, _, _ = store.create(ROOT_INO, target.encode(), 0o644, 0, 0)
    store.open_file(attr.ino, True)
    for off in range(0, len(data), MiB):
        store.write(attr.ino, off, data[off:off + MiB])
    store.commit(attr.ino)
    store.close_file(attr.ino, True)
    if tmp_rename:
        store.rename(ROOT_INO, target.encode(), ROOT_INO, name.encode())
    store.sync()


async def run_uploader(store, endpoint, bucket, settings, progress: list | None = None) -> tuple[float, dict]:
    """Start an uploader on store, flush everything, stop it. progress: appended
    (seconds since start, bytes uploaded) every 0.1 s while it drains."""
    s3 = s3settings(endpoint, bucket)
    up = Uploader(store, Boto3ObjectClient(s3, max_pool_connections=settings.max_concurrency + 4),
                  settings, s3=s3)
    await up.start()
    # start-up's S3 sweep of orphaned multipart uploads (new ones wait for it) is the
    # gateway's boot, not its drain, as creating its client is not TransferManager's upload
    await up.worker.orphans_swept.wait()
    t0 = time.perf_counter()

    async def sample():
        while True:
            progress.append((time.perf_counter() - t0, up.status()["bytes_uploaded"]))
            await asyncio.sleep(0.1)
    sampler = asyncio.create_task(sample()) if progress is not None else None
    try:
        assert await up.flush(timeout=3600)
        secs = time.perf_counter() - t0
        status = up.status()
        if progress is not None:
            progress.append((secs, status["bytes_uploaded"]))
        return secs, status
    finally:
        if sampler:
            sampler.cancel()
        await up.stop()


def _drain_ours(moto, d, blobs, settings, bucket, progress: list | None = None) -> tuple[float, int]:
    store = Store.open(os.path.join(d, bucket), capacity=4 << 30)
    try:
        for i, b in enumerate(blobs):
            save(store, f"f{i}", b)
        make_bucket(moto.endpoint, bucket)
        secs, status = asyncio.run(run_uploader(store, moto.endpoint, bucket, settings, progress))
        return secs, status["requests_total"]
    finally:
        store.close()


class _Progress(BaseSubscriber):
    """(seconds since t0, bytes sent) after every progress callback of a TransferManager."""

    def __init__(self, t0: float, timeline: list, lock: threading.Lock, total: list):
        self.t0, self.timeline, self.lock, self.total = t0, timeline, lock, total

    def on_progress(self, future, bytes_transferred, **kwargs):
        with self.lock:
            self.total[0] += bytes_transferred
            self.timeline.append((time.perf_counter() - self.t0, self.total[0]))


def transfer_manager_upload(endpoint, paths, cfg, bucket, progress: list | None = None, **client_config) -> float:
    """boto3's TransferManager uploading each path to key fI in bucket; returns seconds.
    client_config: botocore Config arguments (e.g. retries)."""
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          config=Config(**client_config) if client_config else None)
    t0 = time.perf_counter()
    subs = [_Progress(t0, progress, threading.Lock(), [0])] if progress is not None else None
    with create_transfer_manager(client, cfg) as tm:
        futures = [tm.upload(p, bucket, f"f{i}", subscribers=subs) for i, p in enumerate(paths)]
        for f in futures:
            f.result()
    return time.perf_counter() - t0


def _drain_transfer_manager(moto, paths, cfg, bucket, progress: list | None = None) -> float:
    make_bucket(moto.endpoint, bucket)
    return transfer_manager_upload(moto.endpoint, paths, cfg, bucket, progress)


def bench_drain(moto, args, blobs) -> dict:
    """Alternating rounds (ours, theirs, theirs, ours, ...) on one moto; medians compared.
    Every side starts alike: both sides ran once untimed first (imports, clients, moto's
    first requests were round 0's first side's cost alone), moto is emptied after each side
    (a side uploading into a moto that already holds the other side's objects was the slower,
    whichever it was) and the page cache is written back."""
    part = args.part_mib * MiB
    total = sum(len(b) for b in blobs)
    settings = UploadSettings(settle_seconds=3600, part_size_min=part, multipart_threshold=part,
                              max_concurrency=args.concurrency, poll_interval=0.05)
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=args.concurrency)
    ours, theirs, ours_tl, theirs_tl = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, b in enumerate(blobs):
            p = os.path.join(d, f"t{i}")
            with open(p, "wb") as f:
                f.write(b)
            paths.append(p)
        _drain_ours(moto, d, blobs[:1], settings, "warmours")
        _drain_transfer_manager(moto, paths[:1], cfg, "warmtm")
        moto.reset()
        for r in range(args.rounds):
            first_ours = r % 2 == 0
            for which in ((0, 1) if first_ours else (1, 0)):
                quiesce_disk()
                if which == 0:
                    ours_tl.append([])
                    secs, requests = _drain_ours(moto, d, blobs, settings, f"ours{r}", ours_tl[-1])
                    ours.append(secs)
                else:
                    theirs_tl.append([])
                    theirs.append(_drain_transfer_manager(moto, paths, cfg, f"tm{r}", theirs_tl[-1]))
                moto.reset()              # moto keeps objects in memory (or its spill files)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    return {"bytes": total, "rounds": args.rounds, "uploader_MBps": round(total / ours_s / 1e6, 1),
            "transfer_manager_MBps": round(total / theirs_s / 1e6, 1),
            "uploader_over_transfer_manager": round(theirs_s / ours_s, 2),
            "uploader_runs_s": [round(x, 2) for x in ours], "transfer_manager_runs_s": [round(x, 2) for x in theirs],
            "uploader_requests": requests, "uploader_timelines": ours_tl, "transfer_manager_timelines": theirs_tl}


def bench_amplification(moto, proxy_port, mib: int = 24) -> dict:
    proxy = ThreadedFaultProxy(proxy_port)
    try:
        data = os.urandom(mib * MiB)
        settings = UploadSettings(settle_seconds=1.0, max_concurrency=4, poll_interval=0.05)
        with tempfile.TemporaryDirectory() as d:
            store = Store.open(os.path.join(d, "s"), capacity=4 << 30)
            make_bucket(moto.endpoint, "amp")
            for step in range(3):
                save(store, f"step{step}.pt", data, tmp_rename=True)
            _, status = asyncio.run(run_uploader(store, proxy.endpoint, "amp", settings))
            store.close()
        body_bytes = sum(r.body_bytes for r in proxy.requests(outcome=None) if r.method in ("PUT", "POST"))
        saved = 3 * len(data)
        return {"bytes_saved": saved, "bytes_uploaded": status["bytes_uploaded"],
                "put_over_saved": round(status["bytes_uploaded"] / saved, 4),
                "wire_body_over_saved": round(body_bytes / saved, 4),
                "tmp_keys_requested": sum(".tmp" in r.path for r in proxy.requests(outcome=None))}
    finally:
        proxy.stop()


def bench_burst(moto, proxy_port, rps: float) -> dict:
    proxy = ThreadedFaultProxy(proxy_port)
    try:
        settings = UploadSettings(settle_seconds=0.0, max_concurrency=16, poll_interval=0.05,
                                  requests_per_second=rps)
        bucket = f"burst{int(rps)}"
        with tempfile.TemporaryDirectory() as d:
            store = Store.open(os.path.join(d, "s"), capacity=4 << 30)
            make_bucket(moto.endpoint, bucket)
            shard = os.urandom(256 * 1024)
            for rank in range(64):             # 64 ranks close at the same moment
                save(store, f"rank{rank:02d}.pt", shard)
            secs, status = asyncio.run(run_uploader(store, proxy.endpoint, bucket, settings))
            store.close()
        times = sorted(r.t for r in proxy.requests(outcome=None))
        t0 = times[0]
        per_sec: dict[int, int] = {}
        for t in times:
            per_sec[int(t - t0)] = per_sec.get(int(t - t0), 0) + 1
        return {"limit_rps": rps or "unlimited", "requests": len(times), "seconds": round(secs, 2),
                "peak_rps": max(per_sec.values()), "mean_rps": round(len(times) / max(secs, 1e-9), 1)}
    finally:
        proxy.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-mib", type=int, default=32)
    ap.add_argument("--part-mib", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--burst-rps", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    moto = MotoServer()
    try:
        blobs = [os.urandom(args.file_mib * MiB) for _ in range(args.files)]
        results = {"drain": bench_drain(moto, args, blobs),
                   "save_amplification": bench_amplification(moto, moto.port),
                   "burst_unlimited": bench_burst(moto, moto.port, 0.0),
                   "burst_limited": bench_burst(moto, moto.port, args.burst_rps)}
    finally:
        moto.stop()
    for key in ("uploader_timelines", "transfer_manager_timelines"):
        results["drain"].pop(key)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
