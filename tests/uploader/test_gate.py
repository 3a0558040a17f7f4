"""RequestGate: endless retries for transient errors, AIMD on throttles, permanent errors surface."""
import asyncio

import pytest

from uploader.gate import RequestGate
from uploader.objectclient import NotFoundError, PermanentError, ThrottledError, TransientError
from uploader.settings import UploadSettings
from uploader.stats import Counters


def _gate(**over):
    s = UploadSettings(max_concurrency=8, backoff_base=0.001, backoff_max=0.005, **over)
    return RequestGate(s, Counters())


def test_transient_and_throttle_errors_are_retried_until_success():
    gate = _gate()
    failures = [ThrottledError("SlowDown", status=503), TransientError("ConnectionClosedError"),
                ThrottledError("SlowDown", status=503)] * 5
    calls = []

    def fn():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    try:
        assert asyncio.run(gate.call("PutObject", fn, nbytes=10)) == "ok"
    finally:
        gate.close()
    c = gate.counters
    assert len(calls) == 16 and c.retries == 15 and c.throttles == 10
    assert c.requests["PutObject"] == 1 and c.bytes_sent == 160
    assert gate.limiter.limit < 8                       # throttles cut the concurrency
    assert gate.limiter.in_flight == 0


@pytest.mark.parametrize("err", [PermanentError("AccessDenied", status=403), NotFoundError("NoSuchKey")])
def test_permanent_and_not_found_errors_are_not_retried(err):
    gate = _gate()
    calls = []

    def fn():
        calls.append(1)
        raise err

    try:
        with pytest.raises(type(err)):
            asyncio.run(gate.call("GetObject", fn))
    finally:
        gate.close()
    assert len(calls) == 1 and gate.counters.retries == 0 and gate.limiter.in_flight == 0


def test_unexpected_exceptions_are_classified_transient():
    gate = _gate()
    seen = []

    def fn():
        seen.append(1)
        if len(seen) < 3:
            raise OSError("connection reset by peer")
        return 7

    try:
        assert asyncio.run(gate.call("HeadObject", fn)) == 7
    finally:
        gate.close()
    assert gate.counters.retries == 2


def test_max_attempts_hands_the_transient_error_back():
    gate = _gate()
    calls = []

    def fn():
        calls.append(1)
        raise TransientError("InternalError", status=500)

    try:
        with pytest.raises(TransientError):
            asyncio.run(gate.call("UploadPart", fn, max_attempts=3))
    finally:
        gate.close()
    assert len(calls) == 3 and gate.counters.retries == 2


def test_errors_not_from_s3_are_not_retried():
    from cache.api import StoreError
    gate = _gate()
    calls = []

    def fn():
        calls.append(1)
        raise StoreError(116, "inode 5 is gone")

    try:
        with pytest.raises(StoreError):
            asyncio.run(gate.call("PutObject", fn))
        with pytest.raises(ZeroDivisionError):
            asyncio.run(gate.call("PutObject", lambda: 1 / 0))
    finally:
        gate.close()
    assert len(calls) == 1 and gate.counters.retries == 0 and gate.limiter.in_flight == 0
