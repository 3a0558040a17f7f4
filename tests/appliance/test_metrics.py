"""Metrics: op accounting from the observer hook, a collector over live status, a real scrape."""
from __future__ import annotations

import urllib.request

import pytest
from hypothesis import given, settings, strategies as st

from prometheus_client.parser import text_string_to_metric_families

from appliance.metrics import BUCKETS, MetricsServer, OpStats, op_stats


def scrape(address) -> dict:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:
        body = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_scrape_reads_live_status_and_op_stats():
    status = {"nfs": {"clients": 2},
              "cache": {"capacity": 1000, "used": 600, "bytes_by_state": {"dirty": 100, "clean": 500}},
              "upload": {"queue_depth": 4, "oldest_dirty_age_seconds": 12.5, "requests": {"PutObject": 7},
                         "foreground_ceiling": True,
                         "retries": 3, "throttles": 1, "bytes_uploaded": 4096}}
    ops = OpStats()
    ops.observe("WRITE", "NFS4_OK", 0.002, 1 << 20)
    ops("WRITE", "NFS4_OK", 0.004, 1 << 20)                 # the object itself is the hook
    ops("READ", "NFS4_OK", 0.0001, 4096)
    ops("OPEN", "NFS4ERR_NOENT", 0.0003)
    server = MetricsServer(("127.0.0.1", 0), lambda: status, ops)
    address = server.start()
    try:
        m = scrape(address)
        assert m[("ckptgw_nfs_ops_total", (("op", "WRITE"), ("status", "NFS4_OK")))] == 2
        assert m[("ckptgw_nfs_ops_total", (("op", "OPEN"), ("status", "NFS4ERR_NOENT")))] == 1
        assert m[("ckptgw_nfs_op_duration_seconds_count", (("op", "WRITE"),))] == 2
        assert abs(m[("ckptgw_nfs_op_duration_seconds_sum", (("op", "WRITE"),))] - 0.006) < 1e-9
        assert m[("ckptgw_nfs_op_duration_seconds_bucket", (("le", "0.0025"), ("op", "WRITE")))] == 1
        assert m[("ckptgw_nfs_op_duration_seconds_bucket", (("le", "+Inf"), ("op", "WRITE")))] == 2
        assert m[("ckptgw_nfs_written_bytes_total", ())] == 2 << 20
        assert m[("ckptgw_nfs_read_bytes_total", ())] == 4096
        assert m[("ckptgw_cache_bytes", (("state", "dirty"),))] == 100
        assert m[("ckptgw_upload_queue_depth", ())] == 4
        assert m[("ckptgw_upload_oldest_dirty_age_seconds", ())] == 12.5
        assert m[("ckptgw_upload_foreground_ceiling", ())] == 1
        # the uploader's count of successes ("requests" in status) is not what the counter exports
        assert not [k for k in m if k[0] == "ckptgw_s3_requests_total"]
        assert m[("ckptgw_upload_retries_total", ())] == 3
        assert m[("ckptgw_upload_throttles_total", ())] == 1
        assert m[("ckptgw_upload_bytes_total", ())] == 4096
        assert m[("ckptgw_nfs_clients", ())] == 2
        # live: the next scrape sees the status as it is now, nothing cached or double counted
        status["upload"]["queue_depth"] = 0
        ops("WRITE", "NFS4_OK", 0.001, 10)
        m = scrape(address)
        assert m[("ckptgw_upload_queue_depth", ())] == 0
        assert m[("ckptgw_nfs_ops_total", (("op", "WRITE"), ("status", "NFS4_OK")))] == 3
    finally:
        server.stop()


def test_process_build_info_and_s3_request_metrics():
    import platform

    from appliance.metrics import S3Stats
    s3 = S3Stats()
    s3.observe("put_object", 0.02)
    s3("upload_part", 0.3)
    s3("upload_part", 7.0, "SlowDown")
    s3("head_object", 0.004, "404")
    status = {"version": "9.9.9", "store_format": "ckptgw-store/1",
              "upload": {"bytes_uploaded": 10, "rate_bytes_per_s": 123.0}}
    server = MetricsServer(("127.0.0.1", 0), lambda: status, OpStats(), s3)
    address = server.start()
    try:
        m = scrape(address)
    finally:
        server.stop()
    # the process collector of a fresh registry: CPU, RSS, open fds, start time
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert m[(name, ())] > 0, name
    info = [k for k in m if k[0] == "ckptgw_build_info"]
    assert info == [("ckptgw_build_info", (("python", platform.python_version()),
                                           ("store_format", "ckptgw-store/1"), ("version", "9.9.9")))]
    assert m[info[0]] == 1
    # S3 latency by operation (every request) and failures by operation and code
    assert m[("ckptgw_s3_request_duration_seconds_count", (("operation", "UploadPart"),))] == 2
    assert m[("ckptgw_s3_request_duration_seconds_bucket", (("le", "0.5"), ("operation", "UploadPart")))] == 1
    assert m[("ckptgw_s3_request_duration_seconds_bucket", (("le", "10.0"), ("operation", "UploadPart")))] == 2
    assert m[("ckptgw_s3_request_duration_seconds_count", (("operation", "PutObject"),))] == 1
    assert m[("ckptgw_s3_request_failures_total", (("code", "SlowDown"), ("operation", "UploadPart")))] == 1
    assert m[("ckptgw_s3_request_failures_total", (("code", "404"), ("operation", "HeadObject")))] == 1
    # every request sent, whatever its outcome: the throttled UploadPart and the failed HEAD
    # count, so throttles / requests is defined when every request is throttled
    assert m[("ckptgw_s3_requests_total", (("operation", "UploadPart"),))] == 2
    assert m[("ckptgw_s3_requests_total", (("operation", "HeadObject"),))] == 1
    assert m[("ckptgw_s3_requests_total", (("operation", "PutObject"),))] == 1
    for (name, labels), value in m.items():
        if name == "ckptgw_s3_requests_total":
            assert m[("ckptgw_s3_request_duration_seconds_count", labels)] == value
    # one label name for the S3 operation on every S3 series
    s3_labels = {k for name, labels in m if name.startswith("ckptgw_s3_") for k, _ in labels}
    assert s3_labels <= {"operation", "code", "le"}, s3_labels
    # counters, not rates computed in the daemon: Prometheus' rate() of the _total
    assert m[("ckptgw_upload_bytes_total", ())] == 10
    assert not [k for k in m if "rate" in k[0]]


def uploader_status(**values) -> dict:
    """status["upload"] as the daemon builds it: the uploader's own status (its counters under
    their own names, one name a value) and the daemon's rate."""
    from uploader.stats import Counters
    up = {"running": True, "queue_depth": 0, "queued_uploads": 0, "queued_namespace_ops": 0, "jobs_running": 0,
          "oldest_dirty_age_seconds": 0.0, "dirty_bytes": 0, "uploading": [], "concurrency_limit": 8.0,
          "foreground_ceiling": False, "requests_in_flight": 0, "requests_waiting_retry": 0,
          "permanent_error": None, **Counters().as_dict(), "rate_bytes_per_s": 0.0}
    up.update(values)
    return up


# what status --json knows that is deliberately not a metric, and why
NOT_EXPORTED = {
    "running", "permanent_error", "last_error", "last_errors", "uploading",   # text / per-file detail
    "rate_bytes_per_s",                      # a rate: rate(ckptgw_upload_bytes_total[5m])
    "requests", "requests_total", "failures",  # the uploader's successes and failures: ckptgw_s3_* count all
    "dirty_bytes",                           # ckptgw_cache_bytes{state="dirty"}
    "queued_uploads", "queued_namespace_ops",  # ckptgw_upload_queue_depth is their sum
    "uploads_copied", "uploads_aborted", "parts_resumed", "orphans_aborted", "imported",   # rare events, journal
}


def test_what_status_knows_about_the_uploader_is_exported():
    """The uploader's adaptive concurrency limit, requests in flight, read-through and evicted
    bytes, and its counters, all under ckptgw_upload_* (the cache's under ckptgw_cache_*)."""
    up = uploader_status(queue_depth=5, jobs_running=2, oldest_dirty_age_seconds=30.0,
                         concurrency_limit=3.5, requests_in_flight=3, requests_waiting_retry=1,
                         bytes_uploaded=4096, bytes_sent=5000, bytes_copied=700,
                         bytes_fetched=123456, evicted_bytes=654321, uploads_done=4, moves_done=2,
                         deletes_done=1, permanent_errors=6, retries=7, throttles=8)
    server = MetricsServer(("127.0.0.1", 0), lambda: {"upload": up}, OpStats())
    address = server.start()
    try:
        m = scrape(address)
    finally:
        server.stop()
    expected = {
        "ckptgw_upload_queue_depth": 5, "ckptgw_upload_jobs_running": 2,
        "ckptgw_upload_oldest_dirty_age_seconds": 30.0, "ckptgw_upload_concurrency_limit": 3.5,
        "ckptgw_upload_requests_in_flight": 3, "ckptgw_upload_requests_waiting_retry": 1,
        "ckptgw_upload_foreground_ceiling": 0, "ckptgw_upload_bytes_total": 4096,
        "ckptgw_upload_sent_bytes_total": 5000, "ckptgw_upload_copied_bytes_total": 700,
        "ckptgw_upload_files_total": 4, "ckptgw_upload_errors_total": 6, "ckptgw_upload_retries_total": 7,
        "ckptgw_upload_throttles_total": 8, "ckptgw_cache_read_through_bytes_total": 123456,
        "ckptgw_cache_evicted_bytes_total": 654321,
    }
    for name, value in expected.items():
        assert m[(name, ())] == value, name
    assert m[("ckptgw_upload_namespace_ops_total", (("op", "move"),))] == 2
    assert m[("ckptgw_upload_namespace_ops_total", (("op", "delete"),))] == 1
    # one prefix: the old names are gone (no value under two names)
    for old in ("ckptgw_uploaded_bytes_total", "ckptgw_oldest_dirty_age_seconds", "ckptgw_s3_retries_total",
                "ckptgw_s3_throttles_total"):
        assert not [k for k in m if k[0] == old], old
    # every number the uploader's status has is a metric here, or deliberately not one: each
    # gets a value of its own, which must turn up in the scrape
    numbers = [k for k, v in uploader_status().items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in NOT_EXPORTED]
    distinct = uploader_status(**{k: 1000 + i for i, k in enumerate(numbers)})
    server = MetricsServer(("127.0.0.1", 0), lambda: {"upload": distinct}, OpStats())
    address = server.start()
    try:
        exported_values = set(scrape(address).values())
    finally:
        server.stop()
    unexported = [k for k in numbers if distinct[k] not in exported_values]
    assert not unexported, f"in status --json but no metric: {unexported}"


def test_the_uploaders_series_read_one_name_each():
    """status["upload"] named a value two ways (oldest_dirty_age_s / _seconds, uploaded_bytes /
    bytes_uploaded, errors / permanent_errors); it keeps the uploader's name, the one with the unit
    spelled out, and the metric reads that one only."""
    for up, want in (({"oldest_dirty_age_seconds": 9.0, "bytes_uploaded": 11, "permanent_errors": 2}, (9.0, 11, 2)),
                     ({"oldest_dirty_age_s": 9.0, "uploaded_bytes": 11, "errors": 2}, (0.0, 0, 0))):
        server = MetricsServer(("127.0.0.1", 0), lambda: {"upload": up}, OpStats())
        address = server.start()
        try:
            m = scrape(address)
        finally:
            server.stop()
        got = (m[("ckptgw_upload_oldest_dirty_age_seconds", ())], m[("ckptgw_upload_bytes_total", ())],
               m[("ckptgw_upload_errors_total", ())])
        assert got == want, up


def test_the_object_client_reports_every_request_to_its_observer():
    from uploader.objectclient import Boto3ObjectClient, TransientError
    from uploader.settings import S3Settings
    seen = []
    client = Boto3ObjectClient(S3Settings(bucket="bkt", endpoint_url="http://127.0.0.1:1", access_key="a",
                                          secret_key="s", connect_timeout=2.0, read_timeout=2.0))
    client.observer = lambda *a: seen.append(a)
    with pytest.raises(TransientError):                 # nothing listens on port 1
        client.get_range("k", 0, 10)
    assert len(seen) == 1 and seen[0][0] == "get_object" and seen[0][2] == "EndpointConnectionError"

    class Stub:                                         # a request that succeeds
        def delete_object(self, **kw):
            return {}
    client._s3 = Stub()
    client.delete_object("k")
    assert seen[1][0] == "delete_object" and seen[1][2] is None and seen[1][1] >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["LOOKUP", "READ", "WRITE", "GETATTR", "COMMIT"]),
    st.sampled_from(["NFS4_OK", "NFS4ERR_NOENT", "NFS4ERR_NOSPC", "4242"]),
    st.one_of(st.sampled_from([0.0, 0.0001, 0.00025, 10.0]), st.floats(0, 100)),
    st.integers(0, 1 << 20)), max_size=40))
def test_the_native_op_counters_keep_what_opstats_keeps(observations):
    """nfsd/native/compound.pyx OpCounters (what op_stats() gives the daemon when the native
    loop runs) against OpStats, the reference: the same snapshot, bucket edges included."""
    compound = pytest.importorskip("nfsd.native.compound")
    native, reference = compound.OpCounters(BUCKETS), OpStats()
    for op, status, seconds, nbytes in observations:
        native.observe(op, status, seconds, nbytes)
        reference.observe(op, status, seconds, nbytes)
    assert native.snapshot() == reference.snapshot()


def test_the_daemon_counts_ops_natively_when_the_native_loop_runs(monkeypatch):
    from nfsd import native
    if native.engine("compound") == "native":
        assert type(op_stats()).__name__ == "OpCounters"
    monkeypatch.setenv("CKPTGW_ENGINE", "python")
    assert isinstance(op_stats(), OpStats)
