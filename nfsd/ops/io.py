"""READ WRITE COMMIT (RFC 8881 sections 18.22, 18.32, 18.3).

WRITE reports the truth in `committed`: UNSTABLE4 data is only in the store's page
cache (a later COMMIT makes it durable); DATA_SYNC4 / FILE_SYNC4 data is committed
(`store.commit`, off the event loop) before the reply, which then says FILE_SYNC4.
"""
from __future__ import annotations

import asyncio
import errno
import inspect

import structlog

from cache.api import DataState, StoreError
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.exports import MAY_READ, MAY_WRITE, permitted
from nfsd.ops._common import (blocking, current, io_state, nfs_error, require_regular,
                              require_writable_fs, store_errors, who)
from nfsd.xdr.nfs4 import (
    FILE_SYNC4, NFS4ERR_ACCESS, NFS4ERR_DELAY, NFS4ERR_FBIG, NFS4ERR_INVAL,
    NFS4_OK, OP_COMMIT, OP_READ, OP_WRITE, UNSTABLE4,
    COMMIT4res, COMMIT4resok, READ4res, READ4resok, WRITE4res, WRITE4resok,
)

log = structlog.get_logger(__name__)

# read-through attempts before telling the client to come back later
_FETCH_ATTEMPTS = 3
# how long one READ waits for a read-through fetch before answering NFS4ERR_DELAY
READ_FETCH_WAIT = 10.0


def check_anonymous_io(ctx, obj, want: int) -> None:
    """I/O without open state (special stateids) gets the mode-bit checks OPEN would
    have made (RFC 8881 8.2.3)."""
    if not permitted(obj.attr, who(ctx, obj), want):
        raise NfsError(NFS4ERR_ACCESS)


async def op_read(ctx, args) -> READ4res:
    obj = current(ctx)
    require_regular(ctx, obj)
    st = io_state(ctx, args.stateid, obj, write=False)
    if st is None:
        check_anonymous_io(ctx, obj, MAY_READ)
    # Size the buffer by what the file holds (it may grow meanwhile: then the read is
    # short and not eof, and the client asks again).
    count = max(0, min(args.count, fattr.MAX_IO, obj.attr.size - args.offset,
                       data_room(ctx)))
    buf = bytearray(count)
    n, eof = await read_local(ctx, obj.ino, args.offset, memoryview(buf))
    note_read = ctx.server.note_read            # None: no read-through (no uploader)
    if n and note_read is not None and obj.attr.data_state == DataState.ABSENT:
        note_read(obj.ino, args.offset, n)          # readahead follows the reader
    data = memoryview(buf)[:n] if n < count else buf
    if count == 0:
        eof = args.offset >= obj.attr.size       # nothing asked: eof says where we are
    return READ4res(NFS4_OK, READ4resok(eof=bool(eof), data=data))


async def read_local(ctx, ino: int, offset: int, buf: memoryview) -> tuple[int, bool]:
    """(nbytes, eof) of the file's bytes at offset into buf, fetched from S3 first where
    they are not local. On the loop when the page cache holds them; a read that would wait
    for the disk goes to the worker pool, so it stalls neither the other clients nor the
    other readers' disk requests."""
    store = ctx.server.store
    got = await with_read_through(ctx, ino, store.read_into_cached, ino, offset, buf)
    if got is None:
        got = await with_read_through(ctx, ino, store.read_into, ino, offset, buf,
                                      blocking_call=True)
    return got


async def with_read_through(ctx, ino: int, fn, *args, blocking_call: bool = False):
    """fn(*args), a store call that raises StoreError(EAGAIN) with `.missing` ranges of
    `ino` that are not local: fetch them through the read-through hook and call again;
    NFS4ERR_DELAY when they do not come. blocking_call: run fn off the event loop."""
    for attempt in range(_FETCH_ATTEMPTS + 1):
        try:
            if blocking_call:
                return await blocking(ctx, fn, *args)
            return fn(*args)
        except StoreError as e:
            if e.errno != errno.EAGAIN or not getattr(e, "missing", None):
                raise nfs_error(e) from e
            if attempt == _FETCH_ATTEMPTS or not await _fetch(ctx, ino, e.missing):
                raise NfsError(NFS4ERR_DELAY, "data not local yet") from e


# READ4resok without its data: op number, status, eof, data length, padding.
_READ_RES_OVERHEAD = 20


def data_room(ctx) -> int:
    """At most what the session's max response size leaves for READ's data: a READ
    asking for more gets a short read, not NFS4ERR_REP_TOO_BIG (RFC 8881 18.22.3)."""
    room = ctx.extra.get("reply_room")
    if room is None or room <= _READ_RES_OVERHEAD:
        return fattr.MAX_IO             # no room at all: the op gets REP_TOO_BIG
    return (room - _READ_RES_OVERHEAD) & ~3


async def _fetch(ctx, ino: int, ranges) -> bool:
    """Ask the read-through hook (if the server has one) to bring ranges in from S3."""
    fetch = ctx.server.fetch_missing            # None: no read-through (no uploader)
    if fetch is None:
        return False
    try:
        result = fetch(ino, ranges)
        if inspect.isawaitable(result):
            # During an S3 outage a fetch waits as long as the outage lasts. The client gets
            # NFS4ERR_DELAY after a while and retries; the shielded fetch carries on meanwhile.
            await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(result)), READ_FETCH_WAIT)
    except asyncio.TimeoutError:
        raise NfsError(NFS4ERR_DELAY, "read-through still fetching from S3") from None
    except StoreError as e:
        raise nfs_error(e) from e
    return True


async def op_write(ctx, args) -> WRITE4res:
    obj = current(ctx)
    require_regular(ctx, obj)
    require_writable_fs(obj)
    st = io_state(ctx, args.stateid, obj, write=True)
    if st is None:
        check_anonymous_io(ctx, obj, MAY_WRITE)
    data = args.data
    if args.offset + len(data) > fattr.MAX_FILESIZE:
        raise NfsError(NFS4ERR_FBIG)
    store = ctx.server.store
    with store_errors():
        # An UNSTABLE write of a file already in its commit cycle is pwritten here, on the
        # loop (os.pwrite releases the GIL; the page cache takes 1 MiB in well under a ms),
        # and answered without waiting for its index record, a lazy batch op (cache/store.py
        # I5). Otherwise (the cycle's first write waits for the flag's group sync, I2; a
        # fenced file; no room; an error) on a worker thread. The data views the RPC
        # record's own buffer (nfsd.rpc), which nothing keeps after the call.
        if args.stable == UNSTABLE4:
            if not store.write_nowait(obj.ino, args.offset, data):
                await blocking(ctx, store.write, obj.ino, args.offset, data)
            committed = UNSTABLE4
        else:   # pwrite and fdatasync on a worker, the record answered by the batch committer
            await store.write_stable_async(obj.ino, args.offset, data,
                                           asyncio.get_running_loop(), ctx.server.start_blocking)
            committed = FILE_SYNC4
    return WRITE4res(NFS4_OK, WRITE4resok(count=len(data), committed=committed,
                                          writeverf=ctx.server.write_verifier))


async def op_commit(ctx, args) -> COMMIT4res:
    obj = current(ctx)
    require_regular(ctx, obj)
    if args.offset + args.count > 2**64 - 1:
        raise NfsError(NFS4ERR_INVAL, "offset + count overflows")
    with store_errors():
        # the data fdatasync on a worker, the record answered by the batch committer
        await ctx.server.store.commit_async(obj.ino, asyncio.get_running_loop(),
                                            ctx.server.start_blocking)
    return COMMIT4res(NFS4_OK, COMMIT4resok(writeverf=ctx.server.write_verifier))


HANDLERS = {OP_READ: op_read, OP_WRITE: op_write, OP_COMMIT: op_commit}
