"""NFSv4.2 (RFC 7862) ops that serve checkpoints: sparse files and server-side copy.

SEEK (15.11), ALLOCATE (15.1), DEALLOCATE (15.4), READ_PLUS (15.10), COPY (15.2), CLONE
(15.13), and OFFLOAD_STATUS / OFFLOAD_CANCEL (15.9, 15.8). Every other 4.2 op has no handler
and the COMPOUND loop answers it NFS4ERR_NOTSUPP; a 4.2 op in a 4.0/4.1 COMPOUND never gets
here (NFS4ERR_OP_ILLEGAL, nfsd/compound.py).

COPY is intra-server. With ca_synchronous = false, at least `offloads.async_min` bytes
and a working back channel it is asynchronous (nfsd/offload.py): the reply carries a copy
stateid, the copy runs in the background and ends with CB_OFFLOAD; OFFLOAD_STATUS and
OFFLOAD_CANCEL act on that stateid. Otherwise it is synchronous, as RFC 7862 15.2.3 lets
the server choose whatever ca_synchronous says; a large synchronous COPY is answered
with a short count (at most COPY_MAX_BYTES per op), the client asks for the rest.
COPY and CLONE move no data through the client, nor through this process: the store
reflinks the range where its file system can, else copy_file_range.
Changes of a file's bytes are committed before the reply (ALLOCATE, DEALLOCATE, CLONE;
COPY says FILE_SYNC4), so none of them needs a client COMMIT.
"""
from __future__ import annotations

import structlog

from cache.api import FileType
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.exports import MAY_READ, MAY_WRITE
from nfsd.ops._common import (blocking, clientid_of, current, io_state, require_regular,
                              require_writable_fs, same_export, saved, store_errors)
from nfsd.ops.io import check_anonymous_io, data_room, read_local, with_read_through
from nfsd.xdr.nfs4 import (
    FILE_SYNC4, NFS4_CONTENT_DATA, NFS4_CONTENT_HOLE, NFS4_OK, NFS4ERR_FBIG, NFS4ERR_INVAL,
    NFS4ERR_NOTSUPP, NFS4ERR_UNION_NOTSUPP, NFS4ERR_WRONG_TYPE, UNSTABLE4,
    OP_ALLOCATE, OP_CLONE, OP_COPY, OP_DEALLOCATE, OP_OFFLOAD_CANCEL, OP_OFFLOAD_STATUS,
    OP_READ_PLUS, OP_SEEK,
    ALLOCATE4res, CLONE4res, COPY4res, COPY4resok, DEALLOCATE4res, OFFLOAD_CANCEL4res,
    OFFLOAD_STATUS4res, OFFLOAD_STATUS4resok, READ_PLUS4res, SEEK4res, copy_requirements4,
    data4, data_info4, read_plus_content, read_plus_res4, seek_res4, write_response4,
)

log = structlog.get_logger(__name__)

# Offsets and counts of CLONE must be multiples of this, the clone_blksize attribute
# (RFC 7862 12.2.1, 15.13.3; the count may instead end at the source's end, as Linux's
# remap rules allow).
CLONE_BLKSIZE = fattr.CLONE_BLKSIZE
# One synchronous COPY copies at most this much; the client repeats for the rest (15.2.3:
# wr_count may be less than ca_count). Bounds the time one op holds a worker thread.
COPY_MAX_BYTES = 256 << 20
# READ_PLUS: at most this many segments in one reply (a file of many tiny holes gets a
# short read, never a reply that grows with the file's fragmentation).
READ_PLUS_MAX_SEGMENTS = 64
# XDR bytes of one segment without its data: content arm + offset + length (hole) or
# offset + data length (data).
_HOLE_SEGMENT_BYTES = 4 + 8 + 8
_DATA_SEGMENT_BYTES = 4 + 8 + 4
# READ_PLUS4res without its segments: op number, status, eof, array length.
_READ_PLUS_OVERHEAD = 16


def _regular_file(obj) -> None:
    """ALLOCATE, DEALLOCATE, SEEK, COPY and CLONE on anything but a regular file:
    NFS4ERR_WRONG_TYPE (RFC 7862 15.1.3, 15.4.3, 15.11.3, 15.2.3, 15.13.3)."""
    if obj.attr.type != FileType.REG:
        raise NfsError(NFS4ERR_WRONG_TYPE)


def _io_checks(ctx, obj, sid, *, write: bool) -> None:
    """The stateid rules of READ/WRITE (RFC 8881 8.2.5, 18.32.3) and, for the anonymous
    stateids, the mode bits OPEN would have checked."""
    if write:
        require_writable_fs(obj)
    if io_state(ctx, sid, obj, write=write) is None:
        check_anonymous_io(ctx, obj, MAY_WRITE if write else MAY_READ)


def _check_range(offset: int, length: int) -> None:
    if length == 0:
        raise NfsError(NFS4ERR_INVAL, "zero length")
    if offset + length > fattr.MAX_FILESIZE:
        raise NfsError(NFS4ERR_FBIG)


# ---- 15.11 SEEK ---------------------------------------------------------------------
async def op_seek(ctx, args) -> SEEK4res:
    obj = current(ctx)
    _regular_file(obj)
    _io_checks(ctx, obj, args.sa_stateid, write=False)
    if args.sa_what not in (NFS4_CONTENT_DATA, NFS4_CONTENT_HOLE):
        raise NfsError(NFS4ERR_UNION_NOTSUPP)
    store = ctx.server.store
    with store_errors():            # at or past the end: ENXIO -> NFS4ERR_NXIO
        found = store.seek(obj.ino, args.sa_offset, data=args.sa_what == NFS4_CONTENT_DATA)
        size = store.getattr(obj.ino).size
    if found is None:               # no data after the offset: OK with sr_eof (15.11.3)
        return SEEK4res(NFS4_OK, seek_res4(sr_eof=True, sr_offset=size))
    return SEEK4res(NFS4_OK, seek_res4(sr_eof=found >= size, sr_offset=found))


# ---- 15.1 ALLOCATE, 15.4 DEALLOCATE ---------------------------------------------------
async def _change_range(ctx, stateid, offset: int, length: int, change) -> None:
    """ALLOCATE / DEALLOCATE: the checks of a write, then `change` (a Store method) of the
    range, committed before the reply."""
    obj = current(ctx)
    _regular_file(obj)
    _io_checks(ctx, obj, stateid, write=True)
    _check_range(offset, length)
    with store_errors():
        await blocking(ctx, change, obj.ino, offset, length)
        await blocking(ctx, ctx.server.store.commit, obj.ino)


async def op_allocate(ctx, args) -> ALLOCATE4res:
    await _change_range(ctx, args.aa_stateid, args.aa_offset, args.aa_length, ctx.server.store.allocate)
    return ALLOCATE4res(NFS4_OK)


async def op_deallocate(ctx, args) -> DEALLOCATE4res:
    await _change_range(ctx, args.da_stateid, args.da_offset, args.da_length, ctx.server.store.deallocate)
    return DEALLOCATE4res(NFS4_OK)


# ---- 15.10 READ_PLUS ------------------------------------------------------------------
async def op_read_plus(ctx, args) -> READ_PLUS4res:
    obj = current(ctx)
    require_regular(ctx, obj)                   # as READ: ISDIR / SYMLINK / WRONG_TYPE
    _io_checks(ctx, obj, args.rpa_stateid, write=False)
    store = ctx.server.store
    offset = args.rpa_offset
    size = obj.attr.size
    end = offset + max(0, min(args.rpa_count, fattr.MAX_IO, size - offset))
    room = data_room(ctx) - _READ_PLUS_OVERHEAD
    with store_errors():
        runs = store.content_runs(obj.ino, offset, end) if end > offset else []
    contents = []
    pos = offset
    for start, length, is_data in runs[:READ_PLUS_MAX_SEGMENTS]:
        if is_data:
            length = min(length, (room - _DATA_SEGMENT_BYTES) & ~3)
            if length <= 0:
                break
            buf = bytearray(length)
            n, _eof = await read_local(ctx, obj.ino, start, memoryview(buf))
            contents.append(read_plus_content(NFS4_CONTENT_DATA,
                                              data4(d_offset=start, d_data=bytes(buf[:n]))))
            room -= _DATA_SEGMENT_BYTES + ((n + 3) & ~3)
            pos = start + n
            if n < length:
                break                        # the file shrank meanwhile
        else:
            if room < _HOLE_SEGMENT_BYTES:
                break
            contents.append(read_plus_content(NFS4_CONTENT_HOLE,
                                              data_info4(di_offset=start, di_length=length)))
            room -= _HOLE_SEGMENT_BYTES
            pos = start + length
    eof = pos >= store.getattr(obj.ino).size
    return READ_PLUS4res(NFS4_OK, read_plus_res4(rpr_eof=eof, rpr_contents=contents))


# ---- 15.2 COPY, 15.13 CLONE -----------------------------------------------------------
def _copy_operands(ctx, src_sid, dst_sid):
    """SAVED_FH is the source, CURRENT_FH the destination: both regular files of one
    export (NFS4ERR_XDEV otherwise), read access to the source, write to the destination."""
    dst = current(ctx)
    src = saved(ctx)
    _regular_file(src)
    _regular_file(dst)
    same_export(src, dst)
    _io_checks(ctx, src, src_sid, write=False)
    _io_checks(ctx, dst, dst_sid, write=True)
    return src, dst


def _source_count(src, offset: int, count: int) -> int:
    """A count of 0 means "to the end of the source"; a range past that end is
    NFS4ERR_INVAL (RFC 7862 15.2.3, 15.13.3)."""
    size = src.attr.size
    if offset > size or (count and offset + count > size):
        raise NfsError(NFS4ERR_INVAL, f"source range {offset}+{count} past its end ({size})")
    return count or size - offset


async def _copy_bytes(ctx, src_ino: int, dst_ino: int, src_off: int, dst_off: int,
                      count: int) -> bool:
    """One store copy_range on a worker thread (read-through first where the source is
    not local); True when the file system shared the blocks (reflink)."""
    _attr, reflinked = await with_read_through(ctx, src_ino, ctx.server.store.copy_range,
                                               src_ino, dst_ino, src_off, dst_off, count,
                                               blocking_call=True)
    return reflinked


async def _commit(ctx, ino: int) -> None:
    with store_errors():
        await blocking(ctx, ctx.server.store.commit, ino)


async def _copy(ctx, what: str, src, dst, src_off: int, dst_off: int, count: int) -> None:
    if dst_off + count > fattr.MAX_FILESIZE:
        raise NfsError(NFS4ERR_FBIG)
    reflinked = await _copy_bytes(ctx, src.ino, dst.ino, src_off, dst_off, count)
    await _commit(ctx, dst.ino)
    # rare and large: worth a line (which op, and whether the file system shared blocks)
    log.info("server_side_copy", op=what, src=src.ino, dst=dst.ino, count=count,
             reflinked=reflinked)


def _back_channel_up(ctx) -> bool:
    """The COPY's session has a back channel that may carry CB_OFFLOAD."""
    bc = getattr(ctx.session, "backchannel", None)
    return bc is not None and not bc.path_down


def _start_async_copy(ctx, src, dst, src_off: int, dst_off: int, count: int):
    """Start the copy in the background (nfsd/offload.py): in chunks of the table's
    `chunk` bytes, then one commit, so CB_OFFLOAD says FILE_SYNC4. None when the
    client holds its maximum of copies."""
    offloads = ctx.server.offloads

    async def run(copy) -> None:
        done = 0
        while done < count:
            n = min(offloads.chunk, count - done)
            async with offloads.chunk_slot:
                if copy.cancelled:              # also while it waited for the slot
                    return
                await _copy_bytes(ctx, src.ino, dst.ino, src_off + done, dst_off + done, n)
            done += n
            copy.copied = done
        if copy.cancelled:
            return
        await _commit(ctx, dst.ino)
        log.info("server_side_copy", op="COPY", src=src.ino, dst=dst.ino, count=count,
                 asynchronous=True)
    return offloads.start(ctx.session, ctx.current_fh.raw, count, run)


async def op_copy(ctx, args) -> COPY4res:
    src, dst = _copy_operands(ctx, args.ca_src_stateid, args.ca_dst_stateid)
    if args.ca_source_server:
        # an inter-server copy (15.2.3, section 4.3): not offered
        raise NfsError(NFS4ERR_NOTSUPP, "inter-server copy")
    count = _source_count(src, args.ca_src_offset, args.ca_count)
    if args.ca_dst_offset + count > fattr.MAX_FILESIZE:
        raise NfsError(NFS4ERR_FBIG)
    # Asynchronous when the client allows it, the copy is large, and CB_OFFLOAD can
    # reach the client. Otherwise synchronous, which 15.2.3 lets the server choose
    # whatever ca_synchronous says, so NFS4ERR_OFFLOAD_NO_REQS never applies (the copy
    # is always consecutive).
    if (not args.ca_synchronous and count >= ctx.server.offloads.async_min
            and _back_channel_up(ctx)):
        copy = _start_async_copy(ctx, src, dst, args.ca_src_offset, args.ca_dst_offset,
                                 count)
        if copy is not None:
            # knfsd's answer: the stateid, nothing copied yet; the count, durability and
            # verifier come with CB_OFFLOAD.
            return COPY4res(NFS4_OK, COPY4resok(
                cr_response=write_response4(wr_callback_id=[copy.stateid()], wr_count=0,
                                            wr_committed=UNSTABLE4,
                                            wr_writeverf=ctx.server.write_verifier),
                cr_requirements=copy_requirements4(cr_consecutive=True,
                                                   cr_synchronous=False)))
    count = min(count, COPY_MAX_BYTES)
    await _copy(ctx, "COPY", src, dst, args.ca_src_offset, args.ca_dst_offset, count)
    # Synchronous: no callback id, nothing runs after the reply.
    return COPY4res(NFS4_OK, COPY4resok(
        cr_response=write_response4(wr_callback_id=[], wr_count=count,
                                    wr_committed=FILE_SYNC4,
                                    wr_writeverf=ctx.server.write_verifier),
        cr_requirements=copy_requirements4(cr_consecutive=True, cr_synchronous=True)))


async def op_clone(ctx, args) -> CLONE4res:
    src, dst = _copy_operands(ctx, args.cl_src_stateid, args.cl_dst_stateid)
    count = _source_count(src, args.cl_src_offset, args.cl_count)
    to_end = args.cl_src_offset + count == src.attr.size
    if (args.cl_src_offset % CLONE_BLKSIZE or args.cl_dst_offset % CLONE_BLKSIZE
            or (count % CLONE_BLKSIZE and not to_end)):
        raise NfsError(NFS4ERR_INVAL, f"clone range not aligned to {CLONE_BLKSIZE}")
    await _copy(ctx, "CLONE", src, dst, args.cl_src_offset, args.cl_dst_offset, count)
    return CLONE4res(NFS4_OK)


# ---- 15.9 OFFLOAD_STATUS, 15.8 OFFLOAD_CANCEL -----------------------------------------
def _offload(ctx, sid):
    """The asynchronous copy a stateid names (NFS4ERR_BAD_STATEID when unknown, done and
    delivered, cancelled, or another client's). CURRENT_FH is the destination; knfsd
    does not compare it, nor do we."""
    current(ctx)
    return ctx.server.offloads.find(clientid_of(ctx), sid)


async def op_offload_status(ctx, args) -> OFFLOAD_STATUS4res:
    copy = _offload(ctx, args.osa_stateid)
    # osr_complete empty while the copy runs, else its outcome (15.9.3)
    complete = [] if copy.status is None else [copy.status]
    return OFFLOAD_STATUS4res(NFS4_OK, OFFLOAD_STATUS4resok(osr_count=copy.copied,
                                                            osr_complete=complete))


async def op_offload_cancel(ctx, args) -> OFFLOAD_CANCEL4res:
    ctx.server.offloads.cancel(_offload(ctx, args.oca_stateid))
    return OFFLOAD_CANCEL4res(NFS4_OK)


HANDLERS = {
    OP_SEEK: op_seek,
    OP_ALLOCATE: op_allocate,
    OP_DEALLOCATE: op_deallocate,
    OP_READ_PLUS: op_read_plus,
    OP_COPY: op_copy,
    OP_CLONE: op_clone,
    OP_OFFLOAD_STATUS: op_offload_status,
    OP_OFFLOAD_CANCEL: op_offload_cancel,
}
