#!/usr/bin/env python3
"""Micro-benchmark of the RPC layer (not a test): nfsd/rpc.py's RpcConnection beside the typed
Cython one of nfsd.native.rpc (issue 37), CPU µs per call, on the same bytes.

Two streams of N pipelined calls: NULL calls (AUTH_NONE, no arguments: 44 bytes with the mark)
and AUTH_SYS calls of 200 bytes (a COMPOUND's size: machinename, 3 gids, 120 bytes of
arguments). Each is fed three ways: receive_data of 64 KiB reads (many calls per read), the
transport's path (get_buffer, copy a 64 KiB read into it, buffer_updated), and one call per
receive_data (a read per call: a client waiting for each reply). The events are checked to be
the calls (xids in order) before timing.

    python3 bench/rpc_codec_bench.py [--calls 20000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import time

import nfsd.rpc as ref
from nfsd.context import Cred
from nfsd.rpc import CallReceived, Program, encode_call
from nfsd.xdr.rpc import AUTH_SYS

try:
    from nfsd.native import rpc as native
except ImportError:
    native = None

NFS = 100003
PROGRAMS = {NFS: Program(NFS, 4, 4, frozenset({0, 1}))}
CRED = Cred(AUTH_SYS, uid=1000, gid=1000, gids=(1000, 27, 100), machinename=b"client-07")
READ = 64 * 1024


def null_calls(n: int) -> list[bytes]:
    return [encode_call(xid, NFS, 4, 0, None, b"") for xid in range(n)]


def compound_calls(n: int) -> list[bytes]:
    head = len(encode_call(0, NFS, 4, 1, CRED, b""))
    args = b"\x00\x00\x00\x00\x00\x00\x00\x01" + b"\xa5" * (200 - head - 8)
    calls = [encode_call(xid, NFS, 4, 1, CRED, args) for xid in range(n)]
    assert len(calls[0]) == 200
    return calls


def feed_reads(cls, stream: bytes) -> int:
    c = cls(PROGRAMS)
    got = 0
    for i in range(0, len(stream), READ):
        got += len(c.receive_data(stream[i:i + READ]))
    return got


def feed_transport(cls, stream: bytes) -> int:
    c = cls(PROGRAMS)
    got, pos, view = 0, 0, memoryview(stream)
    while pos < len(stream):
        buf = c.get_buffer(-1)
        n = min(len(buf), READ, len(stream) - pos)
        buf[:n] = view[pos:pos + n]
        del buf
        pos += n
        got += len(c.buffer_updated(n))
    return got


def feed_each(cls, calls: list[bytes]) -> int:
    c = cls(PROGRAMS)
    got = 0
    for call in calls:
        got += len(c.receive_data(call))
    return got


def check(cls, calls: list[bytes]) -> None:
    events = cls(PROGRAMS).receive_data(b"".join(calls))
    assert [e.xid for e in events] == list(range(len(calls))), cls
    assert all(isinstance(e, CallReceived) for e in events)


def cpu_us_per_call(fn, arg, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        got = fn(arg)
        best = min(best, time.process_time() - t0)
        assert got == calls
    return best / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    impls = [("reference", ref.RpcConnection)] + ([("native", native.RpcConnection)] if native else [])
    if native is None:
        print("nfsd.native.rpc is not built: the reference only")
    print(f"CPU µs per call, best of {a.repeat}, {a.calls} pipelined calls per run")
    print(f"{'stream':<22}{'feed':<26}" + "".join(f"{name:>11}" for name, _ in impls)
          + ("    speedup" if native else ""))
    for label, calls in (("NULL (44 B)", null_calls(a.calls)), ("AUTH_SYS call (200 B)", compound_calls(a.calls))):
        stream = b"".join(calls)
        for _, cls in impls:
            check(cls, calls)
        for feed, fn, arg in (("receive_data, 64 KiB", lambda c: feed_reads(c, stream), None),
                              ("get_buffer+updated, 64 KiB", lambda c: feed_transport(c, stream), None),
                              ("receive_data per call", lambda c: feed_each(c, calls), None)):
            us = [cpu_us_per_call(fn, cls, a.calls, a.repeat) for _, cls in impls]
            row = f"{label:<22}{feed:<26}" + "".join(f"{u:>11.2f}" for u in us)
            if len(us) == 2:
                row += f"{us[0] / us[1]:>10.1f}x"
            print(row)


if __name__ == "__main__":
    main()
