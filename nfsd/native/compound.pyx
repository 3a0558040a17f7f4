# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The COMPOUND loop, typed (issue 37 point 3): a drop-in for nfsd/compound.py's run_compound.

nfsd/compound.py stays the specification; tests/nfsd/test_compound_native.py feeds both loops the
same COMPOUND bytes and requires the same reply bytes. What is native here: the COMPOUND4args
header and op-number scan (C reads of the caller's buffer), the op rules (since / 4.0-only /
sessionless as C arrays built from nfsd/optable.py's DESCRIPTORS), the result accumulation with
C size accounting, error results as cached encodings, and each result encoded by its own type's
codec (no nfs_resop4 object per op). Still Python: the handlers (nfsd/ops), SEQUENCE's slot
logic (nfsd/ops/session.py), the per-request CompoundContext they receive, and the log lines.

The reference's shared pieces (GarbageArgs, error_result, the log helpers, the codecs it
chose) are taken from nfsd.compound by bind(), which nfsd/compound.py calls once it has them.
"""
from libc.stdint cimport uint32_t
from libc.string cimport memcpy
from libc.time cimport timespec
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE

cdef extern from "<time.h>" nogil:
    int clock_gettime(int clk, timespec* ts)
    int CLOCK_MONOTONIC

cdef extern from "Python.h":
    int PyByteArray_Resize(object ba, Py_ssize_t n) except -1

from nfsd.context import CompoundContext
from nfsd.errors import NfsError
from nfsd.ops import session as _session_ops
from nfsd.optable import DESCRIPTORS as _DESCRIPTORS, OP_NAMES as _OP_NAMES
from nfsd.xdr import nfs4 as _n
from nfsd.xdr.core import XdrError

cdef enum:
    NFS4_OK = 0
    OP_READ = 25
    OP_WRITE = 38
    OP_SEQUENCE = 53
    OP_ILLEGAL = 10044
    NOPS = 128                  # above every declared op number (asserted below)
    MAX_DECODED_OPS = 4096      # == nfsd.compound.MAX_DECODED_OPS (checked by bind)
    NO_ILLEGAL = -2             # Args.illegal: no unknown op; -1: too many ops; else its number

cdef int E_MINOR_VERS_MISMATCH = _n.NFS4ERR_MINOR_VERS_MISMATCH
cdef int E_RESOURCE = _n.NFS4ERR_RESOURCE
cdef int E_TOO_MANY_OPS = _n.NFS4ERR_TOO_MANY_OPS
cdef int E_NOT_ONLY_OP = _n.NFS4ERR_NOT_ONLY_OP
cdef int E_OP_ILLEGAL = _n.NFS4ERR_OP_ILLEGAL
cdef int E_NOTSUPP = _n.NFS4ERR_NOTSUPP
cdef int E_OP_NOT_IN_SESSION = _n.NFS4ERR_OP_NOT_IN_SESSION
cdef int E_RETRY_UNCACHED_REP = _n.NFS4ERR_RETRY_UNCACHED_REP
cdef int E_SEQUENCE_POS = _n.NFS4ERR_SEQUENCE_POS
cdef int E_SERVERFAULT = _n.NFS4ERR_SERVERFAULT
cdef int E_REP_TOO_BIG = _n.NFS4ERR_REP_TOO_BIG
cdef int E_REP_TOO_BIG_TO_CACHE = _n.NFS4ERR_REP_TOO_BIG_TO_CACHE
cdef object _SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED = _n.SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
assert (_n.OP_READ, _n.OP_WRITE, _n.OP_SEQUENCE, _n.OP_ILLEGAL) == (OP_READ, OP_WRITE, OP_SEQUENCE, OP_ILLEGAL)

# The op rules by number (nfsd/optable.py): what is true of an op whoever serves it.
cdef unsigned char _known[NOPS]       # a declared fore channel op (not ILLEGAL)
cdef int _since[NOPS]
cdef unsigned char _v40_only[NOPS]
cdef unsigned char _sessionless[NOPS]
cdef unsigned char _struct_res[NOPS]  # its result is a struct (status first), else a union
assert max(_DESCRIPTORS) < NOPS and set(_DESCRIPTORS) == set(_OP_NAMES) - {OP_ILLEGAL}
for _num, _d in _DESCRIPTORS.items():
    _known[_num] = 1
    _since[_num] = _d.since
    _v40_only[_num] = _d.v40_only
    _sessionless[_num] = _d.sessionless
    _struct_res[_num] = getattr(_n, _d.name + "4res").xdr_kind == "struct"

cdef list _STATUS_FIELD = [None] * NOPS          # a struct result's status slot name
cdef list _RES_ENCODE = [None] * NOPS            # the encode method of each op's result codec
cdef list _NAMES = [None] * NOPS                 # op_name(num)

# Bound from nfsd.compound by bind(): the reference's pieces this loop shares.
cdef object GarbageArgs = None
cdef object error_result = None
cdef object _decode_argop = None
cdef object _decode_tag = None
cdef object _encode_tag = None
cdef object _read_without_data = None
cdef object _log_op_error = None
cdef object _log_compound = None
cdef object _client_name = None
cdef object _status_name = None
cdef object _routine_errors = frozenset()
cdef object _DEBUG = 10                          # logging.DEBUG
cdef object log = None
cdef object _ref = None
cdef dict _ERR_BYTES = {}                        # (opnum << 32 | status) -> encoded error result
cdef dict _OPNUM_BY_NAME = {}                    # op_name -> number, filled by bind()


def bind(ref):
    """Take the shared pieces from nfsd.compound (`ref`), once it has defined them."""
    global GarbageArgs, error_result, _decode_argop, _decode_tag, _encode_tag, _read_without_data
    global _log_op_error, _log_compound, _client_name, _status_name, log, _ref, _routine_errors
    if _ref is ref:
        return
    assert ref.MAX_DECODED_OPS == MAX_DECODED_OPS and ref.SUPPORTED_MINOR_VERSIONS == (0, 1, 2)
    GarbageArgs = ref.GarbageArgs
    error_result = ref.error_result
    _decode_argop = ref._decode_argop
    _read_without_data = ref._read_without_data
    _log_op_error = ref._log_op_error
    _routine_errors = ref.ROUTINE_ERRORS
    _log_compound = ref._log_compound
    _client_name = ref._client_name
    _status_name = ref.status_name
    log = ref.log
    if ref.XDR_ENGINE == "native":
        from nfsd.native.xdr_nfs4 import codec
    else:
        codec = lambda t: t          # the reference types have .unpack(buf, pos) / .pack(v, out)
    tag_codec = codec(_n.utf8str_cs)
    _decode_tag = tag_codec.decode if ref.XDR_ENGINE == "native" else tag_codec.unpack
    _encode_tag = tag_codec.encode if ref.XDR_ENGINE == "native" else tag_codec.pack
    for num, d in _DESCRIPTORS.items():
        t = getattr(_n, d.name + "4res")
        _RES_ENCODE[num] = codec(t).encode if ref.XDR_ENGINE == "native" else t.pack
        _STATUS_FIELD[num] = t.__slots__[0] if _struct_res[num] else None
        _NAMES[num] = d.name
        _OPNUM_BY_NAME[d.name] = num
    _ERR_BYTES.clear()
    _ref = ref


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)      # time.monotonic()'s clock
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline uint32_t _r32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline void _w32(unsigned char* q, uint32_t x) noexcept nogil:
    q[0] = <unsigned char>(x >> 24)
    q[1] = <unsigned char>(x >> 16)
    q[2] = <unsigned char>(x >> 8)
    q[3] = <unsigned char>x


cdef inline void _p32(bytearray out, Py_ssize_t at, uint32_t x) noexcept:
    _w32(<unsigned char*>PyByteArray_AS_STRING(out) + at, x)


cdef inline int _truncate(bytearray out, Py_ssize_t n) except -1:
    if PyByteArray_GET_SIZE(out) != n:
        PyByteArray_Resize(out, n)
    return 0


cdef inline bint _debug_enabled() except -1:
    return log.is_enabled_for(_DEBUG)


cdef int _op_error(ctx, int opnum, err) except -1:
    """nfsd.compound._log_op_error, which logs a routine error (LOOKUP's NOENT) at debug
    level: skipped, with the cost of its arguments, when debug is off."""
    if err.status in _routine_errors and not _debug_enabled():
        return 0
    _log_op_error(ctx, opnum, err)
    return 0


# ---- decoding ---------------------------------------------------------------------

cdef class Args:
    """COMPOUND4args as decode_compound leaves it (nfsd.compound.CompoundArgs' fields)."""
    cdef public bytes tag
    cdef public long long minorversion
    cdef public list ops                 # nfs_argop4 values
    cdef long long illegal               # NO_ILLEGAL, -1 (too many ops) or the unknown op number

    @property
    def illegal_opnum(self):
        return None if self.illegal == NO_ILLEGAL else self.illegal


cpdef Args decode_compound(buf):
    """nfsd.compound.decode_compound: the ops one by one, an unknown op number ends them
    (answered OP_ILLEGAL after the ops before it); anything else malformed is GarbageArgs."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t n, pos
    cdef uint32_t count, i, opnum
    cdef Args args = Args.__new__(Args)
    args.illegal = NO_ILLEGAL
    try:
        tag, pos = _decode_tag(buf, 0)
    except XdrError as exc:
        raise GarbageArgs(str(exc)) from None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        n = view.len
        if pos + 8 > n:
            raise GarbageArgs("COMPOUND4args: truncated header")
        args.tag = bytes(tag)
        args.minorversion = _r32(p + pos)
        count = _r32(p + pos + 4)
        pos += 8
        args.ops = []
        if args.minorversion > 2:
            return args          # the ops may belong to a version we do not know
        if count > MAX_DECODED_OPS:
            args.illegal = -1
            return args
        for i in range(count):
            if pos + 4 > n:
                raise GarbageArgs("COMPOUND4args: truncated op array")
            opnum = _r32(p + pos)
            if opnum >= NOPS or not _known[opnum]:
                args.illegal = opnum
                return args
            try:
                op, pos = _decode_argop(buf, pos)
            except XdrError as exc:
                raise GarbageArgs(str(exc)) from None
            args.ops.append(op)
        if pos != n:
            raise GarbageArgs(f"COMPOUND4args: {n - pos} bytes after the last op")
        return args
    finally:
        PyBuffer_Release(&view)


# ---- results ----------------------------------------------------------------------

cdef class Results:
    """COMPOUND4res encoded as it grows (nfsd.compound._Results): status and count are
    patched at the end; READ data from OUT_OF_LINE_MIN on follows `out` as the tail."""
    cdef bytearray out
    cdef Py_ssize_t start, count_at, ool_min, tail_bytes
    cdef public Py_ssize_t limit
    cdef public int too_big
    cdef public Py_ssize_t count
    cdef public long long status
    cdef public list opnums
    cdef object tail_data                # None, or the last result's READ data

    def __init__(self, bytearray out not None, tag, Py_ssize_t limit):
        self.out = out
        self.start = PyByteArray_GET_SIZE(out)
        self.limit = limit
        self.too_big = E_REP_TOO_BIG
        self.ool_min = _ref.OUT_OF_LINE_MIN      # read per COMPOUND: tests move it
        out += b"\0\0\0\0"                       # status, patched
        _encode_tag(tag, out)
        self.count_at = PyByteArray_GET_SIZE(out)
        out += b"\0\0\0\0"                       # resarray length, patched
        self.count = 0
        self.status = NFS4_OK
        self.opnums = []
        self.tail_data = None
        self.tail_bytes = 0

    @property
    def tail(self):
        """(data, pad) of the READ data that follows `out` on the wire, or None."""
        if self.tail_data is None:
            return None
        return (self.tail_data, self.tail_bytes - len(self.tail_data))

    cpdef Py_ssize_t room(self):
        """Bytes the reply may still grow by."""
        return self.limit - (PyByteArray_GET_SIZE(self.out) + self.tail_bytes - self.start)

    cdef int _inline_tail(self) except -1:
        cdef Py_ssize_t pad
        if self.tail_data is not None:
            pad = self.tail_bytes - len(self.tail_data)
            self.out += self.tail_data
            self.out += bytes(pad)
            self.tail_data = None
            self.tail_bytes = 0
        return 0

    cdef long long _put_error(self, int opnum, long long status) except? -1:
        """Append opnum's result carrying only `status` (encoded once per pair, then
        copied); the status written: NFS4ERR_SERVERFAULT if `status` is no nfsstat4."""
        cdef Py_ssize_t mark
        cdef bint cacheable = 0 <= status < 0x80000000
        key = (<long long>opnum << 32) | status if cacheable else None
        enc = _ERR_BYTES.get(key) if cacheable else None
        if enc is None:
            buf = bytearray()
            try:
                _ref._encode_resop(error_result(opnum, status), buf)
            except XdrError as exc:         # as _Results.add: a handler's bad status
                log.error("op_result_unencodable", op=_NAMES[opnum] if opnum < NOPS else "ILLEGAL",
                          error=str(exc))
                return self._put_error(opnum, E_SERVERFAULT)
            enc = bytes(buf)
            if cacheable and len(_ERR_BYTES) < 4096:
                _ERR_BYTES[key] = enc
        self.out += <bytes>enc
        return status

    cdef long long _finish_add(self, int opnum, long long status):
        self.count += 1
        self.opnums.append(opnum)
        self.status = status
        return status

    cdef long long add_error(self, int opnum, long long status) except? -1:
        """nfsd.compound._Results.add(error_result(opnum, status)), without the object."""
        cdef Py_ssize_t mark
        if opnum < 0 or opnum >= NOPS or not _known[opnum]:
            opnum = OP_ILLEGAL
        self._inline_tail()
        mark = PyByteArray_GET_SIZE(self.out)
        status = self._put_error(opnum, status)
        if self.room() < 0:
            _truncate(self.out, mark)
            status = self.too_big
            self._put_error(opnum, status)
        return self._finish_add(opnum, status)

    cdef long long add_result(self, int opnum, object res) except? -1:
        """nfsd.compound._Results.add(nfs_resop4(opnum, res)) for a declared op: encoded by
        its result type's codec. Unencodable (a handler bug): NFS4ERR_SERVERFAULT; too big
        for the session: self.too_big (RFC 8881 18.46.3, 2.10.6.4)."""
        cdef Py_ssize_t mark, n
        cdef long long status
        cdef bint failed = False
        self._inline_tail()
        out = self.out
        mark = PyByteArray_GET_SIZE(out)
        data = None
        if opnum == OP_READ:
            data = _out_of_line_data(res, self.ool_min)
        try:
            out += b"\0\0\0\0"
            _p32(out, mark, <uint32_t>opnum)
            if data is None:
                _RES_ENCODE[opnum](res, out)
            else:     # encoded with no data: its length is patched in, the data follows
                _RES_ENCODE[opnum](_read_without_data(_ResOp(opnum, res)).value, out)
                n = len(data)
                _p32(out, PyByteArray_GET_SIZE(out) - 4, <uint32_t>n)
                self.tail_data = data
                self.tail_bytes = n + (-n & 3)
        except XdrError as exc:
            _truncate(out, mark)
            log.error("op_result_unencodable", op=_NAMES[opnum], error=str(exc))
            failed = True
        if failed:
            status = self._put_error(opnum, E_SERVERFAULT)
        else:
            status = _status_of(opnum, res)
        if self.room() < 0:
            _truncate(out, mark)
            self.tail_data = None
            self.tail_bytes = 0
            status = self.too_big
            self._put_error(opnum, status)
        return self._finish_add(opnum, status)

    cdef long long add_sequence_ok(self, bytes sessionid, uint32_t seqid, uint32_t slotid,
                                   uint32_t highest, uint32_t flags) except? -1:
        """add_result(OP_SEQUENCE, SEQUENCE4res(NFS4_OK, SEQUENCE4resok(...))) written directly."""
        cdef Py_ssize_t mark
        cdef unsigned char* q
        cdef long long status = NFS4_OK
        self._inline_tail()
        mark = PyByteArray_GET_SIZE(self.out)
        PyByteArray_Resize(self.out, mark + 44)
        q = <unsigned char*>PyByteArray_AS_STRING(self.out) + mark
        _w32(q, OP_SEQUENCE)
        _w32(q + 4, NFS4_OK)
        memcpy(q + 8, <const char*>sessionid, 16)
        _w32(q + 24, seqid)
        _w32(q + 28, slotid)
        _w32(q + 32, highest)            # sr_highest_slotid
        _w32(q + 36, highest)            # sr_target_highest_slotid
        _w32(q + 40, flags)
        if self.room() < 0:
            _truncate(self.out, mark)
            status = self._put_error(OP_SEQUENCE, self.too_big)
        return self._finish_add(OP_SEQUENCE, status)

    def add(self, resop):
        """nfsd.compound._Results.add: encode one op result (an nfs_resop4); its status."""
        cdef long long opnum = resop.tag
        if 0 <= opnum < NOPS and _known[opnum]:
            return self.add_result(<int>opnum, resop.value)
        return self.add_error(OP_ILLEGAL, resop.value.status)

    def finish(self):
        _p32(self.out, self.start, <uint32_t>self.status)
        _p32(self.out, self.count_at, <uint32_t>self.count)


class _ResOp:
    """The (tag, value) shape _read_without_data reads."""
    __slots__ = ("tag", "value")

    def __init__(self, tag, value):
        self.tag = tag
        self.value = value


cdef inline long long _status_of(int opnum, object res) except? -1:
    if _struct_res[opnum]:
        return getattr(res, _STATUS_FIELD[opnum])
    return res.tag


cdef object _out_of_line_data(object res, Py_ssize_t ool_min):
    """The data of a successful READ result large enough to send out of line, else None."""
    if res.tag != NFS4_OK:
        return None
    data = res.value.data
    return data if len(data) >= ool_min else None


# ---- the loop ---------------------------------------------------------------------

cdef class Outcome:
    """nfsd.compound.CompoundOutcome."""
    cdef public long long status
    cdef public list opnums
    cdef public bint replayed
    cdef public object tail              # (data, pad) after the encoded results, or None

    def __init__(self, status, opnums, replayed=False, tail=None):
        self.status = status
        self.opnums = opnums
        self.replayed = replayed
        self.tail = tail


async def run_compound(server, cred, peer, conn, args_buf, bytearray out not None):
    """nfsd.compound.run_compound: run one COMPOUND; append the encoded COMPOUND4res to
    `out`. Raises GarbageArgs when the arguments cannot be decoded."""
    cdef double started = _monotonic()
    cdef Args args = decode_compound(args_buf)
    cdef Py_ssize_t body_start, first
    cdef Results results
    cdef Outcome outcome
    cdef bint cachethis = False
    cdef list ops = args.ops
    cdef bint debug = _debug_enabled()
    ctx = CompoundContext(server=server, cred=cred, peer=peer, conn=conn,
                          minorversion=args.minorversion, tag=args.tag)
    body_start = PyByteArray_GET_SIZE(out)
    results = Results(out, args.tag, _session_ops.MAX_RESPONSE_SIZE)
    outcome = Outcome.__new__(Outcome)
    outcome.status = NFS4_OK
    outcome.opnums = results.opnums
    slot = None
    try:
        if args.minorversion > 2:
            results.status = E_MINOR_VERS_MISMATCH             # no results (16.2.3)
        elif args.illegal == -1:
            results.status = E_RESOURCE if args.minorversion == 0 else E_TOO_MANY_OPS
        else:
            first = 0
            if args.minorversion >= 1 and ops:
                first, slot, replay = _start_session_part(ctx, args, results,
                                                          len(args_buf))
                if replay is not None:
                    _truncate(out, body_start)
                    out += replay
                    outcome.replayed = True
                    outcome.status = int.from_bytes(replay[:4], "big")
                    return outcome
                if slot is not None:
                    cachethis = bool(ops[0].value.sa_cachethis)
            if first >= 0:
                await _run_ops(ctx, args, first, results, debug)
        results.finish()
        outcome.status = results.status
        outcome.tail = results.tail
        if slot is not None:
            _store_reply(server.sessions, ctx.session, slot, out, body_start, cachethis,
                         results.tail_data is not None)
            slot = None
        return outcome
    finally:
        if slot is not None:         # cancelled or crashed: free the slot, keep nothing
            slot.in_progress = False
        if debug:                   # as _log_compound's own test, without its call
            _log_compound(ctx, args, outcome, started)


cdef Py_ssize_t REPLY_CACHE_LIMIT = _session_ops.REPLY_CACHE_LIMIT


cdef int _store_reply(mgr, session, slot, bytearray out, Py_ssize_t start, bint cachethis,
                      bint out_of_line) except -1:
    """nfsd/ops/session.py store_reply with SessionManager.keep_reply and forget_reply
    (nfsd/state.py) written out: keep the reply in its slot within the slot's reservation,
    in the shared extra pool while it lasts, else remember it as uncached."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(out) - start
    cdef bint kept = False
    if not out_of_line and size <= REPLY_CACHE_LIMIT:
        mgr.drc_extra -= slot.extra          # forget_reply, as keep_reply begins
        slot.extra = 0
        slot.reply = None
        slot.cached = False
        if size <= session.slot_bytes:
            kept = True
        elif not session.destroyed and mgr.drc_extra + size <= mgr.drc_extra_budget:
            slot.extra = size
            mgr.drc_extra += size
            kept = True
        if kept:
            slot.reply = bytes(out[start:])
            slot.cached = True
    if not kept:
        mgr.forget_reply(slot)
        if cachethis:       # cannot happen: such a reply is held to the session's cached size
            _session_ops.log.warning("reply_too_big_to_cache", size=size)
    slot.in_progress = False
    return 0


cdef tuple _start_session_part(ctx, Args args, Results results, Py_ssize_t request_size):
    """The 4.1 rules for the first op (RFC 8881 2.6.3.1, 18.46). Returns (index of the
    next op to run or -1 to stop, slot to cache into, replay bytes)."""
    cdef list ops = args.ops
    cdef Py_ssize_t nops, i
    cdef int opnum0
    op0 = ops[0]
    opnum0 = op0.tag
    if opnum0 != OP_SEQUENCE:
        if _sessionless[opnum0]:
            if len(ops) > 1 or args.illegal != NO_ILLEGAL:
                results.add_error(opnum0, E_NOT_ONLY_OP)
                return -1, None, None
            return 0, None, None
        if _since[opnum0] > args.minorversion:
            results.add_error(OP_ILLEGAL, E_OP_ILLEGAL)
        elif _v40_only[opnum0]:
            results.add_error(opnum0, E_NOTSUPP)
        else:
            results.add_error(opnum0, E_OP_NOT_IN_SESSION)
        return -1, None, None
    nops = len(ops) + (1 if args.illegal != NO_ILLEGAL else 0)
    opnums = [None] * len(ops)
    for i in range(len(ops)):
        opnums[i] = ops[i].tag
    # What a retransmission must match (a cheap test, as Linux knfsd's): size and ops.
    signature = (request_size, tuple(opnums), args.illegal_opnum)
    sa = op0.value
    slot = _new_request(ctx, sa, request_size, nops, signature, results)
    if slot is not None:
        return (1, slot, None) if results.status == NFS4_OK else (-1, slot, None)
    try:
        seq = _session_ops.sequence(ctx, sa, request_size, nops, signature)
    except NfsError as err:
        _op_error(ctx, OP_SEQUENCE, err)
        results.add_error(OP_SEQUENCE, err.status)
        return -1, None, None
    if seq.replay is not None:
        return -1, None, seq.replay
    _set_limit(results, ctx.session.fore, sa.sa_cachethis and not seq.uncached_retry)
    if results.add_result(OP_SEQUENCE, seq.result) != NFS4_OK:
        return -1, seq.slot, None          # not even SEQUENCE's reply fits
    if seq.uncached_retry:
        # RFC 8881 2.10.6.1.3: SEQUENCE succeeds, the next op says the reply is gone.
        if len(ops) > 1:
            results.add_error(ops[1].tag, E_RETRY_UNCACHED_REP)
        return -1, None, None
    return 1, seq.slot, None


cdef int _set_limit(Results results, fore, bint cached) except -1:
    results.limit = fore.maxresponsesize
    if cached:
        results.limit = min(fore.maxresponsesize, fore.maxresponsesize_cached)
        results.too_big = E_REP_TOO_BIG_TO_CACHE
    return 0


cdef object _new_request(ctx, sa, Py_ssize_t request_size, Py_ssize_t nops, tuple signature,
                         Results results):
    """SEQUENCE's common case typed: a new request on a valid slot of a known session, within
    the session's limits. Does what nfsd/ops/session.py's sequence() does then, adds the
    SEQUENCE result and returns the slot; None (having changed nothing) for every other case
    (unknown session, bad slot, retransmission, misordered, too many ops, too big), which
    sequence() itself then answers."""
    cdef uint32_t seqid, flags, highest
    mgr = ctx.server.sessions
    session = mgr.sessions.get(bytes(sa.sa_sessionid))
    if session is None:
        return None
    slots = session.slots
    slotid = sa.sa_slotid
    if slotid >= len(slots):
        return None
    slot = slots[slotid]
    seqid = sa.sa_sequenceid
    if seqid != <uint32_t>(<uint32_t>slot.seqid + 1):     # next_seqid: wraps at 2**32
        return None
    fore = session.fore
    if nops > fore.maxoperations or request_size > fore.maxrequestsize:
        return None
    slot.seqid = seqid
    slot.used = True
    slot.signature = signature
    mgr.forget_reply(slot)
    slot.in_progress = True
    # A SEQUENCE on an unbound connection binds it (SP4_NONE, 2.10.3.1).
    conn = ctx.conn
    if conn is not None and conn not in session.connections:
        mgr.bind_connection(session, conn)
    client = session.client
    ctx.session = session
    ctx.client = client
    client.last_renew = _monotonic()          # Client.renew(): time.monotonic()'s clock
    bc = session.backchannel
    if client.reclaim_complete and (bc is None or not bc.wanted or not bc.path_down):
        flags_obj = client.revoked_flags      # all status_flags() can report then
    else:
        flags_obj = _session_ops.status_flags(mgr, session)
    highest_obj = len(slots) - 1              # Session.highest_slotid
    # EXPIRED_ALL_STATE_REVOKED is told once (as sequence()).
    client.revoked_flags &= ~_SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
    _set_limit(results, fore, sa.sa_cachethis)
    sessionid = session.sessionid
    if (type(sessionid) is bytes and len(<bytes>sessionid) == 16 and 0 <= flags_obj < 0x100000000
            and 0 <= highest_obj < 0x100000000):
        results.add_sequence_ok(<bytes>sessionid, seqid, <uint32_t>slotid, highest_obj, flags_obj)
    else:      # what cannot be written as it is: the codec says why (SERVERFAULT)
        results.add_result(OP_SEQUENCE, _n.SEQUENCE4res(NFS4_OK, _n.SEQUENCE4resok(
            sr_sessionid=sessionid, sr_sequenceid=seqid, sr_slotid=slotid,
            sr_highest_slotid=highest_obj, sr_target_highest_slotid=highest_obj,
            sr_status_flags=flags_obj)))
    return slot


async def _run_ops(ctx, Args args, Py_ssize_t first, Results results, bint debug):
    """The ops from `first` on. An op with a typed twin (its row's `native`, a plain function;
    nfsd/native/fileops.pyx) runs that, without a coroutine; a twin returns a routine error
    as an int (logged, at debug level, without the reference's detail)."""
    cdef list ops = args.ops
    cdef list rows = ctx.server.ops.rows     # nfsd/optable.py; decode let declared ops through only
    cdef long long minor = args.minorversion
    cdef Py_ssize_t i, last = len(ops) - 1
    cdef int opnum
    cdef long long status
    cdef double op_started
    cdef bint no_illegal = args.illegal == NO_ILLEGAL
    cdef dict extra = ctx.extra
    server = ctx.server
    observer = server.observer
    for i in range(first, last + 1):
        op = ops[i]
        opnum = op.tag
        if _since[opnum] > minor:
            results.add_error(OP_ILLEGAL, E_OP_ILLEGAL)
            return
        if minor >= 1 and opnum == OP_SEQUENCE:
            results.add_error(opnum, E_SEQUENCE_POS)
            return
        if minor >= 1 and _v40_only[opnum]:
            results.add_error(opnum, E_NOTSUPP)
            return
        row = <object>rows[opnum]
        handler = row.handler
        if handler is None:        # pNFS, delegations, locks, 4.2 extras: not offered
            results.add_error(opnum, E_NOTSUPP)
            return
        twin = row.native
        if twin is None:           # what the handlers read of the loop (the twins read none)
            extra["last_op"] = i == last and no_illegal
            extra["reply_room"] = results.room()      # READ clips its data to this
            ctx.resolved = None    # the twins' resolved handle: this op may change anything
        op_started = _monotonic()
        res = None
        try:
            if twin is not None:
                res = twin(ctx, op.value)
            else:
                res = await handler(ctx, op.value)
        except NfsError as err:
            _op_error(ctx, opnum, err)
            status = results.add_error(opnum, err.status)
        except Exception:
            log.exception("op_failed", op=_NAMES[opnum], client=_client_name(ctx))
            status = results.add_error(opnum, E_SERVERFAULT)
        else:
            if type(res) is int:   # a twin's routine error (fileops.pyx)
                if debug:
                    _op_error(ctx, opnum, NfsError(res))
                status = results.add_error(opnum, <long long>res)
                res = None
            else:
                status = results.add_result(opnum, res)
        if observer is not None:
            _observe(observer, opnum, status, _monotonic() - op_started, res)
        if status != NFS4_OK:
            return
    if not no_illegal:
        results.add_error(OP_ILLEGAL, E_OP_ILLEGAL)


cdef _observe(observer, int opnum, long long status, double seconds, res):
    """nfsd.compound._observe: observer(op, status, seconds, nbytes); never fails an op.
    An OpCounters observer is counted in C, with no Python call."""
    cdef Py_ssize_t nbytes = 0
    try:
        if status == NFS4_OK:
            if opnum == OP_READ:
                nbytes = len(res.value.data)
            elif opnum == OP_WRITE:
                nbytes = res.value.count
        if type(observer) is OpCounters:
            (<OpCounters>observer).add(opnum, status, seconds, nbytes)
        else:
            observer(_NAMES[opnum], _status_name(status), seconds, nbytes)
    except Exception:           # metrics must never fail an op
        log.exception("op_observer_failed", op=_NAMES[opnum])


# ---- op accounting ----------------------------------------------------------------

cdef enum:
    MAX_BUCKETS = 32

cdef class OpCounters:
    """What the appliance's OpStats (appliance/metrics.py) keeps, kept in C arrays: per op a
    count of each result status, a latency histogram (Prometheus `le` buckets) with its sum,
    and the bytes READ returned and WRITE took. The native loop adds to it with no Python call
    (5 us of a LOOKUP COMPOUND's ~50 went to OpStats' call per op); the reference loop calls
    it as it calls any observer, by names. snapshot() has OpStats' shape. Added to on the event
    loop's thread; snapshot() copies the arrays before it makes any Python object, so a scrape
    never sees a count without its histogram entry."""
    cdef double bounds[MAX_BUCKETS]
    cdef int nbounds
    cdef long long ok[NOPS]                      # NFS4_OK results per op
    cdef long long hist[NOPS][MAX_BUCKETS + 1]   # per op: one slot per bound, then +Inf
    cdef double sums[NOPS]
    cdef dict other                              # (opnum << 32 | status) -> count, the rest
    cdef public long long bytes_read, bytes_written

    def __init__(self, buckets):
        cdef int i
        bounds = [float(b) for b in buckets]
        if not 0 < len(bounds) <= MAX_BUCKETS or bounds != sorted(bounds):
            raise ValueError(f"1 to {MAX_BUCKETS} ascending bucket bounds, not {buckets!r}")
        self.nbounds = len(bounds)
        for i in range(self.nbounds):
            self.bounds[i] = bounds[i]
        self.other = {}
        self.bytes_read = self.bytes_written = 0

    cdef inline void add(self, int opnum, long long status, double seconds,
                         Py_ssize_t nbytes) noexcept:
        cdef int i = 0
        cdef long long key
        if opnum < 0 or opnum >= NOPS:
            return
        if status == NFS4_OK:
            self.ok[opnum] += 1
        else:
            key = (<long long>opnum << 32) | (status & 0xFFFFFFFF)
            self.other[key] = self.other.get(key, 0) + 1
        while i < self.nbounds and self.bounds[i] < seconds:     # bisect_left, as OpStats
            i += 1
        self.hist[opnum][i] += 1
        self.sums[opnum] += seconds
        if nbytes:
            if opnum == OP_READ:
                self.bytes_read += nbytes
            elif opnum == OP_WRITE:
                self.bytes_written += nbytes

    def observe(self, op, status, double seconds, Py_ssize_t nbytes=0):
        """OpStats.observe: by the op's and the status's names (the reference loop's call)."""
        opnum = _OPNUM_BY_NAME.get(op)
        if opnum is None:
            raise KeyError(f"no op named {op!r}")
        code = _ref.STATUS_CODES.get(status)
        if code is None:
            code = int(status)          # status_name() of an undeclared status is its number
        self.add(<int>opnum, <long long>code, seconds, nbytes)

    def __call__(self, op, status, seconds, nbytes=0):
        self.observe(op, status, seconds, nbytes)

    def snapshot(self):
        """OpStats.snapshot(): {"counts": {(op, status): n}, "hist": {op: [count per bucket...,
        +Inf count, sum]}, "bytes_read", "bytes_written"}."""
        cdef long long ok[NOPS]
        cdef long long hist[NOPS][MAX_BUCKETS + 1]
        cdef double sums[NOPS]
        cdef int num, i
        memcpy(ok, self.ok, sizeof(ok))
        memcpy(hist, self.hist, sizeof(hist))
        memcpy(sums, self.sums, sizeof(sums))
        other = dict(self.other)
        read, written = self.bytes_read, self.bytes_written
        counts = {}
        out_hist = {}
        for num in range(NOPS):
            if ok[num]:
                counts[(_NAMES[num], "NFS4_OK")] = ok[num]
            n = 0
            for i in range(self.nbounds + 1):
                n += hist[num][i]
            if n:
                out_hist[_NAMES[num]] = [hist[num][i] for i in range(self.nbounds + 1)] + [sums[num]]
        for key, n in other.items():
            counts[(_NAMES[key >> 32], _status_name(key & 0xFFFFFFFF))] = n
        return {"counts": counts, "hist": out_hist, "bytes_read": read, "bytes_written": written}


# ---- one call -------------------------------------------------------------------

cdef enum:
    REPLY_HEAD = 28                      # record mark, then xid REPLY MSG_ACCEPTED AUTH_NONE 0 SUCCESS

cdef unsigned char _client_work[NOPS]    # nfsd/optable.py's client_work column
for _num, _d in _DESCRIPTORS.items():
    _client_work[_num] = _d.client_work
cdef unsigned int LAST_FRAGMENT = 0x80000000

from nfsd.drc import IN_PROGRESS as _IN_PROGRESS, request_key as _request_key
from nfsd.rpc import (Reply as _Reply, auth_error_reply as _auth_error_reply,
                      garbage_args_reply as _garbage_args_reply, system_err_reply as _system_err_reply)
from nfsd.xdr.rpc import AUTH_TOOWEAK as _AUTH_TOOWEAK
import structlog as _structlog
_server_log = _structlog.get_logger("nfsd.server")


async def handle_call(server, call, conn):
    """nfsd.server.NfsServer.handle_call with its _run_compound (the reference, kept as
    NfsServer.python_handle_call): one coroutine instead of two, the reply's RPC header and
    record mark and the client-work stamp written here. Never raises."""
    reply = server.immediate_reply(call, conn)
    if reply is not None:
        return reply
    xid = call.xid
    if not conn.port_ok:
        server.ratelog.warning("insecure_port_refused", conn.peer[0], port=conn.peer[1],
                               reason="every export admitting this client is `secure` "
                                      "(source port must be < 1024)")
        return _auth_error_reply(xid, _AUTH_TOOWEAK)
    args = call.args
    if _minorversion_of(args) != 0:
        return (await _run_call(server, call, conn))[0]
    # NFSv4.0: a retransmission gets the first run's reply (nfsd/drc.py).
    key = _request_key(conn.peer, xid, call.proc, args)
    cache = server.replies_v40
    cached = cache.begin(key)
    if cached is _IN_PROGRESS:
        return None                  # the original still runs: drop, as knfsd does
    if cached is not None:
        return cached
    reply, opnums = None, ()
    try:
        reply, opnums = await _run_call(server, call, conn)
        return reply
    finally:
        cache.finish(key, reply, opnums)


cdef long long _minorversion_of(buf) except -2:
    """nfsd.compound.minorversion_of: -1 for None (too short)."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t n, pos
    cdef uint32_t taglen
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        n = view.len
        if n < 4:
            return -1
        taglen = _r32(p)
        pos = 4 + <Py_ssize_t>taglen + (-<Py_ssize_t>taglen & 3)
        if pos + 4 > n:
            return -1
        return _r32(p + pos)
    finally:
        PyBuffer_Release(&view)


async def _run_call(server, call, conn):
    """NfsServer._run_compound: the framed reply and the ops that ran."""
    cdef uint32_t xid = call.xid
    cdef bytearray out = bytearray(REPLY_HEAD)
    cdef unsigned char* q = <unsigned char*>PyByteArray_AS_STRING(out)
    cdef Outcome outcome
    cdef Py_ssize_t n
    _w32(q + 4, xid)
    _w32(q + 8, 1)                       # REPLY; MSG_ACCEPTED, AUTH_NONE, 0, SUCCESS are zeros
    try:
        outcome = await run_compound(server, call.cred, conn.peer, conn, call.args, out)
    except GarbageArgs as exc:
        server.ratelog.warning("rpc_garbage_args", conn.peer[0], xid=xid, error=str(exc))
        return _garbage_args_reply(xid), []
    except Exception:
        _server_log.exception("compound_failed", peer=conn.peer[0], xid=xid)
        return _system_err_reply(xid), []
    for opnum in outcome.opnums:
        if 0 <= opnum < NOPS and _client_work[<int>opnum]:
            server.last_client_op = _monotonic()
            break
    n = PyByteArray_GET_SIZE(out) - 4
    tail = outcome.tail
    if tail is None:
        _p32(out, 0, LAST_FRAGMENT | <uint32_t>n)
        return out, outcome.opnums
    data, pad = tail
    _p32(out, 0, LAST_FRAGMENT | <uint32_t>(n + len(data) + pad))
    return _Reply(out, data, pad), outcome.opnums


import nfsd.compound as _compound   # binds this module (nfsd/compound.py calls bind())
bind(_compound)
