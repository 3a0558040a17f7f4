"""A fault-injecting HTTP/1.1 proxy (asyncio) to put between boto3 and moto.

It understands just enough HTTP to find message boundaries (Content-Length, chunked,
HEAD/204/304 without body), so each request can be treated on its own:
  - latency: delay before forwarding a request
  - error_rate: answer that fraction of requests with 503 SlowDown (request body consumed)
  - reset_rate: that fraction of requests gets its connection reset (RST) instead of an answer
  - blackhole(seconds): accept and read, answer nothing until the hole closes
  - rewrite_head(method, path, head) -> head: change an answer's status line and headers
    (say, report checksums as another S3 would); not its body
It records every request (time, method, path, query, body size) for assertions and benches.

Use `FaultProxy(upstream_port)` inside an event loop, or `ThreadedFaultProxy` from
synchronous code (it runs its own loop in a thread).
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b'<Message>Please reduce your request rate.</Message><RequestId>faultproxy</RequestId>'
                 b'</Error>')


@dataclass
class Faults:
    latency: float = 0.0
    error_rate: float = 0.0
    reset_rate: float = 0.0
    blackhole_until: float = 0.0           # time.monotonic() deadline
    only_methods: tuple[str, ...] = ()     # faults only for these methods ("" = all)


@dataclass
class RequestRecord:
    t: float                 # time.monotonic() when the request head arrived
    method: str
    path: str
    query: str
    body_bytes: int
    outcome: str = "forwarded"     # forwarded | slowdown | reset | blackholed
    status: int = 0


class HttpFramingError(Exception):
    pass


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise HttpFramingError("connection closed inside a message head") from e
        return None


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    hdrs: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    return lines[0], hdrs


async def _read_body(reader: asyncio.StreamReader, hdrs: dict[str, str], *, until_eof: bool) -> bytes:
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            out += size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                # trailers end with an empty line
                while True:
                    line = await reader.readuntil(b"\r\n")
                    out += line
                    if line == b"\r\n":
                        return bytes(out)
            out += await reader.readexactly(size + 2)
    if "content-length" in hdrs:
        return await reader.readexactly(int(hdrs["content-length"]))
    if until_eof:
        return await reader.read()
    return b""


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # SO_LINGER 0: close() sends RST instead of FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", *, seed: int | None = None):
        self.upstream = (upstream_host, upstream_port)
        self.faults = Faults()
        self.records: list[RequestRecord] = []
        self.port = 0
        self._rng = random.Random(seed)
        self.rewrite_head: Callable[[str, str, bytes], bytes] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server:
            await self._server.wait_closed()

    def blackhole(self, seconds: float) -> None:
        self.faults.blackhole_until = time.monotonic() + seconds

    def clear(self) -> None:
        self.faults = Faults()

    def requests(self, method: str | None = None, *, outcome: str | None = "forwarded",
                 query_has: str | None = None) -> list[RequestRecord]:
        return [r for r in list(self.records)
                if (method is None or r.method == method)
                and (outcome is None or r.outcome == outcome)
                and (query_has is None or query_has in r.query)]

    # -- per connection -------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        up_reader = up_writer = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                start, hdrs = _headers(head)
                method, target = start.split(" ", 2)[:2]
                if hdrs.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                    head = head.replace(b"Expect: 100-continue\r\n", b"").replace(
                        b"expect: 100-continue\r\n", b"")
                body = await _read_body(reader, hdrs, until_eof=False)
                url = urlsplit(target)
                rec = RequestRecord(time.monotonic(), method, url.path, url.query, len(body))
                self.records.append(rec)
                f = self.faults
                if f.blackhole_until > time.monotonic():
                    rec.outcome = "blackholed"
                    # swallow: the client times out; hang up when the hole closes
                    await asyncio.sleep(max(0.0, f.blackhole_until - time.monotonic()))
                    _reset(writer)
                    return
                faulty = not f.only_methods or method in f.only_methods
                if f.latency:
                    await asyncio.sleep(f.latency)
                roll = self._rng.random()
                if faulty and roll < f.reset_rate:
                    rec.outcome = "reset"
                    _reset(writer)
                    return
                if faulty and roll < f.reset_rate + f.error_rate:
                    rec.outcome, rec.status = "slowdown", 503
                    body503 = b"" if method == "HEAD" else SLOWDOWN_BODY
                    writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(SLOWDOWN_BODY) + body503)
                    await writer.drain()
                    continue
                if up_writer is None or up_writer.is_closing():
                    up_reader, up_writer = await asyncio.open_connection(*self.upstream)
                up_writer.write(head + body)
                await up_writer.drain()
                rhead = await _read_head(up_reader)
                if rhead is None:
                    raise HttpFramingError("upstream closed without answering")
                rstart, rhdrs = _headers(rhead)
                rec.status = int(rstart.split(" ", 2)[1])
                no_body = method == "HEAD" or rec.status in (204, 304) or 100 <= rec.status < 200
                until_eof = "content-length" not in rhdrs and "chunked" not in rhdrs.get(
                    "transfer-encoding", "").lower()
                rbody = b"" if no_body else await _read_body(up_reader, rhdrs, until_eof=until_eof)
                if self.rewrite_head is not None:
                    rhead = self.rewrite_head(method, url.path, rhead)
                writer.write(rhead + rbody)
                await writer.drain()
                if until_eof and not no_body or rhdrs.get("connection", "").lower() == "close":
                    up_writer.close()
                    up_writer = None
                if hdrs.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, HttpFramingError, asyncio.LimitOverrunError):
            return
        except asyncio.CancelledError:
            return
        finally:
            self._conns.discard(task)
            if up_writer is not None:
                up_writer.close()
            if not writer.is_closing():
                writer.close()


class ThreadedFaultProxy:
    """FaultProxy on its own event loop in a daemon thread, for synchronous callers."""

    def __init__(self, upstream_port: int, *, seed: int | None = None):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)
        self._thread.start()
        self.proxy = FaultProxy(upstream_port, seed=seed)
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)

    def __getattr__(self, name):
        return getattr(self.proxy, name)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
