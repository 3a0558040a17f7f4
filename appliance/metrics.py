"""Prometheus metrics: NFS op accounting (fed by the server's observer hook), S3 request
accounting (fed by the object client's observer hook), and a Collector that reads the daemon's
live status at scrape time, so no value is kept twice.

The NFS server calls `OpStats.observe(op, status, seconds, nbytes)` once per operation
(NfsServer.observer; `op_stats()` gives the native loop's C counters instead when that loop
runs, the same snapshot without a Python call per op); the S3 client calls `S3Stats.observe(method, seconds, error_code)` once
per request (Boto3ObjectClient.observer); everything else (cache bytes, queue depth...) comes
from the status snapshot the admin `status` command also shows. Rates are left to Prometheus
(`rate(ckptgw_upload_bytes_total[5m])`): only counters and point-in-time gauges are exported.
The registry also carries the process_* and python_* collectors and ckptgw_build_info.
"""
from __future__ import annotations

import bisect
import threading
from platform import python_version
from typing import Callable, Protocol

from prometheus_client import (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry,
                               start_http_server)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

# NFS op latency buckets: sub-millisecond GETATTRs up to multi-second COMMITs of big files
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0)
# S3 request latency buckets: a HEAD on a near endpoint up to a large part over a slow link
S3_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
READ_OPS = frozenset({"READ"})
WRITE_OPS = frozenset({"WRITE"})


def _count_into(hist: dict[str, list], buckets: tuple, label: str, seconds: float) -> None:
    """Add one observation to hist[label] = [per-bucket counts..., +Inf count, sum] (under the
    caller's lock)."""
    h = hist.get(label)
    if h is None:
        h = hist[label] = [0] * (len(buckets) + 2)
    h[bisect.bisect_left(buckets, seconds)] += 1
    h[-1] += seconds


def _histogram_family(name: str, doc: str, label: str, hist: dict[str, list], buckets: tuple):
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, h in sorted(hist.items()):
        cumulative, out = 0, []
        for bound, n in zip(buckets, h):
            cumulative += n
            out.append((_le(bound), cumulative))
        cumulative += h[len(buckets)]
        out.append(("+Inf", cumulative))
        family.add_metric([value], out, sum_value=h[-1])
    return family


class OpStats:
    """Counts and latency histograms per NFS op. `observe` is the server's hook: it runs on
    the event loop for every op, so it does a few dict updates under a lock and nothing more."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}          # (op, status) -> n
        self.hist: dict[str, list] = {}                       # op -> [bucket counts..., +Inf, sum]
        self.bytes_read = 0
        self.bytes_written = 0

    def observe(self, op: str, status: str, seconds: float, nbytes: int = 0) -> None:
        op, status = str(op), str(status)
        with self._lock:
            key = (op, status)
            self.counts[key] = self.counts.get(key, 0) + 1
            _count_into(self.hist, BUCKETS, op, seconds)
            if nbytes:
                if op in READ_OPS:
                    self.bytes_read += nbytes
                elif op in WRITE_OPS:
                    self.bytes_written += nbytes

    __call__ = observe          # so the object itself can be handed over as `observer`

    def snapshot(self) -> dict:
        with self._lock:
            return {"counts": dict(self.counts), "hist": {k: list(v) for k, v in self.hist.items()},
                    "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}


class OpAccounting(Protocol):
    """What the server's observer hook and the scrape use: OpStats, or the native loop's
    nfsd.native.compound.OpCounters (held to OpStats by tests/appliance/test_metrics.py)."""

    def observe(self, op: str, status: str, seconds: float, nbytes: int = 0) -> None: ...

    def snapshot(self) -> dict: ...


def op_stats() -> OpAccounting:
    """The op accounting for the NFS server: the native COMPOUND loop counts into OpCounters'
    C arrays with no Python call per op (about 5 us of a LOOKUP COMPOUND's CPU went to
    OpStats.observe); the reference loop, when it runs, into OpStats."""
    from nfsd import native
    if native.engine("compound") == "native":
        from nfsd.native.compound import OpCounters
        return OpCounters(BUCKETS)
    return OpStats()


def s3_operation(method: str) -> str:
    """boto3's method name as S3's API operation: "put_object" -> "PutObject"."""
    return "".join(part[:1].upper() + part[1:] for part in method.split("_"))


class S3Stats:
    """Latency histogram per S3 operation and failures per (operation, error code): every
    request, by every part of the daemon (uploads, read-through, retention, verify), whatever
    its outcome. The hook runs on the S3 worker threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.hist: dict[str, list] = {}
        self.failures: dict[tuple[str, str], int] = {}

    def observe(self, method: str, seconds: float, error_code: str | None = None) -> None:
        op = s3_operation(method)
        with self._lock:
            _count_into(self.hist, S3_BUCKETS, op, seconds)
            if error_code is not None:
                key = (op, str(error_code))
                self.failures[key] = self.failures.get(key, 0) + 1

    __call__ = observe

    def snapshot(self) -> dict:
        with self._lock:
            return {"hist": {k: list(v) for k, v in self.hist.items()}, "failures": dict(self.failures)}


class StatusCollector:
    """prometheus_client Collector over the live status, the op stats and the S3 stats."""

    def __init__(self, status: Callable[[], dict], ops: OpAccounting, s3: S3Stats | None = None):
        self._status = status
        self._ops = ops
        self._s3 = s3 or S3Stats()

    def describe(self):
        return []          # unchecked collector: the set of metrics is known only at scrape

    def collect(self):
        ops = self._ops.snapshot()
        total = CounterMetricFamily("ckptgw_nfs_ops", "NFS operations by op and result status",
                                    labels=["op", "status"])
        for (op, status), n in sorted(ops["counts"].items()):
            total.add_metric([op, status], n)
        yield total
        yield _histogram_family("ckptgw_nfs_op_duration_seconds", "NFS operation latency", "op",
                                ops["hist"], BUCKETS)
        s3 = self._s3.snapshot()
        yield _histogram_family("ckptgw_s3_request_duration_seconds", "S3 request latency (to the "
                                "response headers), every request whatever its outcome, by operation",
                                "operation", s3["hist"], S3_BUCKETS)
        failures = CounterMetricFamily("ckptgw_s3_request_failures", "S3 requests that failed, by operation "
                                       "and error code (SlowDown, AccessDenied, 503, NoSuchKey...)",
                                       labels=["operation", "code"])
        for (op, code), n in sorted(s3["failures"].items()):
            failures.add_metric([op, code], n)
        yield failures
        # the same requests the histogram counts (its +Inf bucket), so a ratio of failures or
        # throttles to it stays defined when every request fails
        reqs = CounterMetricFamily("ckptgw_s3_requests", "S3 requests sent, every request whatever its "
                                   "outcome (success, throttle, error), by operation", labels=["operation"])
        for op, h in sorted(s3["hist"].items()):
            reqs.add_metric([op], sum(h[:-1]))
        yield reqs
        yield CounterMetricFamily("ckptgw_nfs_read_bytes", "Bytes returned by NFS READ", value=ops["bytes_read"])
        yield CounterMetricFamily("ckptgw_nfs_written_bytes", "Bytes received by NFS WRITE",
                                  value=ops["bytes_written"])

        st = self._status()
        info = GaugeMetricFamily("ckptgw_build_info", "Always 1; the labels say what is running",
                                 labels=["version", "store_format", "python"])
        info.add_metric([str(st.get("version", "")), str(st.get("store_format", "")), python_version()], 1)
        yield info
        nfs, cache, up = st.get("nfs", {}), st.get("cache", {}), st.get("upload", {})
        yield GaugeMetricFamily("ckptgw_nfs_clients", "NFS clients with state", value=nfs.get("clients", 0))
        by_state = GaugeMetricFamily("ckptgw_cache_bytes", "Bytes in the local cache by data state",
                                     labels=["state"])
        for state, n in sorted((cache.get("bytes_by_state") or {}).items()):
            by_state.add_metric([state], n)
        yield by_state
        if cache.get("capacity") is not None:
            yield GaugeMetricFamily("ckptgw_cache_capacity_bytes", "Configured cache capacity",
                                    value=cache["capacity"])
        if cache.get("used") is not None:
            yield GaugeMetricFamily("ckptgw_cache_used_bytes", "Bytes the cache occupies locally",
                                    value=cache["used"])
        if cache.get("high_watermark") is not None:
            yield GaugeMetricFamily("ckptgw_cache_high_watermark_bytes", "Eviction starts above this",
                                    value=cache["high_watermark"])
            yield GaugeMetricFamily("ckptgw_cache_low_watermark_bytes", "Eviction goes down to this",
                                    value=cache["low_watermark"])
        yield from _upload_families(up)
        yield CounterMetricFamily("ckptgw_cache_read_through_bytes", "Bytes read through from S3 into the cache "
                                  "for reads of evicted data", value=_first(up, "bytes_fetched"))
        yield CounterMetricFamily("ckptgw_cache_evicted_bytes", "Bytes of clean data the evictor freed from the "
                                  "cache", value=_first(up, "evicted_bytes"))
        if st.get("pair") is not None:
            yield from _pair_families(st["pair"])


def _pair_families(pair: dict):
    """An HA pair's replication state (appliance/pair.py), when [pair] drbd_device is set."""
    yield GaugeMetricFamily("ckptgw_pair_degraded", "1 while the HA pair is not redundant: the peer not "
                            "connected, a resync running or a disk not UpToDate (acknowledged writes are "
                            "then on this node's disk only), or a DRBD fence constraint left after the "
                            "resync (a failover would be refused); 0 in sync", value=1 if pair["degraded"] else 0)
    yield GaugeMetricFamily("ckptgw_pair_peer_connected", "1 while DRBD is connected to the peer",
                            value=1 if pair["peer_connected"] else 0)
    if pair.get("out_of_sync_bytes") is not None:
        yield GaugeMetricFamily("ckptgw_pair_out_of_sync_bytes", "Bytes DRBD still has to copy to the peer",
                                value=pair["out_of_sync_bytes"])
    fences = pair.get("fence_constraints")
    yield GaugeMetricFamily("ckptgw_pair_fence_constraints", "DRBD fence constraints (drbd-fence-by-handler-*) "
                            "in the CIB: expected while the peer is away or resyncing, one left once in sync "
                            "refuses a failover; -1 while they cannot be read (ckptgw status says why)",
                            value=-1 if fences is None else len(fences))
    info = GaugeMetricFamily("ckptgw_pair_info", "Always 1; the labels say the pair's DRBD state",
                             labels=["device", "state", "connection", "role", "peer_role", "disk", "peer_disk"])
    info.add_metric([str(pair.get(k) or "") for k in ("device", "state", "connection", "role", "peer_role",
                                                       "disk", "peer_disk")], 1)
    yield info


def _first(d: dict, *keys: str, default=0):
    """The first of keys present (and not None) in d, else default."""
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return default


def _upload_families(up: dict):
    """The uploader's series, all ckptgw_upload_*: its queue, its AIMD request limiter and its
    counters (status["upload"]; the S3 requests themselves are the ckptgw_s3_* series)."""
    gauges = (
        ("queue_depth", "Uploader jobs waiting (uploads and namespace mirroring)", ("queue_depth",)),
        ("oldest_dirty_age_seconds", "Age of the oldest data not yet in S3", ("oldest_dirty_age_seconds",)),
        ("jobs_running", "Uploader jobs being worked on now", ("jobs_running",)),
        ("concurrency_limit", "The uploader's adaptive (AIMD) limit on S3 requests in flight: cut on "
         "throttling, raised on success, at most [upload] max_concurrency", ("concurrency_limit",)),
        ("requests_in_flight", "S3 requests of the uploader in flight now", ("requests_in_flight",)),
        ("requests_waiting_retry", "S3 requests of the uploader waiting out a backoff before their retry",
         ("requests_waiting_retry",)),
    )
    for name, doc, keys in gauges:
        yield GaugeMetricFamily(f"ckptgw_upload_{name}", doc, value=_first(up, *keys) or 0.0)
    yield GaugeMetricFamily("ckptgw_upload_foreground_ceiling",
                            "1 while the drain yields to clients saving or reading "
                            "([upload] foreground_concurrency)",
                            value=1.0 if up.get("foreground_ceiling") else 0.0)
    counters = (
        ("bytes", "Payload bytes uploaded to S3 (successful PutObject and UploadPart)",
         ("bytes_uploaded",)),
        ("sent_bytes", "Payload bytes sent to S3 by every upload attempt, retries included",
         ("bytes_sent",)),
        ("copied_bytes", "Bytes S3 copied server-side (CopyObject, UploadPartCopy) instead of an upload",
         ("bytes_copied",)),
        ("files", "Files uploaded (each new version of a file counts once)", ("uploads_done",)),
        ("errors", "Uploads that failed permanently (retried later)", ("permanent_errors",)),
        ("retries", "S3 requests of the uploader retried (after a throttle or a transient error)",
         ("retries",)),
        ("throttles", "S3 requests of the uploader throttled (503 SlowDown and the like); each is also "
         "counted in ckptgw_s3_requests_total", ("throttles",)),
    )
    for name, doc, keys in counters:
        yield CounterMetricFamily(f"ckptgw_upload_{name}", doc, value=_first(up, *keys))
    ns = CounterMetricFamily("ckptgw_upload_namespace_ops", "Renames and removals mirrored to S3 "
                             "(a move is a copy and a delete of the object)", labels=["op"])
    ns.add_metric(["move"], _first(up, "moves_done"))
    ns.add_metric(["delete"], _first(up, "deletes_done"))
    yield ns


def _le(bound: float) -> str:
    return repr(float(bound))


class MetricsServer:
    """The /metrics HTTP endpoint (prometheus_client's threaded server)."""

    def __init__(self, address: tuple[str, int], status: Callable[[], dict], ops: OpAccounting,
                 s3: S3Stats | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status, ops, s3))
        # what prometheus_client's default registry has: process_* (CPU, RSS, fds, start time),
        # python_info and python_gc_* (the same collector objects: they keep no state)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.address = address
        self._server = None
        self._thread = None

    def start(self) -> tuple[str, int]:
        self._server, self._thread = start_http_server(self.address[1], addr=self.address[0],
                                                       registry=self.registry)
        return self._server.server_address[:2]

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
