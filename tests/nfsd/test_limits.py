"""One test per hostile-input limit, each showing the limit's value (issue 16 point 2).

Codec and RPC limits run sans-I/O; connection limits (count per address and in total,
idle and slow records, refused networks, in-flight calls) run against a live server on
loopback in tests/nfsd/test_limits_live.py.
"""
from __future__ import annotations

import struct
import tracemalloc

import pytest

from nfsd import attrs
from nfsd.errors import NfsError
from nfsd.rpc import (
    DEFAULT_MAX_FRAGMENTS, DEFAULT_MAX_RECORD, LAST_FRAGMENT, RECORD_INITIAL_ALLOC, ConnectionError as
    RpcConnectionError, Program, RpcConnection, encode_call,
)
from nfsd.xdr import XdrError, decode
import nfsd.xdr.nfs4 as n


def words(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in ws)


# ---- bitmap4: bounded at decode, never expanded past what we know --------------------------

def test_bitmap_word_count_is_bounded_at_decode():
    """64 words (2,048 attribute numbers): room for an unknown attribute such as pynfs's
    1000 (32 words), which must be ignored, not refused; one word more is refused."""
    assert n.MAX_BITMAP_WORDS == 64 and n.bitmap4.maxlen == 64
    assert decode(n.bitmap4, words(64, *[0xFFFFFFFF] * 64)) == [0xFFFFFFFF] * 64
    assert decode(n.GETATTR4args, words(32, *[0] * 31, 1 << (1000 % 32))).attr_request[31] == 1 << 8
    with pytest.raises(XdrError, match="length 65 exceeds the declared maximum 64"):
        decode(n.bitmap4, words(65, *[0xFFFFFFFF] * 65))


def test_huge_all_ones_bitmap_in_a_compound_costs_nothing():
    """A GETATTR whose bitmap announces (and carries) 250,000 all-ones words: refused at
    decode, with no allocation in proportion to it (the words are never turned into ints)."""
    nwords = 250_000
    body = words(nwords) + b"\xff" * (4 * nwords)
    tracemalloc.start()
    try:
        with pytest.raises(XdrError, match="exceeds the declared maximum 64"):
            n.bitmap4.unpack(memoryview(body), 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_unknown_bits_are_found_without_expanding():
    every = [0xFFFFFFFF] * n.MAX_BITMAP_WORDS
    supported = attrs.SUPPORTED_BITMAPS[1]
    assert attrs.unsupported(every, 1) and not attrs.unsupported(supported, 1)
    assert len(attrs.bits_of(every)) == 32 * n.MAX_BITMAP_WORDS
    assert attrs.supported_part(every, 1) == tuple(supported)
    assert attrs.known_bits(every, 1) == sorted(attrs.SUPPORTED_IN[1])
    with pytest.raises(NfsError) as e:
        attrs.decode(n.fattr4(attrmask=[0, 0, 0, 0, 0, 0, 0, 1], attr_vals=b""), 1)
    assert e.value.status == n.NFS4ERR_ATTRNOTSUPP


# ---- XDR lengths: declared maximum, then the bytes actually there ----------------------------

def test_declared_maximum_is_enforced_before_allocating():
    with pytest.raises(XdrError, match="nfs_fh4.*129.*128"):        # opaque nfs_fh4<NFS4_FHSIZE>
        decode(n.nfs_fh4, words(129) + b"\0" * 132)


@pytest.mark.parametrize("t", [n.attrlist4, n.utf8string, n.COMPOUND4args, n.nfs_argop4])
def test_lengths_beyond_the_record_are_refused_before_allocating(t):
    """An unbounded opaque or array announcing 4 GiB with 8 bytes behind it."""
    data = {n.COMPOUND4args: words(0, 1, 0xFFFFFFF0, 0, 0),
            n.nfs_argop4: words(n.OP_GETATTR, 0xFFFFFFF0, 0)}.get(t, words(0xFFFFFFF0, 0, 0))
    tracemalloc.start()
    try:
        with pytest.raises(XdrError):
            decode(t, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


# ---- RPC record marking --------------------------------------------------------------------------

PROGS = {100003: Program(100003, 4, 4, frozenset({0, 1}))}


def test_record_size_limit_value():
    assert DEFAULT_MAX_RECORD == 2 * 1024 * 1024 + 64 * 1024
    c = RpcConnection(PROGS)
    ev = c.receive_data(struct.pack(">I", LAST_FRAGMENT | (DEFAULT_MAX_RECORD + 1)))
    assert len(ev) == 1 and isinstance(ev[0], RpcConnectionError) and "above the limit" in ev[0].reason


def test_announced_record_is_not_allocated_before_its_bytes_arrive():
    """A mark announcing 2 MiB followed by 100 bytes: the buffer is 64 KiB, not 2 MiB."""
    c = RpcConnection(PROGS)
    tracemalloc.start()
    try:
        assert c.receive_data(struct.pack(">I", LAST_FRAGMENT | (2 * 1024 * 1024)) + b"x" * 100) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert c.partial and c.buffered <= RECORD_INITIAL_ALLOC + 64 * 1024
    assert peak < 2 * RECORD_INITIAL_ALLOC


def test_record_buffer_grows_with_the_bytes_and_still_completes():
    c = RpcConnection(PROGS)
    call = encode_call(7, 100003, 4, 0, None, b"A" * 1_000_000)
    events = []
    for i in range(0, len(call), 4096):
        events += c.receive_data(call[i:i + 4096])
    assert len(events) == 1 and events[0].xid == 7 and bytes(events[0].args) == b"A" * 1_000_000


def test_fragments_per_record_limit():
    assert DEFAULT_MAX_FRAGMENTS == 2112          # a largest record in 1 KiB fragments
    c = RpcConnection(PROGS)
    ev = c.receive_data(struct.pack(">I", 0) * DEFAULT_MAX_FRAGMENTS)   # empty non-last fragments
    assert ev == []
    ev = c.receive_data(struct.pack(">I", 0))
    assert len(ev) == 1 and isinstance(ev[0], RpcConnectionError) and "fragments" in ev[0].reason
    # A call in several fragments (under the limit) is fine.
    c = RpcConnection(PROGS)
    body = encode_call(9, 100003, 4, 0, None)[4:]
    parts = [body[:10], body[10:20], body[20:]]
    data = b"".join(struct.pack(">I", len(p) | (LAST_FRAGMENT if i == 2 else 0)) + p
                    for i, p in enumerate(parts))
    ev = c.receive_data(data)
    assert len(ev) == 1 and ev[0].xid == 9


def fragmented(call: bytes, size: int) -> bytes:
    """A record cut into fragments of `size` bytes, as pynfs's 4.0 client sends (2 KiB)."""
    body = call[4:]
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(struct.pack(">I", len(p) | (LAST_FRAGMENT if i == len(parts) - 1 else 0)) + p
                    for i, p in enumerate(parts))


def test_a_maxwrite_call_in_small_fragments_goes_through():
    """A 1 MiB WRITE in 2 KiB fragments (513 of them); a largest record in 1 KiB ones."""
    c = RpcConnection(PROGS)
    ev = c.receive_data(fragmented(encode_call(11, 100003, 4, 0, None, b"w" * (1 << 20)), 2048))
    assert len(ev) == 1 and ev[0].xid == 11 and len(ev[0].args) == 1 << 20
    big = encode_call(12, 100003, 4, 0, None, b"b" * (DEFAULT_MAX_RECORD - 200))
    assert len(big) - 4 <= DEFAULT_MAX_RECORD
    ev = c.receive_data(fragmented(big, 1024))
    assert len(ev) == 1 and ev[0].xid == 12
    # ...but the record size bound still holds whatever the fragments.
    c = RpcConnection(PROGS)
    ev = c.receive_data(fragmented(encode_call(13, 100003, 4, 0, None, b"x" * DEFAULT_MAX_RECORD), 2048))
    assert len(ev) == 1 and isinstance(ev[0], RpcConnectionError) and "above the limit" in ev[0].reason
