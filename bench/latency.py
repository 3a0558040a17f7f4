"""Per-operation latency probes: one request at a time, each timed from send to reply.

  file_sync_writes(port, n, size)    OPEN, then n WRITEs of `size` bytes with stable=FILE_SYNC4
                                     (the reply says the bytes are on stable storage), CLOSE
  lookup_getattr(port, paths)        PUTFH(dir) + LOOKUP(name) + GETATTR per path
  LocalSyncWrites(dir, size)         the local disk's floor: pwrite + fdatasync of a file, one at
                                     a time (file_sync_writes' `between`: interleaved with them)

The NFS probes use the project's own NFSv4.1 test client (testkit/nfsclient.py), which sends
exactly the compound asked for; nfs-rs chooses its own stability (UNSTABLE + COMMIT).
"""
from __future__ import annotations

import asyncio
import os
import time

from testkit.nfsclient import (BASIC_ATTRS, GETATTR4args, LOOKUP4args, OP_GETATTR, OP_LOOKUP, OP_PUTFH,
                             PUTFH4args, NfsClient, bitmap, check, op)

FILE_SYNC4 = 2          # stable_how4, RFC 8881 section 18.32
EXPORT = "/checkpoints"


async def _session(port: int) -> NfsClient:
    c = await NfsClient.connect("127.0.0.1", port)
    await c.setup_session()
    return c


def file_sync_writes(port: int, n: int, size: int, name: str = "acklat.bin", between=None) -> list[float]:
    """Seconds per FILE_SYNC WRITE of `size` bytes, n of them at increasing offsets.
    between: called (untimed here) after each WRITE, e.g. LocalSyncWrites.one: the reference
    measured interleaved, under the same load at the same moments."""
    async def run() -> list[float]:
        c = await _session(port)
        try:
            root = await c.lookup_path(EXPORT)
            fh, stateid = await c.open_create(root, name)
            data = os.urandom(size)
            out = []
            for i in range(n):
                t0 = time.perf_counter()
                await c.write(fh, stateid, i * size, data, stable=FILE_SYNC4, data_out_of_line=True)
                out.append(time.perf_counter() - t0)
                if between is not None:
                    between()
            await c.close_file(fh, stateid)
            return out
        finally:
            await c.close()
    return asyncio.run(run())


def lookup_getattr(port: int, paths: list[str]) -> list[float]:
    """Seconds per LOOKUP + GETATTR of each path's last component (its directory looked up once)."""
    async def run() -> list[float]:
        c = await _session(port)
        try:
            dirs: dict[str, bytes] = {}
            out = []
            for path in paths:
                parent, _, leaf = path.rpartition("/")
                if parent not in dirs:
                    dirs[parent] = await c.lookup_path(f"{EXPORT}/{parent}".rstrip("/"))
                ops = [op(OP_PUTFH, PUTFH4args(dirs[parent])), op(OP_LOOKUP, LOOKUP4args(leaf.encode())),
                       op(OP_GETATTR, GETATTR4args(bitmap(*BASIC_ATTRS)))]
                t0 = time.perf_counter()
                check(await c.compound(ops))
                out.append(time.perf_counter() - t0)
            return out
        finally:
            await c.close()
    return asyncio.run(run())


class LocalSyncWrites:
    """The local disk's floor, one write at a time: pwrite + fdatasync of `size` bytes at
    increasing offsets of a new file in `directory`; `seconds` holds each one's time."""

    def __init__(self, directory: str, size: int):
        self.path = os.path.join(directory, "local-fdatasync.bin")
        self.data = os.urandom(size)
        self.seconds: list[float] = []
        self.fd = -1

    def __enter__(self) -> "LocalSyncWrites":
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
        os.unlink(self.path)

    def one(self) -> None:
        t0 = time.perf_counter()
        os.pwrite(self.fd, self.data, len(self.seconds) * len(self.data))
        os.fdatasync(self.fd)
        self.seconds.append(time.perf_counter() - t0)
