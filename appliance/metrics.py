"""Prometheus metrics: NFS op accounting (fed by the server's observer hook) and a Collector
that reads the daemon's live status at scrape time, so no value is kept twice.

The NFS server calls `OpStats.observe(op, status, seconds, nbytes)` once per operation
(NfsServer.observer); everything else (cache bytes, queue depth, S3 requests...) comes from
the status snapshot the admin `status` command also shows.
"""
from __future__ import annotations

import bisect
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

# NFS op latency buckets: sub-millisecond GETATTRs up to multi-second COMMITs of big files
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0)
READ_OPS = frozenset({"READ"})
WRITE_OPS = frozenset({"WRITE"})


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
            h = self.hist.get(op)
            if h is None:
                h = self.hist[op] = [0] * (len(BUCKETS) + 2)
            h[bisect.bisect_left(BUCKETS, seconds)] += 1
            h[-1] += seconds
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


class StatusCollector:
    """prometheus_client Collector over the live status and the op stats."""

    def __init__(self, status: Callable[[], dict], ops: OpStats):
        self._status = status
        self._ops = ops

    def describe(self):
        return []          # unchecked collector: the set of metrics is known only at scrape

    def collect(self):
        ops = self._ops.snapshot()
        total = CounterMetricFamily("ckptgw_nfs_ops", "NFS operations by op and result status",
                                    labels=["op", "status"])
        for (op, status), n in sorted(ops["counts"].items()):
            total.add_metric([op, status], n)
        yield total
        dur = HistogramMetricFamily("ckptgw_nfs_op_duration_seconds", "NFS operation latency", labels=["op"])
        for op, h in sorted(ops["hist"].items()):
            cumulative, buckets = 0, []
            for bound, n in zip(BUCKETS, h):
                cumulative += n
                buckets.append((_le(bound), cumulative))
            cumulative += h[len(BUCKETS)]
            buckets.append(("+Inf", cumulative))
            dur.add_metric([op], buckets, sum_value=h[-1])
        yield dur
        yield CounterMetricFamily("ckptgw_nfs_read_bytes", "Bytes returned by NFS READ", value=ops["bytes_read"])
        yield CounterMetricFamily("ckptgw_nfs_written_bytes", "Bytes received by NFS WRITE",
                                  value=ops["bytes_written"])

        st = self._status()
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
        yield GaugeMetricFamily("ckptgw_upload_queue_depth", "Files and jobs waiting for upload",
                                value=up.get("queue_depth", 0))
        yield GaugeMetricFamily("ckptgw_oldest_dirty_age_seconds", "Age of the oldest data not yet in S3",
                                value=up.get("oldest_dirty_age_s") or 0.0)
        yield GaugeMetricFamily("ckptgw_upload_rate_bytes_per_second", "Recent upload throughput",
                                value=up.get("rate_bytes_per_s") or 0.0)
        reqs = CounterMetricFamily("ckptgw_s3_requests", "S3 requests sent, by kind", labels=["kind"])
        for kind, n in sorted((up.get("requests") or {}).items()):
            reqs.add_metric([kind], n)
        yield reqs
        yield CounterMetricFamily("ckptgw_s3_retries", "S3 requests retried", value=up.get("retries", 0))
        yield CounterMetricFamily("ckptgw_s3_throttles", "S3 requests throttled (503 SlowDown and the like)",
                                  value=up.get("throttles", 0))
        yield CounterMetricFamily("ckptgw_uploaded_bytes", "Payload bytes uploaded to S3",
                                  value=up.get("uploaded_bytes", 0))
        yield CounterMetricFamily("ckptgw_upload_errors", "Upload attempts that failed",
                                  value=up.get("errors", 0))


def _le(bound: float) -> str:
    return repr(float(bound))


class MetricsServer:
    """The /metrics HTTP endpoint (prometheus_client's threaded server)."""

    def __init__(self, address: tuple[str, int], status: Callable[[], dict], ops: OpStats):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status, ops))
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
