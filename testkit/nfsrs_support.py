"""nfs-rs (an independent NFSv4.1 client with a Rust core) against `python -m nfsd`.

nfs-rs raises NfsRetryableError only for failures it knows are safe to retry (e.g. the
server answered NFS4ERR_DELAY or NFS4ERR_RETRY_UNCACHED_REP); `retrying` retries those a
bounded number of times and counts them. Every other error propagates: a test failure.
"""
from __future__ import annotations

import threading
import time

import nfs_rs

EXPORT = "/checkpoints"
RETRY_ATTEMPTS = 5


def url(port: int, export: str = EXPORT) -> str:
    return f"nfs://127.0.0.1:{port}{export}?version=4.1&noresvport=true"


def connect(port: int) -> "nfs_rs.Client":
    return retrying(nfs_rs.Client.connect, url(port))


class RetryCounter:
    def __init__(self):
        self._lock = threading.Lock()
        self.retries: list[str] = []

    def add(self, what: str) -> None:
        with self._lock:
            self.retries.append(what)


RETRIES = RetryCounter()


def retrying(fn, *args, attempts: int = RETRY_ATTEMPTS, **kw):
    """fn(*args, **kw), retried (with a short backoff) when nfs-rs says it is safe to retry.
    Pass a whole logical step (e.g. "write this file from the start") when the step is not
    idempotent piece by piece."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kw)
        except nfs_rs.NfsRetryableError as e:
            RETRIES.add(f"{getattr(fn, '__name__', fn)}: {e}")
            if attempt == attempts:
                raise
            time.sleep(0.05 * attempt)


def write_file(client, path: str, data: bytes, chunk: int = 1 << 20) -> None:
    """open "wb" + chunked writes + close; each write() returns once its bytes are durable."""
    def once():
        with client.open(path, "wb") as f:
            view = memoryview(data)
            for off in range(0, len(data), chunk):
                n = f.write(view[off:off + chunk])
                if n != len(view[off:off + chunk]):
                    raise AssertionError(f"short write {n} at {off} of {path}")
    retrying(once)


def read_file(client, path: str, chunk: int = 1 << 20) -> bytes:
    """The whole file. A read is idempotent, so a read whose CLOSE ends uncertain (nfs-rs
    NfsFileCloseError: no answer seen to the CLOSE, once in a loaded CI run right after a
    server restart) is read again, and counted in RETRIES with nfs-rs's reasons."""
    def once() -> bytes:
        out = bytearray()
        with client.open(path, "rb") as f:
            while True:
                piece = f.read(chunk)
                if not piece:
                    return bytes(out)
                out += piece
    for attempt in range(1, RETRY_ATTEMPTS + 1):
        try:
            return retrying(once)
        except nfs_rs.NfsFileCloseError as e:
            if attempt == RETRY_ATTEMPTS:
                raise
            RETRIES.add(f"read_file close of {path}: {e}; {getattr(e, 'errors', ())!r}")
            time.sleep(0.05 * attempt)
