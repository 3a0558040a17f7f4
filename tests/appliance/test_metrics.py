"""Metrics: op accounting from the observer hook, a collector over live status, a real scrape."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from appliance.metrics import MetricsServer, OpStats


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
              "upload": {"queue_depth": 4, "oldest_dirty_age_s": 12.5, "requests": {"PutObject": 7},
                         "retries": 3, "throttles": 1, "uploaded_bytes": 4096}}
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
        assert m[("ckptgw_oldest_dirty_age_seconds", ())] == 12.5
        assert m[("ckptgw_s3_requests_total", (("kind", "PutObject"),))] == 7
        assert m[("ckptgw_s3_retries_total", ())] == 3
        assert m[("ckptgw_s3_throttles_total", ())] == 1
        assert m[("ckptgw_uploaded_bytes_total", ())] == 4096
        assert m[("ckptgw_nfs_clients", ())] == 2
        # live: the next scrape sees the status as it is now, nothing cached or double counted
        status["upload"]["queue_depth"] = 0
        ops("WRITE", "NFS4_OK", 0.001, 10)
        m = scrape(address)
        assert m[("ckptgw_upload_queue_depth", ())] == 0
        assert m[("ckptgw_nfs_ops_total", (("op", "WRITE"), ("status", "NFS4_OK")))] == 3
    finally:
        server.stop()
