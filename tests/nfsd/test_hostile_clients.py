"""Hostile clients against a live gateway NFS server process (issue 16 point 2).

slowloris connections, clients sending endless half records (a big record that stalls,
endless non-last fragments) and 10,000 connections opened and dropped, all at once on
loopback, while a well-behaved client keeps working: every one of its calls is answered,
the attackers are disconnected, rejections are logged rate-limited, and the server's
resident memory stays bounded throughout (sampled from /proc every 50 ms; a bound, not a
timing) and returns to where it was once the attack is over.
"""
from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import time

from nfsd.heap import QUIET_SECONDS
from nfsd.rpc import LAST_FRAGMENT
from testkit.nfsclient import NfsClient
from testkit.loopback import closed_by_server, free_port, wait_listening

CONNECTIONS = 10_000
BATCH = 100                     # connections open at once while churning (< max_per_address)
RSS_GROWTH_BOUND = 96 * 1024 * 1024
SETTLED_GROWTH_BOUND = 8 * 1024 * 1024
SETTLE_DEADLINE = 60.0        # seconds: how long the heap may take to come back on a loaded host


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def peak_rss(pid: int, stop: asyncio.Event) -> int:
    peak = 0
    while not stop.is_set():
        peak = max(peak, rss_bytes(pid))
        await asyncio.sleep(0.05)
    return peak


async def slowloris(port: int) -> bool:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(struct.pack(">I", LAST_FRAGMENT | 4000))
    done = asyncio.ensure_future(closed_by_server(r, 60))
    for _ in range(300):                      # one byte every 0.2 s, up to a minute
        if done.done():
            break
        try:
            w.write(b"x")
            await w.drain()
        except (ConnectionError, OSError):
            break
        await asyncio.sleep(0.2)
    return await done


async def stalled_half_record(port: int) -> bool:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(struct.pack(">I", LAST_FRAGMENT | (2 * 1024 * 1024)) + b"h" * (1024 * 1024))
    try:
        await w.drain()
    except (ConnectionError, OSError):
        return True
    return await closed_by_server(r, 60)


async def endless_fragments(port: int) -> bool:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    frag = struct.pack(">I", 4096) + b"f" * 4096          # never the last fragment
    done = asyncio.ensure_future(closed_by_server(r, 60))
    for _ in range(10_000):
        if done.done():
            break
        try:
            w.write(frag)
            await w.drain()
        except (ConnectionError, OSError):
            break
        await asyncio.sleep(0.01)
    return await done


async def churn(port: int, total: int) -> int:
    """Open and drop `total` connections, BATCH at a time; some leave half a record mark."""
    made = 0

    async def one(i: int):
        nonlocal made
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        made += 1
        if i % 3 == 0:
            w.write(b"\x80\x00")                            # half a record mark
        elif i % 3 == 1:
            w.write(struct.pack(">I", LAST_FRAGMENT | 1_000_000) + b"z" * 100)
        w.close()

    for start in range(0, total, BATCH):
        await asyncio.gather(*(one(i) for i in range(start, min(total, start + BATCH))))
    return made


async def good_client(port: int, stop: asyncio.Event) -> int:
    c = await NfsClient.connect("127.0.0.1", port)
    answered = 0
    try:
        await c.setup_session()
        while not stop.is_set():
            await asyncio.wait_for(c.lookup_path("/checkpoints"), 30)
            answered += 1
            await asyncio.sleep(0.05)
    finally:
        await c.close()
    return answered


def test_gateway_keeps_serving_under_hostile_clients_with_bounded_memory(tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir",
             str(tmp_path / "cache"), "--limit", "record_timeout=2", "--limit", "idle_timeout=5"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc, why=log_path.read_text)

        async def main():
            stop = asyncio.Event()
            good = asyncio.ensure_future(good_client(port, stop))
            await asyncio.sleep(0.5)
            rss_before = rss_bytes(proc.pid)
            sampling = asyncio.ensure_future(peak_rss(proc.pid, stop))
            attackers = ([slowloris(port) for _ in range(10)] + [stalled_half_record(port) for _ in range(10)]
                         + [endless_fragments(port) for _ in range(10)])
            results = await asyncio.gather(*attackers, churn(port, CONNECTIONS))
            rss_after = rss_bytes(proc.pid)
            # the burst is over: a sweep after QUIET_SECONDS gives the heap the attack freed
            # back (nfsd/heap.py). Wait for that to show, not for a time: on a loaded host the
            # sweep comes late (SETTLE_DEADLINE bounds the wait; the bound below still judges).
            deadline = time.monotonic() + SETTLE_DEADLINE
            await asyncio.sleep(QUIET_SECONDS)
            while (rss_bytes(proc.pid) - rss_before >= SETTLED_GROWTH_BOUND
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.1)
            rss_settled = rss_bytes(proc.pid)
            stop.set()
            answered = await good
            return results, answered, rss_before, await sampling, rss_after, rss_settled

        (*dropped, made), answered, before, peak, after, settled = asyncio.run(asyncio.wait_for(main(), 300))
        log_text = log_path.read_text()
        print(f"connections churned={made} good-client answers={answered} "
              f"rss before={before >> 20} MiB peak={peak >> 20} MiB after={after >> 20} MiB "
              f"settled={settled >> 20} MiB")
        assert all(dropped), dropped                    # every attacker was disconnected
        assert made == CONNECTIONS
        assert answered > 0                             # and the good client was answered throughout
        # Bounded while under attack, not only once it is over (the peak is what a host
        # must have); what stays after is the allocator's free lists, below the peak.
        assert max(peak, after) - before < RSS_GROWTH_BOUND
        # Once it is over, what the attack freed goes back to the OS (kept by glibc: 10-43
        # MiB above `before` without the trim; 1-2 MiB with it)
        assert settled - before < SETTLED_GROWTH_BOUND
        assert proc.poll() is None
        # Rate-limited: one line per client (all 127.0.0.1) and kind per minute.
        assert 1 <= log_text.count("connection_slow_record") <= 2
        assert log_text.count("rpc_stream_error") <= 2
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
