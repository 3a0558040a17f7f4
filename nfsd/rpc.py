"""Sans-I/O ONC RPC v2 server side (RFC 5531): record marking, call parsing, auth, replies.

No sockets here (the h11 shape): `RpcConnection` takes bytes in (either through
`get_buffer`/`buffer_updated`, the asyncio BufferedProtocol pair, or `receive_data`)
and returns events:

- `CallReceived`: a well-formed call to a program/version/procedure we serve, with
  parsed credentials and a memoryview of the procedure arguments;
- `SendReply`: a complete, framed reply the RPC layer answered by itself
  (PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, AUTH_ERROR, RPC_MISMATCH);
- `ReplyReceived`: a REPLY record (msg_type 1): on an NFSv4.1 back channel the
  client's answer to a callback the server sent on this very connection (RFC 8881
  2.10.3.1); the caller matches it to its call by xid and decodes it with `parse_reply`;
- `ConnectionError`: the byte stream cannot continue (oversized record); the
  caller closes this connection and nothing else.

The server's own callbacks are built by `encode_call` (a CALL from server to client)
and their replies read by `parse_reply`: the same codec serves both directions.

Zero copy for large records: while a record's header says it is big, `get_buffer`
hands out the free tail of that record's *own* bytearray, so the kernel receives a
WRITE payload straight into the buffer the call is decoded from. Each record gets a
buffer the connection never touches again, so it stays valid while the call runs.
Small records are copied out of a reusable scratch buffer (cheap, and it lets one
recv syscall carry many pipelined small calls).

Reused buffers for the common large record: a WRITE of up to 1 MiB is one fragment of
about 1 MiB. A fresh bytearray for each of them cost page faults, zero-filling and the
doubling copies below (py-spy, 8 nfs-rs write streams: a seventh of the event loop). A
`RecordPool` (one per server) keeps a few buffers of POOL_BUFFER bytes: such a record is
received into one, and the transport gives it back once the call's reply is sent. A
buffer goes back into the pool only if nothing still views it (a resize probe: a
bytearray with exported buffers cannot be resized), so a view that outlives its call (a
cancelled WRITE whose pwrite still runs) keeps its buffer, which is then simply dropped.
The pool is already-allocated memory, so lending a buffer to a client that announces a
big fragment and sends slowly costs nothing new. With the pool empty such a record
starts as any other (below) and moves into a fresh pool-sized buffer only once its first
RECORD_INITIAL_ALLOC bytes have arrived: one copy of 64 KiB instead of the doublings,
and a header alone never makes the server allocate (and zero) a megabyte.

Hostile input: a record mark is only a claim. A record's buffer starts at
RECORD_INITIAL_ALLOC bytes and doubles as bytes actually arrive (never past what the
marks announced), so a client announcing 2 MiB and sending 10 bytes costs 64 KiB, not
2 MiB. A record above `max_record` bytes or made of more than `max_fragments`
fragments ends the connection (ConnectionError). Growth happens only in
`get_buffer`/`_parse_scratch`, never while a view handed out by `get_buffer` may
still be alive (a bytearray with exports cannot be resized).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from nfsd.context import Cred
from nfsd.xdr.rpc import (
    AUTH_BADCRED, AUTH_ERROR, AUTH_NONE, AUTH_SYS, CALL, GARBAGE_ARGS, MSG_ACCEPTED,
    MSG_DENIED, PROC_UNAVAIL, PROG_MISMATCH, PROG_UNAVAIL, REPLY, RPC_MISMATCH, SUCCESS,
    SYSTEM_ERR,
)

RPC_VERSION = 2
LAST_FRAGMENT = 0x80000000
MAX_AUTH_BYTES = 400            # RFC 5531 section 8.2: opaque_auth body <= 400 bytes
MAX_MACHINENAME = 255           # authsys_parms.machinename<255>
MAX_AUTHSYS_GIDS = 16           # authsys_parms.gids<16>
# 1 MiB of WRITE payload plus COMPOUND/RPC headers fits easily; the NFS session
# negotiates maxrequestsize below this, so a conforming client never reaches it.
DEFAULT_MAX_RECORD = 2 * 1024 * 1024 + 64 * 1024
# Records below this size are assembled in the scratch buffer and copied out.
DIRECT_RECEIVE_THRESHOLD = 16 * 1024
SCRATCH_SIZE = 64 * 1024         # per connection, allocated once
# A record's buffer starts this small and doubles as its bytes arrive (see above).
RECORD_INITIAL_ALLOC = 64 * 1024
# Pooled record buffers: a 1 MiB WRITE (Linux wsize, nfs-rs' 1044480) with its headers fits.
POOL_BUFFER = 1024 * 1024 + 64 * 1024
POOL_BUFFERS = 16                # kept per server: 17 MiB at most
# Fragments one record may have. RFC 5531 sets no bound, and endless empty non-last
# fragments would otherwise never end a record (they add nothing to its size, so
# max_record does not stop them). Linux and nfs-rs send one fragment per record, but
# pynfs cuts every record into 2 KiB fragments, so a 1 MiB WRITE is 513 of them. The
# bound lets a largest record (max_record) through in fragments as small as 1 KiB;
# each fragment costs O(1) besides its bytes, so a record of empty fragments costs
# at most this many 4-byte marks (8 KiB of input), and record bytes stay bounded by
# max_record.
SMALLEST_FRAGMENT = 1024
DEFAULT_MAX_FRAGMENTS = -(-DEFAULT_MAX_RECORD // SMALLEST_FRAGMENT)

_U32 = struct.Struct(">I")
_CALL_HEAD = struct.Struct(">IIIIII")     # xid, mtype, rpcvers, prog, vers, proc
_ACCEPTED_HEAD = struct.Struct(">IIIIII")  # xid, REPLY, MSG_ACCEPTED, verf flavor, verf len, stat
ACCEPTED_HEADER_SIZE = _ACCEPTED_HEAD.size


class RpcDecodeError(ValueError):
    """The call header or credentials are malformed (answered GARBAGE_ARGS or AUTH_BADCRED)."""


# ---- events -----------------------------------------------------------------------

@dataclass(slots=True)
class CallReceived:
    xid: int
    prog: int
    vers: int
    proc: int
    cred: Cred
    args: memoryview          # the procedure arguments: a view into `record`
    record: bytearray         # the buffer owning the record (a pooled one may be longer);
                              # the connection never touches it again (RecordPool.give_back)


@dataclass(slots=True)
class SendReply:
    data: bytes               # framed (record mark included); b"": drop, nothing to send
    xid: int
    reason: str               # e.g. "prog_unavail", for the log


@dataclass(slots=True)
class ReplyReceived:
    xid: int
    record: bytes             # the whole reply record (no record mark), for parse_reply


@dataclass(slots=True)
class ConnectionError:        # noqa: A001 - the RPC layer's own event, not the builtin
    reason: str


@dataclass(frozen=True, slots=True)
class Program:
    """One RPC program we serve: versions low..high and the procedures they have."""
    prog: int
    low: int
    high: int
    procs: frozenset[int]


# ---- reply building ---------------------------------------------------------------

def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """One record, one fragment (RFC 5531 section 11)."""
    return _U32.pack(LAST_FRAGMENT | len(payload)) + bytes(payload)


def start_success_reply(xid: int) -> bytearray:
    """A reply buffer holding the record mark placeholder and an accepted SUCCESS header
    with an AUTH_NONE verifier; the caller appends the results and calls `finish_reply`."""
    out = bytearray(4)
    out += _ACCEPTED_HEAD.pack(xid, REPLY, MSG_ACCEPTED, AUTH_NONE, 0, SUCCESS)
    return out


class Reply:
    """A framed reply whose last bytes, a READ's data, stay in their own buffer: sent after
    `head` (`parts()`), never copied into it. len() and bytes() are the whole reply's."""

    __slots__ = ("head", "data", "pad")

    def __init__(self, head: bytearray, data, pad: int):
        self.head, self.data, self.pad = head, data, pad

    def __len__(self) -> int:
        return len(self.head) + len(self.data) + self.pad

    def __bytes__(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> tuple:
        return (self.head, self.data, bytes(self.pad)) if self.pad else (self.head, self.data)


def finish_reply(out: bytearray, tail: tuple | None = None) -> bytearray | Reply:
    """Fill in the record mark of a buffer made by `start_success_reply`. tail: (data, pad)
    bytes that follow `out` in the record (a READ's data, see nfsd.compound._Results)."""
    if tail is None:
        _U32.pack_into(out, 0, LAST_FRAGMENT | (len(out) - 4))
        return out
    data, pad = tail
    _U32.pack_into(out, 0, LAST_FRAGMENT | (len(out) - 4 + len(data) + pad))
    return Reply(out, data, pad)


def accepted_error_reply(xid: int, stat: int, low: int = 0, high: int = 0) -> bytes:
    """MSG_ACCEPTED with a non-SUCCESS accept_stat (PROG_MISMATCH carries low/high)."""
    body = _ACCEPTED_HEAD.pack(xid, REPLY, MSG_ACCEPTED, AUTH_NONE, 0, stat)
    if stat == PROG_MISMATCH:
        body += struct.pack(">II", low, high)
    return frame(body)


def garbage_args_reply(xid: int) -> bytes:
    return accepted_error_reply(xid, GARBAGE_ARGS)


def system_err_reply(xid: int) -> bytes:
    return accepted_error_reply(xid, SYSTEM_ERR)


def rpc_mismatch_reply(xid: int) -> bytes:
    return frame(struct.pack(">IIIIII", xid, REPLY, MSG_DENIED, RPC_MISMATCH,
                             RPC_VERSION, RPC_VERSION))


def auth_error_reply(xid: int, auth_stat: int) -> bytes:
    return frame(struct.pack(">IIIII", xid, REPLY, MSG_DENIED, AUTH_ERROR, auth_stat))


# ---- call parsing -----------------------------------------------------------------

def _take_opaque(buf: memoryview, pos: int, limit: int, what: str) -> tuple[memoryview, int]:
    if pos + 4 > len(buf):
        raise RpcDecodeError(f"{what}: truncated length")
    (n,) = _U32.unpack_from(buf, pos)
    if n > limit:
        raise RpcDecodeError(f"{what}: length {n} above {limit}")
    start = pos + 4
    end = start + n
    if end > len(buf):
        raise RpcDecodeError(f"{what}: truncated body")
    return buf[start:end], start + ((n + 3) & ~3)


def parse_authsys(body: memoryview) -> Cred:
    """authsys_parms (RFC 5531 appendix A): stamp, machinename<255>, uid, gid, gids<16>."""
    pos = 4                                   # stamp: ignored
    if len(body) < 4:
        raise RpcDecodeError("authsys_parms: truncated")
    machine, pos = _take_opaque(body, pos, MAX_MACHINENAME, "authsys_parms.machinename")
    if pos + 12 > len(body):
        raise RpcDecodeError("authsys_parms: truncated uid/gid")
    uid, gid, ngids = struct.unpack_from(">III", body, pos)
    pos += 12
    if ngids > MAX_AUTHSYS_GIDS:
        raise RpcDecodeError(f"authsys_parms.gids: {ngids} above {MAX_AUTHSYS_GIDS}")
    if pos + 4 * ngids != len(body):
        raise RpcDecodeError("authsys_parms: wrong length")
    gids = struct.unpack_from(f">{ngids}I", body, pos)
    return Cred(flavor=AUTH_SYS, uid=uid, gid=gid, gids=tuple(gids), machinename=bytes(machine))


class RecordPool:
    """Free record buffers of POOL_BUFFER bytes (see the module's docstring). Not thread
    safe: used from the event loop only."""

    def __init__(self, keep: int = POOL_BUFFERS):
        self.keep = keep
        self._free: list[bytearray] = []
        self.reused = 0             # records received into a pooled buffer (tests, metrics)

    def take(self) -> bytearray | None:
        """A free buffer, or None: a new one is made only once bytes arrive (_reserve)."""
        if self._free:
            self.reused += 1
            return self._free.pop()
        return None

    def give_back(self, record: bytearray) -> bool:
        """`record`'s call is over. Kept only if it is a pool buffer nothing views; whether kept."""
        if len(record) != POOL_BUFFER or len(self._free) >= self.keep:
            return False
        try:
            record.append(0)        # a resize: BufferError while any view of it exists
        except BufferError:
            return False
        del record[-1]
        self._free.append(record)
        return True


class RpcConnection:
    """The RPC state of one server-side connection (no I/O).

    `programs` maps program number -> Program. `max_record` bounds one record
    (all its fragments) and `max_fragments` its fragment count; a record beyond either
    yields ConnectionError and nothing more is parsed.
    """

    def __init__(self, programs: dict[int, Program], max_record: int = DEFAULT_MAX_RECORD,
                 direct_threshold: int = DIRECT_RECEIVE_THRESHOLD,
                 scratch_size: int = SCRATCH_SIZE,
                 max_fragments: int = DEFAULT_MAX_FRAGMENTS, pool: RecordPool | None = None):
        self.programs = programs
        self.pool = pool
        self.max_record = max_record
        self.max_fragments = max_fragments
        self._fragments = 0        # fragments of the record being assembled
        self.records = 0           # complete records parsed (callers watch progress)
        self.direct_threshold = direct_threshold
        self._scratch = bytearray(scratch_size)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0            # unparsed bytes in scratch: [_start, _end)
        self._end = 0
        # The record being assembled: fragments of earlier (non-last) fragments are
        # appended to _record; `_direct` is set while the current fragment body is
        # received straight into _record's tail.
        self._record: bytearray | None = None
        self._record_len = 0       # bytes of _record that are filled
        self._poolable = False     # _record is (or will become) a RecordPool buffer
        self._frag_remaining = 0   # body bytes of the current fragment still to come
        self._frag_last = False
        self._in_fragment = False
        self._direct = False
        self._broken = False

    # -- receiving (asyncio BufferedProtocol shape) --
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._direct:
            assert self._record is not None
            if len(self._record) == self._record_len:      # full: grow as bytes arrive
                self._reserve(min(self._frag_remaining, max(len(self._record), RECORD_INITIAL_ALLOC)))
            return memoryview(self._record)[self._record_len:self._record_len + self._frag_remaining]
        if self._end == len(self._scratch):
            self._compact()
        return self._scratch_view[self._end:]

    def buffer_updated(self, nbytes: int) -> list:
        if self._broken:
            return []
        if self._direct:
            self._record_len += nbytes
            self._frag_remaining -= nbytes
            events: list = []
            if self._frag_remaining == 0:
                self._direct = False
                self._end_fragment(events)
            return events
        self._end += nbytes
        return self._parse_scratch()

    def receive_data(self, data: bytes | bytearray | memoryview) -> list:
        """Feed bytes (tests, fuzzing): the same path the transport uses."""
        events: list = []
        view = memoryview(data)
        while len(view) and not self._broken:
            with self.get_buffer(len(view)) as buf:    # released: the record may grow next
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
            view = view[n:]
            events.extend(self.buffer_updated(n))
        return events

    @property
    def broken(self) -> bool:
        return self._broken

    @property
    def partial(self) -> bool:
        """Whether part of a record has arrived (the transport times how long it takes)."""
        return self._in_fragment or self._record is not None or self._end > self._start

    @property
    def buffered(self) -> int:
        """Bytes this connection holds for records not yet complete (memory accounting)."""
        return (len(self._record) if self._record is not None else 0) + len(self._scratch)

    # -- record marking (RFC 5531 section 11) --
    def _compact(self) -> None:
        n = self._end - self._start
        self._scratch[:n] = self._scratch[self._start:self._end]
        self._start, self._end = 0, n

    def _parse_scratch(self) -> list:
        events: list = []
        while not self._broken:
            avail = self._end - self._start
            if not self._in_fragment:
                if avail < 4:
                    break
                (mark,) = _U32.unpack_from(self._scratch, self._start)
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
                self._frag_last = bool(mark & LAST_FRAGMENT)
                self._frag_remaining = length
                self._in_fragment = True
                self._grow_record(length)
                continue
            take = min(avail, self._frag_remaining)
            if take:
                assert self._record is not None
                self._reserve(take)
                self._record[self._record_len:self._record_len + take] = \
                    self._scratch_view[self._start:self._start + take]
                self._record_len += take
                self._start += take
                self._frag_remaining -= take
            if self._frag_remaining == 0:
                self._end_fragment(events)
                continue
            # The fragment continues beyond the bytes we have.
            if self._frag_remaining >= self.direct_threshold:
                self._direct = True            # receive the rest into the record itself
            break
        if self._start == self._end:
            self._start = self._end = 0
        elif not self._direct and self._end == len(self._scratch):
            self._compact()
        return events

    def _grow_record(self, fragment_len: int) -> None:
        """A fragment starts: make sure a record exists; bytes are reserved as they come."""
        if self._record is None:
            self._poolable = (self.pool is not None and self._frag_last
                              and self.direct_threshold <= fragment_len <= POOL_BUFFER)
            record = self.pool.take() if self._poolable else None   # fits: no growth
            if record is None:
                record = bytearray(min(fragment_len, RECORD_INITIAL_ALLOC))
            self._record = record
            self._record_len = 0

    def _reserve(self, n: int) -> None:
        """Room for n more bytes of the current fragment: at least double the buffer
        (amortised copies), never beyond the bytes the fragment still announces."""
        record = self._record
        need = self._record_len + n
        if len(record) >= need:
            return
        if self._poolable:                  # its first bytes came: into a pool-sized buffer
            pooled = bytearray(POOL_BUFFER)
            pooled[:self._record_len] = memoryview(record)[:self._record_len]
            self._record = pooled
            return
        target = min(self._record_len + self._frag_remaining, max(need, 2 * len(record)))
        record.extend(bytes(target - len(record)))

    def _end_fragment(self, events: list) -> None:
        self._in_fragment = False
        if not self._frag_last:
            return
        record = self._record
        assert record is not None
        length = self._record_len
        if len(record) != POOL_BUFFER:
            del record[length:]                # announced bytes all arrived: a no-op
        self._record = None
        self._record_len = 0
        self._fragments = 0
        self.records += 1
        events.append(self._parse_call(record, length))

    def _fail(self, events: list, reason: str) -> None:
        self._broken = True
        self._record = None
        events.append(ConnectionError(reason))

    # -- call header (RFC 5531 section 9) --
    def _parse_call(self, record: bytearray, length: int):
        buf = memoryview(record)[:length]
        if len(buf) < 4:
            return SendReply(b"", 0, "record shorter than an xid")   # nothing to answer to
        if len(buf) >= 8 and _U32.unpack_from(buf, 4)[0] == REPLY:
            # The client answering a callback we sent on this connection (back channel);
            # a MSG_DENIED reply is shorter than a call header.
            return ReplyReceived(_U32.unpack_from(buf, 0)[0], bytes(buf))
        if len(buf) < _CALL_HEAD.size:
            (xid,) = _U32.unpack_from(buf, 0)
            return SendReply(garbage_args_reply(xid), xid, "truncated call header")
        xid, mtype, rpcvers, prog, vers, proc = _CALL_HEAD.unpack_from(buf, 0)
        if mtype != CALL:
            # Junk: nothing to answer (RFC 5531 has no error for it).
            return SendReply(b"", xid, "not a call")
        if rpcvers != RPC_VERSION:
            return SendReply(rpc_mismatch_reply(xid), xid, "rpc version mismatch")
        pos = _CALL_HEAD.size
        try:
            if pos + 4 > len(buf):
                raise RpcDecodeError("cred: truncated")
            (flavor,) = _U32.unpack_from(buf, pos)
            cred_body, pos = _take_opaque(buf, pos + 4, MAX_AUTH_BYTES, "cred")
            if pos + 4 > len(buf):
                raise RpcDecodeError("verf: truncated")
            _verf_body, pos = _take_opaque(buf, pos + 4, MAX_AUTH_BYTES, "verf")
        except RpcDecodeError:
            return SendReply(auth_error_reply(xid, AUTH_BADCRED), xid, "malformed credentials")
        if flavor == AUTH_NONE:
            cred = Cred(flavor=AUTH_NONE)
        elif flavor == AUTH_SYS:
            try:
                cred = parse_authsys(cred_body)
            except RpcDecodeError:
                return SendReply(auth_error_reply(xid, AUTH_BADCRED), xid, "malformed AUTH_SYS")
        else:
            # RPCSEC_GSS and others: we offer only AUTH_NONE/AUTH_SYS (as Linux knfsd
            # answers an unknown flavour: AUTH_BADCRED).
            return SendReply(auth_error_reply(xid, AUTH_BADCRED), xid, f"auth flavor {flavor}")
        program = self.programs.get(prog)
        if program is None:
            return SendReply(accepted_error_reply(xid, PROG_UNAVAIL), xid, f"prog {prog} unavailable")
        if not program.low <= vers <= program.high:
            return SendReply(accepted_error_reply(xid, PROG_MISMATCH, program.low, program.high),
                             xid, f"prog {prog} vers {vers} mismatch")
        if proc not in program.procs:
            return SendReply(accepted_error_reply(xid, PROC_UNAVAIL), xid, f"proc {proc} unavailable")
        return CallReceived(xid, prog, vers, proc, cred, buf[pos:], record)


# ---- calling side: testkit/nfsclient.py, and the server's callbacks (nfsd/callback.py) ----

def encode_call(xid: int, prog: int, vers: int, proc: int, cred: Cred | None,
                args: bytes | bytearray = b"") -> bytes:
    """A framed CALL with AUTH_NONE or AUTH_SYS credentials and an AUTH_NONE verifier."""
    out = bytearray(_CALL_HEAD.pack(xid, CALL, RPC_VERSION, prog, vers, proc))
    if cred is None or cred.flavor == AUTH_NONE:
        out += struct.pack(">II", AUTH_NONE, 0)
    else:
        body = bytearray(struct.pack(">I", 0))
        name = cred.machinename
        body += _U32.pack(len(name)) + name + b"\0" * (-len(name) % 4)
        body += struct.pack(">III", cred.uid, cred.gid, len(cred.gids))
        body += b"".join(_U32.pack(g) for g in cred.gids)
        out += struct.pack(">II", AUTH_SYS, len(body)) + body
    out += struct.pack(">II", AUTH_NONE, 0)
    out += args
    return frame(out)


@dataclass(slots=True)
class ParsedReply:
    xid: int
    accepted: bool
    stat: int              # accept_stat when accepted, reject_stat otherwise
    detail: tuple          # (low, high) for mismatches, (auth_stat,) for AUTH_ERROR
    body: memoryview       # results after a SUCCESS header


def parse_reply(record: bytes | bytearray | memoryview) -> ParsedReply:
    """Decode a reply record (no record mark). Raises RpcDecodeError if malformed."""
    buf = memoryview(record)
    if len(buf) < 12:
        raise RpcDecodeError(f"reply of {len(buf)} bytes")
    try:
        xid, mtype, reply_stat = struct.unpack_from(">III", buf, 0)
        if mtype != REPLY:
            raise RpcDecodeError(f"message type {mtype} is not REPLY")
        if reply_stat == MSG_ACCEPTED:
            (_flavor,) = _U32.unpack_from(buf, 12)
            _verf, pos = _take_opaque(buf, 16, MAX_AUTH_BYTES, "verf")
            (stat,) = _U32.unpack_from(buf, pos)
            pos += 4
            detail: tuple = ()
            if stat == PROG_MISMATCH:
                detail = struct.unpack_from(">II", buf, pos)
                pos += 8
            return ParsedReply(xid, True, stat, detail, buf[pos:])
        if reply_stat == MSG_DENIED:
            (stat,) = _U32.unpack_from(buf, 12)
            if stat == RPC_MISMATCH:
                detail = struct.unpack_from(">II", buf, 16)
            else:
                detail = struct.unpack_from(">I", buf, 16)
            return ParsedReply(xid, False, stat, detail, buf[len(buf):])
        raise RpcDecodeError(f"reply_stat {reply_stat}")
    except struct.error as exc:
        raise RpcDecodeError(f"truncated reply: {exc}") from None
