"""A RENAME or REMOVE re-sent after a restart, recognised (issue 38).

A session's reply cache (nfsd/state.py) lives in memory: when the gateway dies after it
made a RENAME durable but before the client had the reply, the client re-sends the RENAME
to the next server instance in a new session, where the old name is gone (the first one
moved it) and the op would fail NFS4ERR_NOENT, failing a save whose file is where it was
asked to be. So each RENAME and REMOVE of a client with a durable client record (a 4.1
client after its RECLAIM_COMPLETE: nfsd/grace.py) records its answer in the same index
txn as its change (cache/replies.py, the client's newest MAX_SLOTS kept). When a later
instance would answer that client's same op NOENT for its source name, a record of an
earlier instance with the same client verifier, directories and names, whose file
(RENAME: now under the new name) is there, answers instead, as the op was answered
the first time; the record is consumed. Within one instance nothing is replayed: the
session's slots do that, and a client that sends an op again after its reply gets the
normal answer. Only the source's NOENT ever becomes OK.

Safe because of what the match demands (RFC 8881 2.10.6: a server without persistent
sessions may have executed a re-sent non-idempotent request; it must not execute it
twice): the worst case is a client that really did send the same RENAME twice, the second
after a restart, with nothing at the source and the file it renamed still at the target;
answering OK leaves the namespace exactly as a success of that second RENAME would.
"""
from __future__ import annotations

import asyncio

import structlog

from cache.api import StoreError
from cache.replies import REMOVE, RENAME, ReplyNote, ReplyRecord
from nfsd.ops._common import namespace_op
from nfsd.ops.session import MAX_SLOTS

log = structlog.get_logger(__name__)


def _recorded_client(ctx):
    """The requesting client if its answers are recorded: 4.1 or later (4.0 has no
    sessions; its retransmissions are nfsd/drc.py's), with a durable client record, whose
    deletion drops its reply records too."""
    client = ctx.client
    if ctx.minorversion == 0 or client is None or not client.recorded:
        return None
    return client


async def noted_op(ctx, op: str, *args):
    """namespace_op() of a "rename" or "remove", its answer recorded for the client."""
    client = _recorded_client(ctx)
    if client is None:
        return await namespace_op(ctx, op, *args)
    store = ctx.server.store
    note = ReplyNote(client.owner, client.verifier, ctx.server.write_verifier, MAX_SLOTS)
    return await store.submit_noted(op, note, *args, loop=asyncio.get_running_loop())


def find_match(records: list[ReplyRecord], *, boot: bytes, verifier: bytes, op: int,
               src_dir: int, old: bytes, dst_dir: int = 0, new: bytes = b""
               ) -> ReplyRecord | None:
    """The newest record of an earlier instance (not `boot`) for this client incarnation
    (`verifier`) of exactly this op."""
    for rec in reversed(records):
        if rec.boot == boot or rec.verifier != verifier:
            continue
        if (rec.op, rec.src_dir, rec.old, rec.dst_dir, rec.new) == (op, src_dir, old, dst_dir,
                                                                     new):
            return rec
    return None


async def replayed(ctx, op: int, src_dir: int, old: bytes, dst_dir: int = 0,
                   new: bytes = b"") -> ReplyRecord | None:
    """For an op whose source name `old` is absent: the record to answer it with, consumed;
    None when it gets its normal answer (no record, another instance's or client's, a
    RENAME whose target does not hold the recorded file)."""
    client = _recorded_client(ctx)
    if client is None:
        return None
    store = ctx.server.store
    rec = find_match(store.reply_records(client.owner), boot=ctx.server.write_verifier,
                     verifier=client.verifier, op=op, src_dir=src_dir, old=old,
                     dst_dir=dst_dir, new=new)
    if rec is None:
        return None
    if op == RENAME:
        try:
            target = store.find(dst_dir, new)
        except StoreError:
            return None
        if target is None or target.ino != rec.ino:
            return None
    await store.submit_reply_consumed(client.owner, rec.seq, loop=asyncio.get_running_loop())
    event = "rename_replayed" if op == RENAME else "remove_replayed"
    log.info(event, client=client.name, src_dir=src_dir, old=_text(old), dst_dir=dst_dir,
             new=_text(new), ino=rec.ino)
    return rec


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


__all__ = ["REMOVE", "RENAME", "find_match", "noted_op", "replayed"]
