"""Per-operation latency probes: one request at a time, each timed from send to reply.

  file_sync_writes(port, n, size)    OPEN, then n WRITEs of `size` bytes with stable=FILE_SYNC4
                                     (the reply says the bytes are on stable storage), CLOSE
  lookup_getattr(port, paths)        PUTFH(dir) + LOOKUP(name) + GETATTR per path
  local_fdatasync_writes(dir, n, size)  the local disk's floor: pwrite + fdatasync of a file

The NFS probes use the project's own NFSv4.1 test client (tests/nfsclient.py), which sends
exactly the compound asked for; nfs-rs chooses its own stability (UNSTABLE + COMMIT).
"""
from __future__ import annotations

import asyncio
import os
import time

from tests.nfsclient import (BASIC_ATTRS, GETATTR4args, LOOKUP4args, OP_GETATTR, OP_LOOKUP, OP_PUTFH,
                             PUTFH4args, NfsClient, bitmap, check, op)

FILE_SYNC4 = 2          # stable_how4, RFC 8881 section 18.32
EXPORT = "/checkpoints"


async def _session(port: int) -> NfsClient:
    c = await NfsClient.connect("127.0.0.1", port)
    await c.setup_session()
    return c


def file_sync_writes(port: int, n: int, size: int, name: str = "acklat.bin") -> list[float]:
    """Seconds per FILE_SYNC WRITE of `size` bytes, n of them at increasing offsets."""
    async def run() -> list[float]:
        c = await _session(port)
        try:
            root = await c.lookup_path(EXPORT)
            fh, stateid = await c.open_create(root, name)
            data = os.urandom(size)
            out = []
            for i in range(n):
                t0 = time.perf_counter()
                await c.write(fh, stateid, i * size, data, stable=FILE_SYNC4)
                out.append(time.perf_counter() - t0)
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


def local_fdatasync_writes(directory: str, n: int, size: int) -> list[float]:
    """Seconds per pwrite + fdatasync of `size` bytes to a new file in `directory`."""
    path = os.path.join(directory, "local-fdatasync.bin")
    data = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            os.pwrite(fd, data, i * size)
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.close(fd)
        os.unlink(path)
