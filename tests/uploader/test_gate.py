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


def _counting_tokens(gate) -> list:
    taken = []
    take = gate.requests.take

    async def counted(n=1):
        taken.append(n)
        return await take(n)

    gate.requests.take = counted
    return taken


@pytest.mark.parametrize("err", [ThrottledError("SlowDown", status=503), ThrottledError("ServiceUnavailable", status=503),
                                 TransientError("BadDigest", status=400), TransientError("RequestTimeout", status=400),
                                 TransientError("EndpointConnectionError")])
def test_a_refused_attempt_is_retried_without_a_recheck(err):
    """A throttle (503 SlowDown) or another answer that says S3 did not apply the request:
    nothing can have been stored, so no HEAD before the retry (issue 38's recheck, which
    553abfe made on every retry, doubled the requests under SlowDown)."""
    gate = _gate()
    taken = _counting_tokens(gate)
    sends, checks = [], []

    def fn():
        sends.append(1)
        if len(sends) < 3:
            raise err
        return "sent"

    try:
        assert asyncio.run(gate.call("PutObject", fn, recheck=lambda: checks.append(1))) == "sent"
    finally:
        gate.close()
    assert len(sends) == 3 and checks == [] and len(taken) == 3
    assert "HeadObject" not in gate.counters.requests


@pytest.mark.parametrize("err", [TransientError("ReadTimeoutError"), TransientError("ConnectionClosedError"),
                                 TransientError("InternalError", status=500), TransientError("504", status=504)])
@pytest.mark.parametrize("found", [None, "adopted"])
def test_an_attempt_that_may_have_been_applied_is_rechecked_once_through_the_gate(err, found):
    """A timeout, a reset after sending, a 500: S3 may have stored it. The recheck runs once
    before the retry as a request of its own (a request token, counted as HeadObject); what it
    finds ends the call, None sends again."""
    gate = _gate()
    taken = _counting_tokens(gate)
    sends, checks = [], []

    def fn():
        sends.append(len(taken))
        if len(sends) == 1:
            raise err
        return "sent"

    def recheck():
        checks.append(len(taken))
        return found

    try:
        result = asyncio.run(gate.call("PutObject", fn, recheck=recheck))
    finally:
        gate.close()
    c = gate.counters
    assert checks == [2]                                # after its own token (the 2nd taken)
    assert c.requests["HeadObject"] == 1
    if found:
        assert result == "adopted" and sends == [1] and len(taken) == 2 and "PutObject" not in c.requests
    else:
        assert result == "sent" and sends == [1, 3] and len(taken) == 3 and c.requests["PutObject"] == 1
    assert gate.limiter.in_flight == 0


def test_a_failed_recheck_is_retried_and_a_throttle_after_it_needs_none():
    """The recheck is an S3 request like any: retried by the gate. Once it answered (nothing
    there), a throttled attempt after it is not rechecked again."""
    gate = _gate()
    errors = [TransientError("ReadTimeoutError"), ThrottledError("SlowDown", status=503)]
    head_errors = [ThrottledError("SlowDown", status=503), TransientError("InternalError", status=500)]
    sends, checks = [], []

    def fn():
        sends.append(1)
        if errors:
            raise errors.pop(0)
        return "sent"

    def recheck():
        checks.append(1)
        if head_errors:
            raise head_errors.pop(0)
        return None

    try:
        assert asyncio.run(gate.call("PutObject", fn, recheck=recheck)) == "sent"
    finally:
        gate.close()
    assert len(sends) == 3 and len(checks) == 3
    assert gate.counters.requests == {"HeadObject": 1, "PutObject": 1}
