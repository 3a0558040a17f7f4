"""The fault proxy itself: transparent when quiet, and each fault reaches boto3 as intended."""
import time

import pytest

from uploader.objectclient import (Boto3ObjectClient, ThrottledError, TransientError, checksum_b64)
from uploader.settings import S3Settings


def _client(endpoint, bucket="fpb", read_timeout=2.0):
    s = S3Settings(bucket=bucket, endpoint_url=endpoint, access_key="testing", secret_key="testing",
                   addressing_style="path", read_timeout=read_timeout, connect_timeout=2.0)
    return Boto3ObjectClient(s)


@pytest.fixture
def bucket(moto):
    c = _client(moto.endpoint)
    try:
        c._s3.create_bucket(Bucket="fpb")
    except c._s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    return "fpb"


def test_proxy_is_transparent_and_records(proxy, bucket):
    c = _client(proxy.endpoint)
    data = bytes(range(256)) * 4096
    c.put_object("t/a", data, metadata={"mode": "33188"}, checksum=checksum_b64("CRC32", data))
    assert c.get_range("t/a", 1000, 5000) == data[1000:6000]
    assert c.head_object("t/a").metadata == {"mode": "33188"}
    assert c.head_object("t/missing") is None
    puts = proxy.requests("PUT")
    assert len(puts) == 1 and puts[0].body_bytes >= len(data) and puts[0].status == 200


def test_proxy_slowdown_and_reset(proxy, bucket):
    c = _client(proxy.endpoint)
    proxy.faults.error_rate = 1.0
    with pytest.raises(ThrottledError):
        c.head_object("t/x")
    proxy.faults.error_rate, proxy.faults.reset_rate = 0.0, 1.0
    with pytest.raises(TransientError) as ei:
        c.head_object("t/x")
    assert not isinstance(ei.value, ThrottledError)
    proxy.clear()
    assert c.head_object("t/x") is None
    outcomes = [r.outcome for r in proxy.requests(outcome=None)]
    assert outcomes == ["slowdown", "reset", "forwarded"]


def test_proxy_blackhole_times_out_then_recovers(proxy, bucket):
    c = _client(proxy.endpoint, read_timeout=0.5)
    proxy.blackhole(1.5)
    t0 = time.monotonic()
    with pytest.raises(TransientError):
        c.head_object("t/y")
    assert proxy.requests(outcome="blackholed")
    while time.monotonic() - t0 < 1.6:
        time.sleep(0.1)
    assert c.head_object("t/y") is None
