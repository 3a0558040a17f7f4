"""Issue 13 at the NFS level: nfs-rs against a real `ckptgw serve` (uploader on) whose S3 is
moto over HTTP behind the fault proxy, switched off (every request 503 SlowDown) and on again.

One test per scenario of the issue (the uploader-level twins are tests/uploader/test_identity.py),
each checking the bucket straight at moto with boto3 (bytes and the ckptgw-ino identity
metadata) once S3 is back and `ckptgw flush --wait` has returned; then a checkpoint save loop
through a 30 % 503 run and an outage, reporting one line of figures per run for RELIABILITY.md.
CKPTGW_LONG=1 makes the save-loop runs longer (a 2-minute outage) and bigger.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import boto3  # noqa: E402 (a dependency of ckptgw: missing fails, it does not skip)

from testkit.appliance_live import LiveDaemon  # noqa: E402
from testkit.nfsrs_support import connect, read_file, retrying, write_file  # noqa: E402
from tests.support.fixtures import fault_proxy, moto_server  # noqa: E402,F401 (fixtures)
from uploader.keys import INO_META  # noqa: E402

LONG = os.environ.get("CKPTGW_LONG") == "1"
PREFIX = "gw/"
BACKOFF_MAX = 1.0             # --upload-backoff-max: short, so a drain starts soon after recovery
pytestmark = pytest.mark.timeout(900 if LONG else 120)


# ---- S3 (moto), the proxy in front of it, the gateway, the client -------------------------

@pytest.fixture
def proxy(fault_proxy):
    return fault_proxy


@pytest.fixture
def s3(moto_server):
    """boto3 straight at moto (never through the proxy): what a job reading the bucket sees."""
    return boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


_buckets = itertools.count()


@pytest.fixture
def bucket(s3, request):
    """A new bucket per test (moto lives for the session; a reused name would show a
    previous test's objects)."""
    readable = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"e2e{next(_buckets)}-{readable}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def gateway(tmp_path, proxy, bucket):
    """start(*extra): `ckptgw serve` whose S3 is the proxy; stopped (exit 0 asserted) at teardown."""
    daemons: list[LiveDaemon] = []

    def start(*extra: str) -> LiveDaemon:
        d = LiveDaemon(tmp_path, "--s3-endpoint", proxy.endpoint, "--s3-bucket", bucket,
                       "--s3-prefix", PREFIX, "--s3-access-key", "testing", "--s3-secret-key", "testing",
                       "--s3-addressing-style", "path", "--s3-connect-timeout", "2",
                       "--s3-read-timeout", "5", "--upload-poll-interval", "0.05",
                       "--upload-backoff-base", "0.05", "--upload-backoff-max", str(BACKOFF_MAX), *extra)
        daemons.append(d)
        return d.start()
    yield start
    for d in daemons:
        code = d.stop()
        d.close()
        faults = [ln for ln in d.read_log().splitlines() if "Traceback" in ln or "SERVERFAULT" in ln]
        assert code == 0 and not faults, d.read_log()[-4000:]


@pytest.fixture
def client_of():
    clients = []

    def make(daemon: LiveDaemon):
        c = connect(daemon.nfs_port)
        clients.append(c)
        return c
    yield make
    for c in clients:
        c.close()


def s3_off(proxy) -> None:
    """S3 answers every request 503 SlowDown, as during a regional outage."""
    proxy.faults.error_rate = 1.0


def s3_on(proxy) -> None:
    proxy.clear()


def wait_until(pred, what: str, timeout: float = 30.0):
    """Poll pred() every 20 ms until it returns something true (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not (found := pred()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.02)
    return found


def refused_writes(proxy, fragment: str) -> list[str]:
    """Requests that would change the bucket (PUT, POST, DELETE) naming `fragment`, answered 503."""
    return [f"{r.method} {r.path}" for r in proxy.requests(outcome="slowdown")
            if r.method in ("PUT", "POST", "DELETE") and fragment in r.path]


def flush_wait(daemon: LiveDaemon, path: str = "", timeout: float = 60) -> float:
    """`ckptgw flush --wait` (asserted to succeed); returns how long it took."""
    t0 = time.monotonic()
    r = daemon.cli("flush", "--wait", "--timeout", str(timeout), *([path] if path else []))
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
    return time.monotonic() - t0


# ---- the bucket, read directly ---------------------------------------------------------------

def bucket_keys(s3, bucket: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def object_bytes(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def object_ino(s3, bucket: str, key: str) -> int:
    return int(s3.head_object(Bucket=bucket, Key=key)["Metadata"][INO_META])


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def writes_naming(proxy, fragment: str) -> list[str]:
    """Every request that could create an object (PUT, POST: whatever its outcome) whose key
    names `fragment`. (Reads may name it: a directory rename LISTs the old prefix.)"""
    return [f"{r.method} {r.path}?{r.query}" for r in proxy.requests(outcome=None)
            if r.method in ("PUT", "POST") and fragment in r.path]


# ---- scenario 1: mv d e; mkdir d; mv e/f d/f while uploads are behind -----------------------

def test_dir_moved_away_recreated_and_file_moved_back_during_outage(gateway, client_of, proxy, s3, bucket):
    gw = gateway()
    c = client_of(gw)
    data = payload(70_000, 1)
    retrying(c.mkdir, "d")
    write_file(c, "d/f", data)
    flush_wait(gw)
    assert object_bytes(s3, bucket, "gw/d/f") == data
    ino = c.stat("d/f").fileid

    s3_off(proxy)
    retrying(c.rename, "d", "e")
    retrying(c.mkdir, "d")
    retrying(c.rename, "e/f", "d/f")
    wait_until(lambda: len(proxy.requests(outcome="slowdown")) >= 2,
               "the re-key jobs meet the outage and retry (two 503s)")
    s3_on(proxy)
    flush_wait(gw)

    assert read_file(c, "d/f") == data
    assert bucket_keys(s3, bucket) == {"gw/d/": 0, "gw/d/f": len(data), "gw/e/": 0}
    assert object_bytes(s3, bucket, "gw/d/f") == data
    assert object_ino(s3, bucket, "gw/d/f") == ino


# ---- scenario 2: latest.pt.tmp renamed over an uploaded latest.pt ----------------------------

class BucketPoller:
    """poll() every 10 ms in a thread, from __enter__ to __exit__: what a job reading the
    bucket directly would find while the gateway works."""

    def __init__(self):
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(0.01)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(10)


class BucketSampler(BucketPoller):
    """Reads one key in full straight from moto; records what each read found: "old", "new",
    "absent" or "other" (bytes of neither)."""

    def __init__(self, s3, bucket: str, key: str, old: bytes, new: bytes):
        super().__init__()
        self.s3, self.bucket, self.key = s3, bucket, key
        self.names = {sha(old): "old", sha(new): "new"}
        self.samples: list[str] = []

    def poll(self) -> None:
        body = object_bytes(self.s3, self.bucket, self.key)
        self.samples.append("absent" if body is None else self.names.get(sha(body), "other"))


@pytest.mark.parametrize("fault", ["off", "slow"])
def test_tmp_renamed_over_uploaded_latest_never_leaves_bucket_without_a_checkpoint(
        gateway, client_of, proxy, s3, bucket, fault):
    """off: S3 comes back inside the settle window (a delete of the old object would go
    through at once, the new one waits out the window); slow: every request takes half a
    second until the drain is over."""
    gw = gateway("--upload-settle", "3")
    c = client_of(gw)
    old, new = payload(200_000, 2), payload(300_000, 3)
    retrying(c.mkdir, "run")
    write_file(c, "run/latest.pt", old)
    flush_wait(gw)
    with BucketSampler(s3, bucket, "gw/run/latest.pt", old, new) as sampler:
        if fault == "off":
            s3_off(proxy)
        else:
            proxy.faults.latency = 0.5
        write_file(c, "run/latest.pt.tmp", new)
        retrying(c.rename, "run/latest.pt.tmp", "run/latest.pt")
        # the fault lasts a second inside the 3 s settle window: that is the scenario (nothing
        # is due yet, so no request need meet it; a delete of the old object must NOT happen)
        time.sleep(1.0)
        if fault == "off":
            s3_on(proxy)
        # the settle window runs out and the uploader puts the new checkpoint on its own
        # (before flush_wait, which would skip the window)
        wait_until(lambda: sampler.samples and sampler.samples[-1] == "new",
                   "the bucket holds the new latest.pt after the settle window", timeout=60)
        flush_wait(gw)
        s3_on(proxy)
        seen = len(sampler.samples)
        wait_until(lambda: len(sampler.samples) >= seen + 5, "five more samples after the drain")
    samples = sampler.samples
    assert len(samples) >= 20, samples
    assert set(samples) <= {"old", "new"}, {s: samples.count(s) for s in set(samples)}
    assert samples[0] == "old" and samples[-1] == "new"
    assert "old" not in samples[samples.index("new"):], "the bucket went back to the old checkpoint"
    assert bucket_keys(s3, bucket) == {"gw/run/": 0, "gw/run/latest.pt": len(new)}
    assert object_ino(s3, bucket, "gw/run/latest.pt") == c.stat("run/latest.pt").fileid
    assert writes_naming(proxy, "latest.pt.tmp") == []     # renamed inside the settle window


# ---- scenario 3: client-set mtimes and temp names -------------------------------------------

HOUR_NS = 3600 * 10**9


def test_future_mtime_file_is_uploaded_and_flush_wait_finishes(gateway, client_of, proxy, s3, bucket):
    """touch -d '+1 hour' (clock skew): the settle window runs on the gateway's clock, so the
    file is uploaded and `flush --wait` returns, with S3 off for a while after the setattr."""
    gw = gateway("--upload-settle", "0.5")
    c = client_of(gw)
    data = payload(50_000, 4)
    write_file(c, "skewed.pt", data)
    future = time.time_ns() + HOUR_NS
    s3_off(proxy)
    retrying(c.utime, "skewed.pt", ns=(future, future))
    assert c.stat("skewed.pt").mtime == future          # the SETATTR took
    # the settle window (0.5 s, the gateway's clock) runs out during the outage: the upload is tried
    wait_until(lambda: refused_writes(proxy, "skewed.pt"), "the upload of skewed.pt meets the outage")
    s3_on(proxy)
    flush_wait(gw, timeout=30)
    assert object_bytes(s3, bucket, "gw/skewed.pt") == data
    assert object_ino(s3, bucket, "gw/skewed.pt") == c.stat("skewed.pt").fileid
    assert s3.head_object(Bucket=bucket, Key="gw/skewed.pt")["Metadata"]["mtime"].startswith(
        str(future // 10**9))              # s3fs metadata carries the client's mtime


def test_old_mtime_temp_file_renamed_in_settle_window_never_reaches_s3_by_its_temp_name(
        gateway, client_of, proxy, s3, bucket):
    """cp -p / rsync -t: a temp file whose mtime is a day old, renamed within the settle
    window, is uploaded only under its final name (no write ever names the temp)."""
    gw = gateway("--upload-settle", "2")
    c = client_of(gw)
    data = payload(60_000, 5)
    write_file(c, ".ckpt.pt.XXXXXX", data)
    old = time.time_ns() - 24 * HOUR_NS
    retrying(c.utime, ".ckpt.pt.XXXXXX", ns=(old, old))
    time.sleep(0.5)                          # let the uploader poll: nothing is due yet, nothing must go
    retrying(c.rename, ".ckpt.pt.XXXXXX", "ckpt.pt")
    flush_wait(gw)
    assert writes_naming(proxy, "XXXXXX") == []
    assert bucket_keys(s3, bucket) == {"gw/ckpt.pt": len(data)}
    assert object_bytes(s3, bucket, "gw/ckpt.pt") == data
    assert c.stat("ckpt.pt").mtime == old


def test_temp_directory_never_puts_a_marker(gateway, client_of, proxy, s3, bucket):
    """mkdir step_000100.tmp; save into it; mv it to step_000100 (within the settle window,
    S3 off meanwhile): no write ever names the temp directory; the final one is complete."""
    gw = gateway("--upload-settle", "2")
    c = client_of(gw)
    shards = {f"shard{i}.pt": payload(20_000 + i, 10 + i) for i in range(3)}
    s3_off(proxy)
    retrying(c.mkdir, "step_000100.tmp")
    for name, data in shards.items():
        write_file(c, f"step_000100.tmp/{name}", data)
    retrying(c.rename, "step_000100.tmp", "step_000100")
    # the outage lasts a second more inside the 2 s settle window: the scenario, not a wait for
    # anything (nothing is due yet; nothing may name the temp directory)
    time.sleep(1.0)
    s3_on(proxy)
    flush_wait(gw)
    assert writes_naming(proxy, "step_000100.tmp") == []
    keys = bucket_keys(s3, bucket)
    assert [k for k in keys if ".tmp" in k] == []
    assert {k for k in keys if k != "gw/step_000100/"} == {f"gw/step_000100/{n}" for n in shards}
    for name, data in shards.items():
        assert object_bytes(s3, bucket, f"gw/step_000100/{name}") == data


# ---- scenario 4: an imported object deleted through NFS -------------------------------------

def test_imported_object_deleted_through_nfs_is_deleted_in_s3_and_not_reimported(
        gateway, client_of, proxy, s3, bucket):
    for name in ("a.bin", "b.bin"):
        s3.put_object(Bucket=bucket, Key=f"gw/imp/{name}", Body=name.encode() * 1000)
    gw = gateway()
    first = gw.cli_json("import")
    c = client_of(gw)
    assert first["imported"] == 2 and sorted(c.listdir("imp")) == ["a.bin", "b.bin"], first
    s3_off(proxy)
    retrying(c.remove, "imp/a.bin")
    wait_until(lambda: refused_writes(proxy, "imp/a.bin"), "the delete of imp/a.bin meets the outage")
    s3_on(proxy)
    flush_wait(gw)
    assert "gw/imp/a.bin" not in bucket_keys(s3, bucket)
    again = gw.cli_json("import")
    assert again["imported"] == 0 and sorted(c.listdir("imp")) == ["b.bin"], again
    flush_wait(gw)
    assert "gw/imp/a.bin" not in bucket_keys(s3, bucket)
    assert object_bytes(s3, bucket, "gw/imp/b.bin") == b"b.bin" * 1000
    assert read_file(c, "imp/b.bin") == b"b.bin" * 1000


# ---- a checkpoint save loop through S3 faults: figures for RELIABILITY.md --------------------

REQUEST_LIMIT = 40            # --upload-requests-per-second
BURST_SECONDS = 0.25          # --upload-burst (the token bucket's depth, as seconds of rate)
LOOP_SETTLE = 0.5             # --upload-settle of the save loop
LOOP = (dict(ranks=4, files=4, size=256 * 1024, before=10.0, fault=120.0, interval=1.0) if LONG else
        dict(ranks=3, files=3, size=32 * 1024, before=1.5, fault=4.0, interval=0.2))


class SaveLoop:
    """`ranks` threads, each with its own nfs-rs client, saving a checkpoint every `interval`
    seconds as a training job does: rank<r>/step_<n>/shard<i>.pt, then rank<r>/latest.pt.tmp
    renamed over rank<r>/latest.pt. Every file whose write and rename returned is acknowledged:
    `acked` maps its path to its bytes' digest (latest.pt: the last one acknowledged)."""

    def __init__(self, daemon: LiveDaemon, ranks: int, files: int, size: int, interval: float):
        self.daemon, self.ranks, self.files, self.size, self.interval = daemon, ranks, files, size, interval
        self.acked: dict[str, str] = {}
        self.attempted = self.failed = self.failed_in_fault = 0
        self.errors: list[str] = []
        self.durations: dict[bool, list[float]] = {False: [], True: []}    # in_fault -> save seconds
        self.in_fault = False
        self.latest_written: set[str] = set()       # every latest.pt version a rank began to write
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rank, args=(r,), daemon=True) for r in range(ranks)]

    def _save(self, c, rank: int, step: int) -> dict[str, str]:
        done: dict[str, str] = {}
        base = f"rank{rank}/step_{step:06d}"
        retrying(c.mkdir, base)
        for i in range(self.files):
            data = payload(self.size, hash((rank, step, i)))
            write_file(c, f"{base}/shard{i}.pt", data)
            done[f"{base}/shard{i}.pt"] = sha(data)
        latest = f"rank{rank}/step={step}".encode() * 64
        with self._lock:
            self.latest_written.add(sha(latest))
        write_file(c, f"rank{rank}/latest.pt.tmp", latest)
        retrying(c.rename, f"rank{rank}/latest.pt.tmp", f"rank{rank}/latest.pt")
        done[f"rank{rank}/latest.pt"] = sha(latest)
        return done

    def _rank(self, rank: int) -> None:
        c = connect(self.daemon.nfs_port)
        try:
            retrying(c.mkdir, f"rank{rank}")
            step = 0
            while not self._stop.is_set():
                t0 = time.monotonic()
                in_fault = self.in_fault
                with self._lock:
                    self.attempted += 1
                try:
                    done = self._save(c, rank, step)
                except Exception as e:          # a failed save is a finding, counted and reported
                    with self._lock:
                        self.failed += 1
                        self.failed_in_fault += in_fault or self.in_fault
                        self.errors.append(f"rank {rank} step {step}: {e!r}")
                else:
                    with self._lock:
                        self.acked.update(done)
                        self.durations[in_fault].append(time.monotonic() - t0)
                step += 1
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        finally:
            c.close()

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(120)


class LatestWatch(BucketPoller):
    """While the loop runs, reads every rank's latest.pt straight from moto, round after round:
    once a key has held a checkpoint, finding it absent is a gap, and bytes of no version a
    rank wrote are mixed, and an older step after a newer one went backwards (what a job
    resuming from the bucket at that moment would meet)."""

    def __init__(self, s3, bucket: str, loop: SaveLoop):
        super().__init__()
        self.s3, self.bucket, self.loop = s3, bucket, loop
        self.keys = [f"{PREFIX}rank{r}/latest.pt" for r in range(loop.ranks)]
        self.reads = self.gaps = self.mixed = self.backwards = 0
        self.examples: list[str] = []
        self._seen: set[str] = set()
        self._step: dict[str, int] = {}         # key -> the latest step it has held

    def poll(self) -> None:
        for key in self.keys:
            body = object_bytes(self.s3, self.bucket, key)
            self.reads += 1
            if body is None:
                self.gaps += key in self._seen
                continue
            self._seen.add(key)
            with self.loop._lock:
                written = sha(body) in self.loop.latest_written
            if not written:
                self.mixed += 1
                if len(self.examples) < 5:
                    self.examples.append(f"{key}: {len(body)} bytes {body[:40]!r}")
                continue
            step = int(body.split(b"/step=", 2)[1].split(b"rank")[0])
            self.backwards += step < self._step.get(key, -1)
            self._step[key] = max(step, self._step.get(key, -1))


def slowest(durations: list[float]) -> str:
    return f"{max(durations):.2f}s" if durations else "-"


def peak_requests(proxy, window: float) -> int:
    """The most requests the gateway sent in any `window` seconds (every outcome, 503s too)."""
    times = sorted(r.t for r in proxy.requests(outcome=None))
    peak, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] < t - window:
            lo += 1
        peak = max(peak, hi - lo + 1)
    return peak


def lost_and_torn(s3, bucket: str, acked: dict[str, str]) -> tuple[list[str], list[str]]:
    lost, torn = [], []
    for path, digest in sorted(acked.items()):
        body = object_bytes(s3, bucket, PREFIX + path)
        if body is None:
            lost.append(path)
        elif sha(body) != digest:
            torn.append(path)
    return lost, torn


@pytest.mark.parametrize("fault", ["503x30%", "outage"])
def test_checkpoint_save_loop_through_s3_faults_loses_and_tears_nothing(
        gateway, proxy, s3, bucket, fault, capsys):
    gw = gateway("--upload-requests-per-second", str(REQUEST_LIMIT), "--upload-burst", str(BURST_SECONDS),
                 "--upload-settle", str(LOOP_SETTLE))
    p = LOOP
    loop = SaveLoop(gw, p["ranks"], p["files"], p["size"], p["interval"])
    with LatestWatch(s3, bucket, loop) as watch:
        with loop:
            # before the fault: the loop's steady state, at least `before` seconds and until every
            # rank has saved once (a busy host may take longer to get there)
            started = time.monotonic()
            wait_until(lambda: sum(k.endswith("latest.pt") for k in list(loop.acked)) == p["ranks"],
                       "every rank saved a checkpoint before the fault", timeout=120)
            time.sleep(max(0.0, p["before"] - (time.monotonic() - started)))
            loop.in_fault = True
            if fault == "outage":
                s3_off(proxy)
            else:
                proxy.faults.error_rate = 0.3
            time.sleep(p["fault"])          # the fault's duration: the scenario itself
            wait_until(lambda: proxy.requests(outcome="slowdown"), "the fault was met", timeout=60)
        recovered = time.monotonic()
        s3_on(proxy)
        loop.in_fault = False
        drain = flush_wait(gw, timeout=600)
        drain_from_recovery = time.monotonic() - recovered
    temp_writes = writes_naming(proxy, ".tmp")
    lost, torn = lost_and_torn(s3, bucket, loop.acked)
    slowdowns = len(proxy.requests(outcome="slowdown"))
    peak_1s, peak_5s = peak_requests(proxy, 1.0), peak_requests(proxy, 5.0)
    line = (f"S3-FAULT-RUN fault={fault} duration={p['fault']:.0f}s ranks={p['ranks']} "
            f"files/save={p['files']} file_size={p['size'] // 1024}KiB saves_attempted={loop.attempted} "
            f"saves_failed={loop.failed} failed_during_fault={loop.failed_in_fault} "
            f"acked_files={len(loop.acked)} s3_requests={len(proxy.requests(outcome=None))} "
            f"503s={slowdowns} drain_after_recovery={drain_from_recovery:.1f}s (flush --wait {drain:.1f}s) "
            f"peak_requests_1s={peak_1s} peak_requests_5s={peak_5s} "
            f"limit={REQUEST_LIMIT}/s+burst {BURST_SECONDS}s backoff_max={BACKOFF_MAX:g}s settle={LOOP_SETTLE:g}s "
            f"slowest_save={slowest(loop.durations[False])} slowest_save_in_fault={slowest(loop.durations[True])} "
            f"latest_reads={watch.reads} latest_gaps={watch.gaps} latest_mixed={watch.mixed} "
            f"latest_backwards={watch.backwards} "
            f"temp_name_writes={len(temp_writes)} lost={len(lost)} torn={len(torn)}")
    with capsys.disabled():
        print("\n" + line)
    assert slowdowns > 0, "the fault was never met"
    assert loop.failed == 0, loop.errors[:5]
    assert loop.attempted >= p["ranks"] * 2 and len(loop.acked) > 0
    assert lost == [] and torn == [], (lost[:10], torn[:10])
    assert watch.reads > 0 and watch.gaps == 0 and watch.mixed == 0, watch.examples
    assert watch.backwards == 0
    # a temp name may be uploaded when a save stalls past the settle window between close and
    # rename (that is what the window is for); the rename then moves it: none is left
    assert [k for k in bucket_keys(s3, bucket) if ".tmp" in k] == []
    # the token bucket holds over any 5 s (a 1 s window is at the mercy of scheduling jitter)
    assert peak_5s <= 5 * REQUEST_LIMIT + REQUEST_LIMIT * BURST_SECONDS + 10, peak_5s
