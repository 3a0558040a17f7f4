# cython: language_level=3
"""The RPC layer of nfsd/rpc.py in typed Cython (issue 37, the native core's first piece).

`RpcConnection` here is a drop-in replacement for `nfsd.rpc.RpcConnection`: same constructor,
same public API (get_buffer, buffer_updated, receive_data, broken, partial, buffered, records,
pool, programs, max_record, max_fragments, direct_threshold) and the same events, which are
nfsd.rpc's own classes (CallReceived, SendReply, ReplyReceived, ConnectionError) carrying
nfsd.context.Cred; the RPC-level error replies are nfsd.rpc's reply builders, so their bytes
are the reference's. nfsd/rpc.py stays the specification: tests/nfsd/test_rpc_native.py and
tests/fuzz/test_rpc_native_fuzz.py hold this module to it event for event, field for field,
state for state (broken, partial, records, buffered) after every feed.

What is native: the connection's state is C fields (Py_ssize_t offsets, C flags), record
marks and header words are read as big-endian words from `unsigned char*` (no struct
module, no per-byte Python objects), fragment bytes move with memcpy, and `receive_data`
copies straight into the buffer `get_buffer` would have handed out, without making the
memoryview. Every length a client sent is checked against the bytes present before
anything is read at it: this parses hostile bytes.

The same zero-copy and hostile-input rules as the reference (its docstring says why): a
record of a fragment >= direct_threshold still to come is received straight into its own
bytearray (a RecordPool buffer for one-fragment records up to POOL_BUFFER); small records
are assembled from the per-connection scratch buffer; a record's buffer grows only as bytes
arrive (a record mark is only a claim), new room zero-filled as the reference's is, so a
record's bytes, past its length too, are the reference's; max_record and max_fragments end
the connection exactly where the reference does, with the same reasons.

Deviations, for caller bugs only (never reached from the transport or from client bytes):
`buffer_updated(n)` with n outside what the last `get_buffer` handed out raises ValueError
(the reference would go on with a corrupt state; here it would be a wild memory write), and
`receive_data` stops instead of spinning forever when the scratch buffer is smaller than a
record mark (scratch_size < 4). `receive_data` takes a C-contiguous buffer (bytes,
bytearray, a contiguous memoryview).

The credential cache: a client sends the same credential on every call, so the connection
keeps the last AUTH_SYS body it parsed (up to MAX_AUTH_BYTES, a C array) and its Cred, and
hands out that very Cred when the next body is byte-equal (memcmp); AUTH_NONE calls share one
Cred per connection. Sharing is safe because nothing mutates a Cred after the RPC layer made
it: in nfsd/ the Creds of calls are only read (ops/session.py principal_of, exports.py
effective_cred, server.py run_compound hands it into CompoundContext.cred, which is
reassigned, never written into); grep for `cred.<field> =` finds no writer.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint32_t
from libc.string cimport memcmp, memcpy, memmove, memset

import nfsd.rpc as _ref
from nfsd.context import Cred
from nfsd.rpc import (
    CallReceived, ConnectionError as RpcConnectionError, ReplyReceived, SendReply,
    accepted_error_reply, auth_error_reply, garbage_args_reply, rpc_mismatch_reply,
)
from nfsd.xdr.rpc import (
    AUTH_BADCRED as _AUTH_BADCRED, PROC_UNAVAIL as _PROC_UNAVAIL, PROG_MISMATCH as _PROG_MISMATCH,
    PROG_UNAVAIL as _PROG_UNAVAIL,
)


cdef extern from "Python.h":
    char* PyByteArray_AS_STRING(object)
    Py_ssize_t PyByteArray_GET_SIZE(object)
    int PyByteArray_Resize(object, Py_ssize_t) except -1


# The reference's constants, read once (C copies for the hot paths).
cdef enum:
    MAX_AUTH = 400              # nfsd.rpc.MAX_AUTH_BYTES (checked at import below)
cdef Py_ssize_t POOL_BUFFER = _ref.POOL_BUFFER
cdef Py_ssize_t RECORD_INITIAL_ALLOC = _ref.RECORD_INITIAL_ALLOC
cdef uint32_t MAX_MACHINENAME = _ref.MAX_MACHINENAME
cdef uint32_t MAX_AUTHSYS_GIDS = _ref.MAX_AUTHSYS_GIDS
cdef uint32_t RPC_VERSION = _ref.RPC_VERSION
cdef uint32_t LAST_FRAGMENT = _ref.LAST_FRAGMENT
cdef uint32_t MSG_CALL = _ref.CALL
cdef uint32_t MSG_REPLY = _ref.REPLY
cdef uint32_t FLAVOR_NONE = _ref.AUTH_NONE
cdef uint32_t FLAVOR_SYS = _ref.AUTH_SYS
cdef Py_ssize_t CALL_HEAD = 24  # xid, mtype, rpcvers, prog, vers, proc

if _ref.MAX_AUTH_BYTES != MAX_AUTH:
    raise ImportError(f"nfsd.rpc.MAX_AUTH_BYTES is {_ref.MAX_AUTH_BYTES}, nfsd/native/rpc.pyx has {MAX_AUTH}")

_EMPTY = b""


cdef inline uint32_t be32(const unsigned char* p) noexcept nogil:
    return ((<uint32_t>p[0]) << 24) | ((<uint32_t>p[1]) << 16) | ((<uint32_t>p[2]) << 8) | (<uint32_t>p[3])


cdef inline Py_ssize_t pad4(Py_ssize_t n) noexcept nogil:
    return (n + 3) & ~(<Py_ssize_t>3)


cdef object parse_authsys(const unsigned char* body, Py_ssize_t n):
    """authsys_parms (RFC 5531 appendix A) as nfsd.rpc.parse_authsys reads it; None when
    malformed (the caller answers AUTH_BADCRED). n <= MAX_AUTH, so no sum below overflows."""
    cdef Py_ssize_t pos, m, i
    cdef uint32_t uid, gid, ngids
    if n < 4:                                   # stamp: ignored
        return None
    if 8 > n:
        return None
    m = be32(body + 4)
    if m > MAX_MACHINENAME or 8 + m > n:
        return None
    machine = PyBytes_FromStringAndSize(<const char*>body + 8, m)
    pos = 8 + pad4(m)
    if pos + 12 > n:
        return None
    uid = be32(body + pos)
    gid = be32(body + pos + 4)
    ngids = be32(body + pos + 8)
    pos += 12
    if ngids > MAX_AUTHSYS_GIDS:
        return None
    if pos + 4 * <Py_ssize_t>ngids != n:
        return None
    gids = tuple([be32(body + pos + 4 * i) for i in range(<Py_ssize_t>ngids)])
    return Cred(flavor=FLAVOR_SYS, uid=uid, gid=gid, gids=gids, machinename=machine)


cdef class RpcConnection:
    """The RPC state of one server-side connection (no I/O): nfsd.rpc.RpcConnection in C."""

    cdef public object programs
    cdef public object pool
    cdef public Py_ssize_t max_record
    cdef public Py_ssize_t max_fragments
    cdef public Py_ssize_t direct_threshold
    cdef public Py_ssize_t records          # complete records parsed (callers watch progress)
    cdef Py_ssize_t _fragments              # fragments of the record being assembled
    # scratch: [_start, _end) unparsed; _sbuf stays valid because _scratch_view exports
    # _scratch for the connection's life (a bytearray with exports cannot be resized)
    cdef bytearray _scratch
    cdef object _scratch_view
    cdef unsigned char* _sbuf
    cdef Py_ssize_t _slen
    cdef Py_ssize_t _start
    cdef Py_ssize_t _end
    # the record being assembled (see nfsd.rpc): its buffer may be replaced or resized, so
    # its address is taken afresh after every _reserve
    cdef bytearray _record
    cdef Py_ssize_t _record_len             # bytes of _record that are filled
    cdef Py_ssize_t _frag_remaining         # body bytes of the current fragment still to come
    cdef bint _poolable
    cdef bint _frag_last
    cdef bint _in_fragment
    cdef bint _direct
    cdef bint _broken
    # credential cache (module docstring): the last AUTH_SYS body and its Cred
    cdef unsigned char _cred_body[MAX_AUTH]
    cdef Py_ssize_t _cred_len               # -1: none cached
    cdef object _cred_sys
    cdef object _cred_none

    def __init__(self, programs, max_record=_ref.DEFAULT_MAX_RECORD,
                 direct_threshold=_ref.DIRECT_RECEIVE_THRESHOLD, scratch_size=_ref.SCRATCH_SIZE,
                 max_fragments=_ref.DEFAULT_MAX_FRAGMENTS, pool=None):
        self.programs = programs
        self.pool = pool
        self.max_record = max_record
        self.max_fragments = max_fragments
        self._fragments = 0
        self.records = 0
        self.direct_threshold = direct_threshold
        self._scratch = bytearray(scratch_size)
        self._scratch_view = memoryview(self._scratch)
        self._sbuf = <unsigned char*>PyByteArray_AS_STRING(self._scratch)
        self._slen = PyByteArray_GET_SIZE(self._scratch)
        self._start = 0
        self._end = 0
        self._record = None
        self._record_len = 0
        self._poolable = False
        self._frag_remaining = 0
        self._frag_last = False
        self._in_fragment = False
        self._direct = False
        self._broken = False
        self._cred_len = -1
        self._cred_sys = None
        self._cred_none = None

    # -- receiving (asyncio BufferedProtocol shape) --
    def get_buffer(self, sizehint=-1):
        cdef Py_ssize_t size
        if self._direct:
            size = PyByteArray_GET_SIZE(self._record)
            if size == self._record_len:            # full: grow as bytes arrive
                self._reserve(min(self._frag_remaining, max(size, RECORD_INITIAL_ALLOC)))
            return memoryview(self._record)[self._record_len:self._record_len + self._frag_remaining]
        if self._end == self._slen:
            self._compact()
        return self._scratch_view[self._end:]

    def buffer_updated(self, Py_ssize_t nbytes):
        events = []
        self._updated(nbytes, events)
        return events

    def receive_data(self, data):
        """Feed bytes (tests, fuzzing): get_buffer/buffer_updated without the memoryview."""
        cdef Py_buffer view
        cdef const unsigned char* src
        cdef unsigned char* dst
        cdef Py_ssize_t remaining, cap, n
        events = []
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            src = <const unsigned char*>view.buf
            remaining = view.len
            while remaining > 0 and not self._broken:
                cap = self._writable(&dst)
                n = cap if cap < remaining else remaining
                if n <= 0:
                    break                           # scratch_size < 4: the reference spins
                memmove(dst, src, n)
                src += n
                remaining -= n
                self._updated(n, events)
        finally:
            PyBuffer_Release(&view)
        return events

    @property
    def broken(self):
        return self._broken

    @property
    def partial(self):
        """Whether part of a record has arrived (the transport times how long it takes)."""
        return self._in_fragment or self._record is not None or self._end > self._start

    @property
    def buffered(self):
        """Bytes this connection holds for records not yet complete (memory accounting)."""
        return (PyByteArray_GET_SIZE(self._record) if self._record is not None else 0) + self._slen

    # -- the writable tail get_buffer hands out, as a pointer --
    cdef Py_ssize_t _writable(self, unsigned char** dst) except -1:
        cdef Py_ssize_t size, stop
        if self._direct:
            size = PyByteArray_GET_SIZE(self._record)
            if size == self._record_len:
                self._reserve(min(self._frag_remaining, max(size, RECORD_INITIAL_ALLOC)))
                size = PyByteArray_GET_SIZE(self._record)
            stop = self._record_len + self._frag_remaining
            if stop > size:
                stop = size
            dst[0] = <unsigned char*>PyByteArray_AS_STRING(self._record) + self._record_len
            return stop - self._record_len if stop > self._record_len else 0
        if self._end == self._slen:
            self._compact()
        dst[0] = self._sbuf + self._end
        return self._slen - self._end

    cdef int _updated(self, Py_ssize_t nbytes, list events) except -1:
        cdef Py_ssize_t room
        if self._broken:
            return 0
        if self._direct:
            room = PyByteArray_GET_SIZE(self._record) - self._record_len
            if room > self._frag_remaining:
                room = self._frag_remaining
            if nbytes < 0 or nbytes > room:
                raise ValueError(f"buffer_updated({nbytes}): {room} bytes were handed out")
            self._record_len += nbytes
            self._frag_remaining -= nbytes
            if self._frag_remaining == 0:
                self._direct = False
                self._end_fragment(events)
            return 0
        if nbytes < 0 or nbytes > self._slen - self._end:
            raise ValueError(f"buffer_updated({nbytes}): {self._slen - self._end} bytes were handed out")
        self._end += nbytes
        return self._parse_scratch(events)

    # -- record marking (RFC 5531 section 11) --
    cdef void _compact(self) noexcept:
        cdef Py_ssize_t n = self._end - self._start
        if n and self._start:
            memmove(self._sbuf, self._sbuf + self._start, n)
        self._start = 0
        self._end = n

    cdef int _parse_scratch(self, list events) except -1:
        cdef Py_ssize_t avail, length, take
        cdef uint32_t mark
        while not self._broken:
            avail = self._end - self._start
            if not self._in_fragment:
                if avail < 4:
                    break
                mark = be32(self._sbuf + self._start)
                self._start += 4
                length = mark & 0x7FFFFFFF
                if self._record_len + length > self.max_record:
                    self._fail(events, f"record of {self._record_len + length}+ bytes "
                                       f"above the limit {self.max_record}")
                    break
                self._fragments += 1
                if self._fragments > self.max_fragments:
                    self._fail(events, f"record of more than {self.max_fragments} fragments")
                    break
                self._frag_last = (mark & LAST_FRAGMENT) != 0
                self._frag_remaining = length
                self._in_fragment = True
                self._grow_record(length)
                continue
            take = avail if avail < self._frag_remaining else self._frag_remaining
            if take:
                self._reserve(take)
                memcpy(PyByteArray_AS_STRING(self._record) + self._record_len,
                       self._sbuf + self._start, take)
                self._record_len += take
                self._start += take
                self._frag_remaining -= take
            if self._frag_remaining == 0:
                self._end_fragment(events)
                continue
            # The fragment continues beyond the bytes we have.
            if self._frag_remaining >= self.direct_threshold:
                self._direct = True             # receive the rest into the record itself
            break
        if self._start == self._end:
            self._start = self._end = 0
        elif not self._direct and self._end == self._slen:
            self._compact()
        return 0

    cdef int _grow_record(self, Py_ssize_t fragment_len) except -1:
        """A fragment starts: make sure a record exists; bytes are reserved as they come."""
        cdef bytearray record = None
        if self._record is None:
            self._poolable = (self.pool is not None and self._frag_last
                              and self.direct_threshold <= fragment_len <= POOL_BUFFER)
            if self._poolable:
                record = self.pool.take()           # fits: no growth
            if record is None:
                record = bytearray(min(fragment_len, RECORD_INITIAL_ALLOC))
            self._record = record
            self._record_len = 0
        return 0

    cdef int _reserve(self, Py_ssize_t n) except -1:
        """Room for n more bytes of the current fragment: at least double the buffer
        (amortised copies), never beyond the bytes the fragment still announces."""
        cdef bytearray record = self._record
        cdef bytearray pooled
        cdef Py_ssize_t need = self._record_len + n
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(record)
        cdef Py_ssize_t target
        if size >= need:
            return 0
        if self._poolable:                      # its first bytes came: into a pool-sized buffer
            pooled = bytearray(POOL_BUFFER)
            memcpy(PyByteArray_AS_STRING(pooled), PyByteArray_AS_STRING(record), self._record_len)
            self._record = pooled
            return 0
        target = max(need, 2 * size)
        if target > self._record_len + self._frag_remaining:
            target = self._record_len + self._frag_remaining
        PyByteArray_Resize(record, target)      # BufferError while a view of it lives, as extend
        memset(PyByteArray_AS_STRING(record) + size, 0, target - size)
        return 0

    cdef int _end_fragment(self, list events) except -1:
        cdef bytearray record
        cdef Py_ssize_t length, size
        self._in_fragment = False
        if not self._frag_last:
            return 0
        record = self._record
        length = self._record_len
        size = PyByteArray_GET_SIZE(record)
        if size != POOL_BUFFER and size != length:
            PyByteArray_Resize(record, length)  # never happens: announced bytes all arrived
        self._record = None
        self._record_len = 0
        self._fragments = 0
        self.records += 1
        events.append(self._parse_call(record, length))
        return 0

    cdef int _fail(self, list events, str reason) except -1:
        self._broken = True
        self._record = None
        events.append(RpcConnectionError(reason))
        return 0

    # -- call header (RFC 5531 section 9) --
    cdef object _parse_call(self, bytearray record, Py_ssize_t length):
        cdef const unsigned char* p = <const unsigned char*>PyByteArray_AS_STRING(record)
        cdef uint32_t xid, mtype, rpcvers, prog, vers, proc, flavor, n
        cdef Py_ssize_t pos, cred_at, cred_len
        if length < 4:
            return SendReply(_EMPTY, 0, "record shorter than an xid")   # nothing to answer to
        xid = be32(p)
        if length >= 8 and be32(p + 4) == MSG_REPLY:
            # The client answering a callback we sent on this connection (back channel).
            return ReplyReceived(xid, PyBytes_FromStringAndSize(<const char*>p, length))
        if length < CALL_HEAD:
            return SendReply(garbage_args_reply(xid), xid, "truncated call header")
        mtype = be32(p + 4)
        rpcvers = be32(p + 8)
        prog = be32(p + 12)
        vers = be32(p + 16)
        proc = be32(p + 20)
        if mtype != MSG_CALL:
            return SendReply(_EMPTY, xid, "not a call")
        if rpcvers != RPC_VERSION:
            return SendReply(rpc_mismatch_reply(xid), xid, "rpc version mismatch")
        # cred: flavor, body<400>; verf: flavor, body<400>. Every word is checked against
        # `length` before it is read; a missing pad after a body is not (as the reference).
        pos = CALL_HEAD
        if pos + 8 > length:
            return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, "malformed credentials")
        flavor = be32(p + pos)
        n = be32(p + pos + 4)
        cred_at = pos + 8
        if n > MAX_AUTH or cred_at + <Py_ssize_t>n > length:
            return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, "malformed credentials")
        cred_len = n
        pos = cred_at + pad4(n)
        if pos + 8 > length:
            return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, "malformed credentials")
        n = be32(p + pos + 4)
        if n > MAX_AUTH or pos + 8 + <Py_ssize_t>n > length:
            return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, "malformed credentials")
        pos += 8 + pad4(n)
        if flavor == FLAVOR_NONE:
            cred = self._cred_none
            if cred is None:
                cred = self._cred_none = Cred(flavor=FLAVOR_NONE)
        elif flavor == FLAVOR_SYS:
            if cred_len == self._cred_len and memcmp(self._cred_body, p + cred_at, cred_len) == 0:
                cred = self._cred_sys
            else:
                cred = parse_authsys(p + cred_at, cred_len)
                if cred is None:
                    return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, "malformed AUTH_SYS")
                memcpy(self._cred_body, p + cred_at, cred_len)
                self._cred_len = cred_len
                self._cred_sys = cred
        else:
            # RPCSEC_GSS and others: only AUTH_NONE/AUTH_SYS are offered (AUTH_BADCRED).
            return SendReply(auth_error_reply(xid, _AUTH_BADCRED), xid, f"auth flavor {flavor}")
        program = self.programs.get(prog)
        if program is None:
            return SendReply(accepted_error_reply(xid, _PROG_UNAVAIL), xid, f"prog {prog} unavailable")
        if not program.low <= vers <= program.high:
            return SendReply(accepted_error_reply(xid, _PROG_MISMATCH, program.low, program.high),
                             xid, f"prog {prog} vers {vers} mismatch")
        if proc not in program.procs:
            return SendReply(accepted_error_reply(xid, _PROC_UNAVAIL), xid, f"proc {proc} unavailable")
        if pos > length:
            pos = length                        # a missing pad after the verifier: no args
        return CallReceived(xid, prog, vers, proc, cred, memoryview(record)[pos:length], record)
