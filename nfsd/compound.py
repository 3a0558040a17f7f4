"""The COMPOUND procedure (RFC 8881 sections 2.10.6, 15.2, 16.2): decode, sequence, dispatch.

`run_compound` decodes a COMPOUND4args from the call's buffer, applies the session
rules of NFSv4.1/4.2 (SEQUENCE first, its slot and reply cache), runs the ops in
order until one fails, and encodes the COMPOUND4res straight after the RPC reply
header in the caller's buffer. Op handlers come from nfsd/ops (one module per
family); they return their op's result or raise NfsError.
"""
from __future__ import annotations

import logging
import struct
import sys
import time
from dataclasses import dataclass

import structlog

import nfsd.xdr.nfs4 as nfs4
from nfsd import native
from nfsd.context import CompoundContext
from nfsd.errors import NfsError
from nfsd.ops import session as session_ops
from nfsd.optable import OP_NAMES, op_name
from nfsd.xdr.core import XdrError
from nfsd.xdr.nfs4 import (
    ILLEGAL4res, NFS4_OK, NFS4ERR_MINOR_VERS_MISMATCH, NFS4ERR_NOENT, NFS4ERR_NOTSUPP,
    NFS4ERR_NOT_ONLY_OP, NFS4ERR_OP_ILLEGAL, NFS4ERR_OP_NOT_IN_SESSION, NFS4ERR_REP_TOO_BIG,
    NFS4ERR_REP_TOO_BIG_TO_CACHE,
    NFS4ERR_RESOURCE, NFS4ERR_RETRY_UNCACHED_REP, NFS4ERR_SEQUENCE_POS, NFS4ERR_SERVERFAULT,
    NFS4ERR_TOO_MANY_OPS, OP_ILLEGAL, OP_READ, OP_SEQUENCE, OP_WRITE, nfs_argop4,
    nfs_resop4, utf8str_cs,
)

log = structlog.get_logger(__name__)

# The op codecs: generated typed Cython when built (nfsd/xdr/gen_cython.py writes
# nfsd/native/xdr_nfs4.pyx from the same .x text; tests/nfsd/test_xdr_native.py holds it to
# the reference byte for byte and error for error), else the reference combinators.
XDR_ENGINE = native.engine("xdr_nfs4")
if XDR_ENGINE == "native":
    from nfsd.native.xdr_nfs4 import decode_nfs_argop4 as _decode_argop
    from nfsd.native.xdr_nfs4 import encode_nfs_resop4 as _encode_resop
else:
    _decode_argop = nfs_argop4.unpack
    _encode_resop = nfs_resop4.pack

_U32 = struct.Struct(">I")

STATUS_NAMES = {getattr(nfs4, n): n for n in dir(nfs4)
                if (n.startswith("NFS4ERR_") or n == "NFS4_OK") and isinstance(getattr(nfs4, n), int)}

SUPPORTED_MINOR_VERSIONS = (0, 1, 2)
# More ops than this in one COMPOUND are refused before decoding (each needs >= 4 bytes).
MAX_DECODED_OPS = 4096
# Errors that are the normal answer to a question (LOOKUP of a missing name): debug only.
ROUTINE_ERRORS = frozenset({NFS4ERR_NOENT})


class GarbageArgs(Exception):
    """The COMPOUND4args cannot be decoded: the RPC layer answers GARBAGE_ARGS."""


STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, str(status))


# ---- op results -------------------------------------------------------------------

_RESULT_TYPES: dict[int, type] = {}


def result_type(opnum: int):
    t = _RESULT_TYPES.get(opnum)
    if t is None:
        t = getattr(nfs4, OP_NAMES[opnum] + "4res")
        _RESULT_TYPES[opnum] = t
    return t


def _zero_value(t):
    kind = getattr(t, "xdr_kind", None)
    if kind in ("varray", "farray"):
        return []
    if kind in ("vopaque", "fopaque", "string"):
        return b""
    if kind == "bool":
        return False
    return 0


def error_result(opnum: int, status: int) -> nfs_resop4:
    """The op's result carrying only an error status. Most results are unions whose
    error arms are void; some are structs (status first, e.g. SETATTR4res: status +
    attrsset, which is empty on error)."""
    if opnum not in OP_NAMES or opnum == OP_ILLEGAL:
        return nfs_resop4(OP_ILLEGAL, ILLEGAL4res(status))
    t = result_type(opnum)
    if t.xdr_kind == "struct":
        extra = [_zero_value(ft) for _name, ft in t.xdr_fields[1:]]
        return nfs_resop4(opnum, t(status, *extra))
    return nfs_resop4(opnum, t(status))


def result_status(res) -> int:
    if res.xdr_kind == "struct":
        return getattr(res, res.__slots__[0])
    return res.tag


# ---- decoding ---------------------------------------------------------------------

@dataclass(slots=True)
class CompoundArgs:
    tag: bytes
    minorversion: int
    ops: list               # nfs_argop4 values
    illegal_opnum: int | None = None   # an unknown op ended decoding here


def minorversion_of(buf: memoryview) -> int | None:
    """The minor version of a COMPOUND4args without decoding it (None: too short)."""
    if len(buf) < 4:
        return None
    (taglen,) = _U32.unpack_from(buf, 0)
    pos = 4 + taglen + (-taglen % 4)
    if pos + 4 > len(buf):
        return None
    return _U32.unpack_from(buf, pos)[0]


def decode_compound(buf: memoryview) -> CompoundArgs:
    """COMPOUND4args, op by op, so an unknown op number can be answered with
    OP_ILLEGAL after the ops before it (RFC 8881 section 15.2) rather than
    failing the whole call. Anything else malformed raises GarbageArgs."""
    try:
        tag, pos = utf8str_cs.unpack(buf, 0)
        if pos + 8 > len(buf):
            raise GarbageArgs("COMPOUND4args: truncated header")
        minorversion, count = struct.unpack_from(">II", buf, pos)
        pos += 8
        args = CompoundArgs(bytes(tag), minorversion, [])
        if minorversion not in SUPPORTED_MINOR_VERSIONS:
            return args          # the ops may belong to a version we do not know
        if count > MAX_DECODED_OPS:
            args.illegal_opnum = -1
            return args
        for _ in range(count):
            if pos + 4 > len(buf):
                raise GarbageArgs("COMPOUND4args: truncated op array")
            (opnum,) = _U32.unpack_from(buf, pos)
            if opnum not in OP_NAMES or opnum == OP_ILLEGAL:
                args.illegal_opnum = opnum
                return args
            op, pos = _decode_argop(buf, pos)
            args.ops.append(op)
        if pos != len(buf):
            raise GarbageArgs(f"COMPOUND4args: {len(buf) - pos} bytes after the last op")
        return args
    except XdrError as exc:
        raise GarbageArgs(str(exc)) from None


# ---- the loop ---------------------------------------------------------------------

@dataclass(slots=True)
class CompoundOutcome:
    status: int
    opnums: list
    replayed: bool = False
    tail: tuple | None = None        # (data, pad) after the encoded results (_Results.tail)


# A READ's data from this size on is not copied into the reply buffer but sent after it
# (rpc.Reply); above the session reply cache's limit, so such a reply is never cached.
OUT_OF_LINE_MIN = 64 * 1024
assert OUT_OF_LINE_MIN > session_ops.REPLY_CACHE_LIMIT


class _Results:
    """COMPOUND4res encoded as it grows: status and count are patched at the end."""

    def __init__(self, out: bytearray, tag: bytes, limit: int):
        self.out = out
        self.start = len(out)
        self.limit = limit
        self.too_big = NFS4ERR_REP_TOO_BIG       # or REP_TOO_BIG_TO_CACHE under sa_cachethis
        out += b"\0\0\0\0"                      # status, patched
        utf8str_cs.pack(tag, out)
        self.count_at = len(out)
        out += b"\0\0\0\0"                      # resarray length, patched
        self.count = 0
        self.status = NFS4_OK
        self.opnums: list = []
        # (data, pad): the last result's READ data, which follows `out` on the wire; a
        # result added after it puts it in line first
        self.tail: tuple | None = None

    def add(self, resop) -> int:
        """Encode one op result; returns its status. A result that cannot be encoded
        (a handler bug) becomes NFS4ERR_SERVERFAULT; one that makes the reply larger
        than the session allows becomes NFS4ERR_REP_TOO_BIG, or REP_TOO_BIG_TO_CACHE when
        the client asked for it to be cached (RFC 8881 18.46.3, 2.10.6.4)."""
        if self.tail is not None:
            data, pad = self.tail
            self.out += data
            self.out += bytes(pad)
            self.tail = None
        mark = len(self.out)
        data = _out_of_line_data(resop)
        try:
            if data is None:
                _encode_resop(resop, self.out)
            else:     # encoded with no data: its length is patched in, the data follows
                _encode_resop(_read_without_data(resop), self.out)
                _U32.pack_into(self.out, len(self.out) - 4, len(data))
        except XdrError as exc:
            del self.out[mark:]
            log.error("op_result_unencodable", op=op_name(resop.tag), error=str(exc))
            resop, data = error_result(resop.tag, NFS4ERR_SERVERFAULT), None
            _encode_resop(resop, self.out)
        if data is not None:
            self.tail = (data, -len(data) % 4)
        if self.room() < 0:
            del self.out[mark:]
            self.tail = None
            resop = error_result(resop.tag, self.too_big)
            _encode_resop(resop, self.out)
        self.count += 1
        self.opnums.append(resop.tag)
        self.status = result_status(resop.value)
        return self.status

    def room(self) -> int:
        """Bytes the reply may still grow by."""
        tail = 0 if self.tail is None else len(self.tail[0]) + self.tail[1]
        return self.limit - (len(self.out) + tail - self.start)

    def finish(self) -> None:
        _U32.pack_into(self.out, self.start, self.status)
        _U32.pack_into(self.out, self.count_at, self.count)


def _out_of_line_data(resop):
    """The data of a successful READ result large enough to send out of line, else None."""
    if resop.tag != OP_READ or resop.value.tag != NFS4_OK:
        return None
    data = resop.value.value.data
    return data if len(data) >= OUT_OF_LINE_MIN else None


def _read_without_data(resop):
    ok = resop.value.value
    return nfs_resop4(OP_READ, nfs4.READ4res(NFS4_OK, nfs4.READ4resok(eof=ok.eof, data=b"")))


async def run_compound(server, cred, peer, conn, args_buf: memoryview,
                       out: bytearray) -> CompoundOutcome:
    """Run one COMPOUND; append the encoded COMPOUND4res to `out`.
    Raises GarbageArgs when the arguments cannot be decoded."""
    started = time.monotonic()
    args = decode_compound(args_buf)
    ctx = CompoundContext(server=server, cred=cred, peer=peer, conn=conn,
                          minorversion=args.minorversion, tag=args.tag)
    body_start = len(out)
    limit = session_ops.MAX_RESPONSE_SIZE
    results = _Results(out, args.tag, limit)
    outcome = CompoundOutcome(NFS4_OK, results.opnums)
    slot = None
    cachethis = False
    try:
        if args.minorversion not in SUPPORTED_MINOR_VERSIONS:
            results.status = NFS4ERR_MINOR_VERS_MISMATCH          # no results (16.2.3)
        elif args.illegal_opnum == -1:
            results.status = (NFS4ERR_RESOURCE if args.minorversion == 0
                              else NFS4ERR_TOO_MANY_OPS)
        else:
            ops = args.ops
            first = 0
            if args.minorversion >= 1 and ops:
                first, slot, replay = _start_session_part(ctx, args, results, len(args_buf))
                if replay is not None:
                    del out[body_start:]
                    out += replay
                    outcome.replayed = True
                    outcome.status = _U32.unpack_from(replay, 0)[0]
                    return outcome
                if slot is not None:
                    cachethis = bool(ops[0].value.sa_cachethis)
            if first is not None:
                await _run_ops(ctx, args, ops, first, results)
        results.finish()
        outcome.status = results.status
        outcome.tail = results.tail
        if slot is not None:
            session_ops.store_reply(server.sessions, ctx.session, slot, out, body_start, cachethis,
                                    out_of_line=results.tail is not None)
            slot = None
        return outcome
    finally:
        if slot is not None:         # cancelled or crashed: free the slot, keep nothing
            slot.in_progress = False
        _log_compound(ctx, args, outcome, started)


def _start_session_part(ctx, args, results: _Results, request_size: int):
    """The 4.1 rules for the first op (RFC 8881 2.6.3.1, 18.46). Returns
    (index of the next op to run or None to stop, slot to cache into, replay bytes)."""
    ops = args.ops
    op0 = ops[0]
    if op0.tag != OP_SEQUENCE:
        row = ctx.server.ops[op0.tag]
        if row.sessionless:
            if len(ops) > 1 or args.illegal_opnum is not None:
                results.add(error_result(op0.tag, NFS4ERR_NOT_ONLY_OP))
                return None, None, None
            return 0, None, None
        if row.since > args.minorversion:
            results.add(error_result(OP_ILLEGAL, NFS4ERR_OP_ILLEGAL))
        elif row.v40_only:
            results.add(error_result(op0.tag, NFS4ERR_NOTSUPP))
        else:
            results.add(error_result(op0.tag, NFS4ERR_OP_NOT_IN_SESSION))
        return None, None, None
    nops = len(ops) + (1 if args.illegal_opnum is not None else 0)
    try:
        # What a retransmission must match (a cheap test, as Linux knfsd's): size and ops.
        signature = (request_size, tuple(o.tag for o in ops), args.illegal_opnum)
        seq = session_ops.sequence(ctx, op0.value, request_size, nops, signature)
    except NfsError as err:
        _log_op_error(ctx, op0.tag, err)
        results.add(error_result(OP_SEQUENCE, err.status))
        return None, None, None
    if seq.replay is not None:
        return None, None, seq.replay
    fore = ctx.session.fore
    results.limit = fore.maxresponsesize
    if op0.value.sa_cachethis and not seq.uncached_retry:
        results.limit = min(fore.maxresponsesize, fore.maxresponsesize_cached)
        results.too_big = NFS4ERR_REP_TOO_BIG_TO_CACHE
    if results.add(nfs_resop4(OP_SEQUENCE, seq.result)) != NFS4_OK:
        return None, seq.slot, None        # not even SEQUENCE's reply fits

    if seq.uncached_retry:
        # RFC 8881 2.10.6.1.3: SEQUENCE succeeds, the next op says the reply is gone.
        if len(ops) > 1:
            results.add(error_result(ops[1].tag, NFS4ERR_RETRY_UNCACHED_REP))
        return None, None, None
    return 1, seq.slot, None


async def _run_ops(ctx, args: CompoundArgs, ops: list, first: int, results: _Results) -> None:
    rows = ctx.server.ops.rows     # nfsd/optable.py; decode_compound let declared ops through only
    minor = ctx.minorversion
    observer = ctx.server.observer
    last = len(ops) - 1
    for i in range(first, len(ops)):
        op = ops[i]
        opnum = op.tag
        ctx.extra["last_op"] = i == last and args.illegal_opnum is None
        ctx.extra["reply_room"] = results.room()      # READ clips its data to this
        row = rows[opnum]
        if row.since > minor:
            results.add(error_result(OP_ILLEGAL, NFS4ERR_OP_ILLEGAL))
            return
        if minor >= 1 and opnum == OP_SEQUENCE:
            results.add(error_result(opnum, NFS4ERR_SEQUENCE_POS))
            return
        if minor >= 1 and row.v40_only:
            results.add(error_result(opnum, NFS4ERR_NOTSUPP))
            return
        handler = row.handler
        if handler is None:        # pNFS, delegations, locks, 4.2 extras: not offered
            results.add(error_result(opnum, NFS4ERR_NOTSUPP))
            return
        started = time.monotonic()
        try:
            res = await handler(ctx, op.value)
            resop = nfs_resop4(opnum, res)
        except NfsError as err:
            _log_op_error(ctx, opnum, err)
            resop = error_result(opnum, err.status)
        except Exception:
            log.exception("op_failed", op=op_name(opnum), client=_client_name(ctx))
            resop = error_result(opnum, NFS4ERR_SERVERFAULT)
        status = results.add(resop)
        if observer is not None:
            _observe(observer, opnum, status, time.monotonic() - started, resop)
        if status != NFS4_OK:
            return
    if args.illegal_opnum is not None:
        results.add(error_result(OP_ILLEGAL, NFS4ERR_OP_ILLEGAL))


def _observe(observer, opnum: int, status: int, seconds: float, resop) -> None:
    """Per-op accounting for metrics: observer(op, status, seconds, nbytes). Every op
    that runs is counted except SEQUENCE (it is in every 4.1 COMPOUND)."""
    nbytes = 0
    if status == NFS4_OK:
        if opnum == OP_READ:
            nbytes = len(resop.value.value.data)
        elif opnum == OP_WRITE:
            nbytes = resop.value.value.count
    try:
        observer(op_name(opnum), status_name(status), seconds, nbytes)
    except Exception:           # metrics must never fail an op
        log.exception("op_observer_failed", op=op_name(opnum))


# ---- logging ----------------------------------------------------------------------

def _client_name(ctx) -> str:
    if ctx.client is not None:
        return ctx.client.name
    return ctx.peer[0] if ctx.peer else "?"


def _log_op_error(ctx, opnum: int, err: NfsError) -> None:
    level = log.debug if err.status in ROUTINE_ERRORS else log.info
    level("op_error", client=_client_name(ctx), op=op_name(opnum),
          status=status_name(err.status), detail=err.detail or None)


def _log_compound(ctx, args: CompoundArgs, outcome: CompoundOutcome, started: float) -> None:
    if not log.is_enabled_for(logging.DEBUG):
        return                      # its arguments cost more than the disabled call (issue 15)
    log.debug("compound", client=_client_name(ctx), minorversion=args.minorversion,
              ops=[op_name(op.tag) for op in args.ops], status=status_name(outcome.status),
              replayed=outcome.replayed or None,
              ms=round((time.monotonic() - started) * 1000, 3))


# ---- the engine -------------------------------------------------------------------

# The loop above is the reference. The typed one (nfsd/native/compound.pyx; held to this one
# byte for byte by tests/nfsd/test_compound_native.py) runs when built, unless
# CKPTGW_ENGINE=python. Last in the module: the native loop takes its shared pieces from here.
python_run_compound = run_compound
COMPOUND_ENGINE = native.engine("compound")
if COMPOUND_ENGINE == "native":
    from nfsd.native import compound as _native_compound
    _native_compound.bind(sys.modules[__name__])
    run_compound = _native_compound.run_compound  # noqa: F811
