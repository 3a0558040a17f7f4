"""nfsd.rpc without sockets: record marking, call parsing, auth, RPC-level errors, fuzzing."""
from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st

from nfsd.context import Cred
from nfsd.rpc import (
    POOL_BUFFER, RECORD_INITIAL_ALLOC, SCRATCH_SIZE, CallReceived, ConnectionError as RpcConnectionError,
    Program, RecordPool, ReplyReceived, RpcConnection,
    SendReply, encode_call, parse_reply,
)
from nfsd.xdr.rpc import (
    AUTH_BADCRED, AUTH_ERROR, AUTH_NONE, AUTH_SYS, GARBAGE_ARGS, PROC_UNAVAIL, PROG_MISMATCH,
    PROG_UNAVAIL, RPC_MISMATCH,
)

NFS = 100003
PROGRAMS = {NFS: Program(NFS, 4, 4, frozenset({0, 1}))}
SYS_CRED = Cred(flavor=AUTH_SYS, uid=1000, gid=100, gids=(100, 27, 4), machinename=b"host-a")


def conn(**kw) -> RpcConnection:
    return RpcConnection(PROGRAMS, **kw)


def call_bytes(xid=1, prog=NFS, vers=4, proc=1, cred=SYS_CRED, args=b"ARGS"):
    return encode_call(xid, prog, vers, proc, cred, args)


def unframe(framed: bytes) -> bytes:
    (mark,) = struct.unpack_from(">I", framed)
    assert mark & 0x80000000 and mark & 0x7FFFFFFF == len(framed) - 4
    return framed[4:]


def fragments(framed: bytes, sizes: list[int]) -> bytes:
    """Re-frame a single-fragment record as several fragments of the given sizes."""
    payload = unframe(framed)
    out, pos = bytearray(), 0
    for i, n in enumerate(sizes):
        last = i == len(sizes) - 1
        chunk = payload[pos:] if last else payload[pos:pos + n]
        out += struct.pack(">I", (0x80000000 if last else 0) | len(chunk)) + chunk
        pos += len(chunk)
    return bytes(out)


def only_call(events) -> CallReceived:
    assert len(events) == 1 and isinstance(events[0], CallReceived), events
    return events[0]


def reply_of(events):
    assert len(events) == 1 and isinstance(events[0], SendReply), events
    return parse_reply(unframe(events[0].data))


# ---- parsing --------------------------------------------------------------------

def test_null_call_with_auth_none():
    ev = only_call(conn().receive_data(call_bytes(xid=7, proc=0, cred=None, args=b"")))
    assert (ev.xid, ev.prog, ev.vers, ev.proc) == (7, NFS, 4, 0)
    assert ev.cred.flavor == AUTH_NONE
    assert bytes(ev.args) == b""


def test_auth_sys_credentials_are_parsed():
    ev = only_call(conn().receive_data(call_bytes(args=b"\x00\x01\x02\x03")))
    assert ev.cred == SYS_CRED
    assert bytes(ev.args) == b"\x00\x01\x02\x03"


def test_args_view_points_into_the_record_buffer():
    ev = only_call(conn().receive_data(call_bytes(args=b"PAYLOAD!")))
    assert ev.args.obj is ev.record


def test_multi_fragment_record_is_reassembled():
    data = fragments(call_bytes(args=b"x" * 1000), [10, 300, 1])
    ev = only_call(conn().receive_data(data))
    assert bytes(ev.args) == b"x" * 1000


def test_byte_by_byte_feeding():
    c = conn()
    events = []
    for b in call_bytes(xid=99, args=b"abcd" * 10):
        events += c.receive_data(bytes([b]))
    assert only_call(events).xid == 99


def test_pipelined_calls_in_one_read_come_out_in_order():
    data = b"".join(call_bytes(xid=i, args=bytes([i]) * 4) for i in range(50))
    events = conn().receive_data(data)
    assert [e.xid for e in events] == list(range(50))
    assert all(bytes(e.args) == bytes([e.xid]) * 4 for e in events)


def test_large_record_is_received_straight_into_its_own_buffer():
    c = conn(direct_threshold=1024, scratch_size=4096)
    payload = bytes(range(256)) * 400                     # 100 KiB of args
    data = call_bytes(xid=5, args=payload)
    assert c.receive_data(data[:2000]) == []
    pos, owners, events = 2000, set(), []
    while pos < len(data):
        buf = c.get_buffer(-1)
        # The buffer handed out now is the record's own tail, not the scratch buffer;
        # it grows as bytes arrive, never past the bytes still announced.
        assert 0 < len(buf) <= len(data) - pos
        owners.add(id(buf.obj))
        n = len(buf)
        buf[:] = data[pos:pos + n]
        del buf
        pos += n
        events += c.buffer_updated(n)
    ev = only_call(events)
    assert bytes(ev.args) == payload
    assert owners == {id(ev.record)} and len(ev.record) == len(data) - 4


def test_record_buffers_are_never_reused():
    c = conn(direct_threshold=1024, scratch_size=4096)
    first = only_call(c.receive_data(call_bytes(xid=1, args=b"A" * 50_000)))
    second = only_call(c.receive_data(call_bytes(xid=2, args=b"B" * 50_000)))
    small = only_call(c.receive_data(call_bytes(xid=3, args=b"C" * 8)))
    assert first.record is not second.record
    assert bytes(first.args) == b"A" * 50_000 and bytes(second.args) == b"B" * 50_000
    assert bytes(small.args) == b"C" * 8


# ---- limits -----------------------------------------------------------------------

def test_oversized_record_breaks_only_this_stream():
    c = conn(max_record=1000)
    events = c.receive_data(call_bytes(args=b"x" * 2000))
    assert len(events) == 1 and isinstance(events[0], RpcConnectionError)
    assert c.broken
    assert c.receive_data(call_bytes(xid=2)) == []     # nothing more is parsed


def test_oversized_multi_fragment_record_is_refused_before_buffering_it_all():
    c = conn(max_record=1000)
    data = fragments(call_bytes(args=b"y" * 1500), [600, 600, 600])
    events = c.receive_data(data)
    assert [type(e) for e in events] == [RpcConnectionError]


def test_record_at_the_limit_is_accepted():
    data = call_bytes(args=b"z" * 500)
    c = conn(max_record=len(data) - 4)
    assert only_call(c.receive_data(data)).xid == 1


# ---- RPC-level errors ----------------------------------------------------------------

def test_unknown_program_gets_prog_unavail():
    r = reply_of(conn().receive_data(call_bytes(xid=11, prog=100005)))
    assert (r.xid, r.accepted, r.stat) == (11, True, PROG_UNAVAIL)


def test_wrong_version_gets_prog_mismatch_with_range():
    r = reply_of(conn().receive_data(call_bytes(vers=3)))
    assert (r.accepted, r.stat, r.detail) == (True, PROG_MISMATCH, (4, 4))


def test_unknown_procedure_gets_proc_unavail():
    r = reply_of(conn().receive_data(call_bytes(proc=2)))
    assert (r.accepted, r.stat) == (True, PROC_UNAVAIL)


def test_rpc_version_3_gets_rpc_mismatch():
    raw = bytearray(unframe(call_bytes(xid=3)))
    struct.pack_into(">I", raw, 8, 3)
    r = reply_of(conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw))
    assert (r.xid, r.accepted, r.stat, r.detail) == (3, False, RPC_MISMATCH, (2, 2))


def test_truncated_call_header_gets_garbage_args():
    raw = unframe(call_bytes(xid=77))[:16]
    r = reply_of(conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw))
    assert (r.xid, r.accepted, r.stat) == (77, True, GARBAGE_ARGS)


def test_unknown_auth_flavour_gets_auth_error():
    raw = bytearray(unframe(call_bytes(xid=8, cred=None)))
    struct.pack_into(">I", raw, 24, 6)                     # RPCSEC_GSS
    r = reply_of(conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw))
    assert (r.xid, r.accepted, r.stat, r.detail) == (8, False, AUTH_ERROR, (AUTH_BADCRED,))


def test_malformed_auth_sys_gets_auth_badcred():
    bad = Cred(flavor=AUTH_SYS, uid=1, gid=1, gids=tuple(range(17)))   # > 16 gids
    r = reply_of(conn().receive_data(call_bytes(cred=bad)))
    assert (r.accepted, r.stat, r.detail) == (False, AUTH_ERROR, (AUTH_BADCRED,))


def test_auth_body_over_400_bytes_gets_auth_badcred():
    raw = bytearray(unframe(call_bytes(cred=None)))
    raw[24:32] = struct.pack(">II", AUTH_SYS, 404) + b"\0" * 404
    r = reply_of(conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + bytes(raw)))
    assert (r.accepted, r.stat) == (False, AUTH_ERROR)


def test_a_reply_message_is_handed_up_for_the_back_channel():
    raw = bytearray(unframe(call_bytes(xid=4)))
    struct.pack_into(">I", raw, 4, 1)                      # REPLY
    events = conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw)
    assert len(events) == 1 and isinstance(events[0], ReplyReceived) and events[0].xid == 4


def test_a_short_denied_reply_is_a_reply_not_a_truncated_call():
    raw = struct.pack(">5I", 9, 1, 1, 1, 1)                # xid, REPLY, MSG_DENIED, AUTH_ERROR, stat
    events = conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw)
    assert [type(e) for e in events] == [ReplyReceived] and events[0].xid == 9
    assert parse_reply(events[0].record).accepted is False


def test_junk_message_type_is_dropped_silently():
    raw = bytearray(unframe(call_bytes(xid=4)))
    struct.pack_into(">I", raw, 4, 7)
    events = conn().receive_data(struct.pack(">I", 0x80000000 | len(raw)) + raw)
    assert len(events) == 1 and events[0].data == b""


def test_an_error_does_not_disturb_the_next_call():
    c = conn()
    events = c.receive_data(call_bytes(xid=1, prog=5) + call_bytes(xid=2))
    assert isinstance(events[0], SendReply) and isinstance(events[1], CallReceived)
    assert events[1].xid == 2


# ---- fuzzing ----------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.lists(st.integers(1, 700), max_size=20))
def test_random_bytes_never_raise(data, cuts):
    c = conn(max_record=2048, direct_threshold=256, scratch_size=1024)
    pos = 0
    for n in cuts + [len(data)]:
        for ev in c.receive_data(data[pos:pos + n]):
            assert isinstance(ev, (CallReceived, SendReply, RpcConnectionError))
        pos += n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=5000), min_size=1, max_size=6),
       st.lists(st.integers(1, 9000), max_size=12))
def test_any_split_of_a_call_stream_gives_the_same_calls(payloads, cuts):
    stream = b"".join(call_bytes(xid=i, args=p + b"\0" * (-len(p) % 4))
                      for i, p in enumerate(payloads))
    c = conn(direct_threshold=512, scratch_size=2048)
    events, pos = [], 0
    for n in cuts + [len(stream)]:
        events += c.receive_data(stream[pos:pos + n])
        pos += n
    assert [e.xid for e in events] == list(range(len(payloads)))
    for e, p in zip(events, payloads):
        assert bytes(e.args) == p + b"\0" * (-len(p) % 4)


def test_empty_and_tiny_records_are_dropped_and_the_stream_goes_on():
    c = conn()
    events = c.receive_data(struct.pack(">I", 0x80000000) + struct.pack(">I", 0x80000002) + b"ab"
                            + call_bytes(xid=42))
    assert [type(e) for e in events] == [SendReply, SendReply, CallReceived]
    assert events[0].data == events[1].data == b"" and events[2].xid == 42


def test_several_large_fragments_are_received_directly_and_joined():
    c = conn(direct_threshold=1024, scratch_size=4096)
    payload = bytes(range(256)) * 600                      # 150 KiB of args
    data = fragments(call_bytes(xid=9, args=payload), [50_000, 50_000, 50_000])
    events = []
    for i in range(0, len(data), 7000):                    # reads of a realistic size
        events += c.receive_data(data[i:i + 7000])
    assert bytes(only_call(events).args) == payload


# ---- pooled record buffers ------------------------------------------------------
def _feed_in_chunks(c: RpcConnection, framed: bytes, chunk: int = 65536) -> list:
    events = []
    for i in range(0, len(framed), chunk):
        events += c.receive_data(framed[i:i + chunk])
    return events


def test_a_large_single_fragment_record_reuses_a_pooled_buffer_once_its_call_is_over():
    pool = RecordPool()
    c = conn(pool=pool)
    a, b = bytes(range(256)) * 4000, bytes(reversed(range(256))) * 4001     # ~1 MiB each
    first = only_call(_feed_in_chunks(c, call_bytes(xid=1, args=a)))
    assert bytes(first.args) == a and len(first.record) == POOL_BUFFER
    buf = first.record
    pool.give_back(first.record)
    assert pool.reused == 0
    del first
    pool.give_back(buf)                                   # nothing views it now
    second = only_call(_feed_in_chunks(c, call_bytes(xid=2, args=b)))
    assert second.record is buf and pool.reused == 1
    assert second.xid == 2 and bytes(second.args) == b    # exactly its own bytes, none of a's


def test_a_header_announcing_a_poolable_record_costs_no_pool_buffer_until_bytes_arrive():
    """Regression (hostile-clients RSS): with the pool empty, a record mark announcing 1 MB
    plus 100 bytes made the server allocate and zero a fresh 1 MiB pool buffer; 256 such
    connections from one address held 272 MiB. Now the record starts small and moves into
    a pool-sized buffer once RECORD_INITIAL_ALLOC bytes of it have arrived."""
    pool = RecordPool()
    c = conn(pool=pool)
    framed = call_bytes(xid=3, args=bytes(range(256)) * 3900)              # ~1 MiB
    assert c.receive_data(framed[:104]) == []
    assert c.buffered <= SCRATCH_SIZE + RECORD_INITIAL_ALLOC
    call = only_call(_feed_in_chunks(c, framed[104:], chunk=5000))
    assert len(call.record) == POOL_BUFFER and bytes(call.args) == bytes(range(256)) * 3900
    record = call.record
    del call                                               # its call is over: no view left
    pool.give_back(record)
    assert pool._free == [record]                          # kept for the next large record


def test_a_pooled_buffer_still_viewed_is_never_handed_out_again():
    pool = RecordPool()
    c = conn(pool=pool)
    first = only_call(_feed_in_chunks(c, call_bytes(xid=1, args=b"a" * 500_000)))
    kept = first.args[-10:]               # e.g. a WRITE whose pwrite still runs after its call
    pool.give_back(first.record)
    second = only_call(_feed_in_chunks(c, call_bytes(xid=2, args=b"b" * 500_000)))
    assert second.record is not first.record and pool.reused == 0
    assert bytes(kept) == b"a" * 10


def test_small_oversized_and_multi_fragment_records_do_not_use_the_pool():
    pool = RecordPool()
    c = conn(pool=pool, max_record=4 << 20)
    small = only_call(c.receive_data(call_bytes(args=b"x" * 100)))
    big = only_call(_feed_in_chunks(c, call_bytes(args=b"y" * (POOL_BUFFER + 1))))
    multi = only_call(_feed_in_chunks(c, fragments(call_bytes(args=b"z" * 300_000), [100_000, 100_000, 200_000])))
    for call in (small, big, multi):
        assert len(call.record) != POOL_BUFFER
    assert bytes(multi.args) == b"z" * 300_000 and bytes(big.args) == b"y" * (POOL_BUFFER + 1)
    assert pool.reused == 0 and not pool._free
