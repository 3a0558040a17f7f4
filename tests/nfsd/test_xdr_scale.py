"""Large messages: a 100,000-entry READDIR chain and a zero-copy 1 MiB WRITE."""
from __future__ import annotations

from nfsd.xdr import decode, encode
from nfsd.xdr import nfs4 as n

N_ENTRIES = 100_000


def _chain(count: int):
    head = None
    attrs = n.fattr4([1 << n.FATTR4_TYPE], b"\0\0\0\1")
    for i in range(count, 0, -1):
        head = n.entry4(cookie=i + 2, name=b"f%06d" % i, attrs=attrs, nextentry=head)
    return head


def test_readdir_reply_with_100k_entries_round_trips():
    head = _chain(N_ENTRIES)
    res = n.COMPOUND4res(n.NFS4_OK, b"", [
        n.nfs_resop4(n.OP_PUTFH, n.PUTFH4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_READDIR, n.READDIR4res(n.NFS4_OK, n.READDIR4resok(
            b"v" * 8, n.dirlist4(entries=head, eof=True)))),
    ])
    wire = encode(n.COMPOUND4res, res)
    back = decode(n.COMPOUND4res, wire)
    assert back == res                           # __eq__ walks the chain iteratively
    node, count = back.resarray[1].value.value.reply.entries, 0
    while node is not None:
        count += 1
        last = node
        node = node.nextentry
    assert count == N_ENTRIES and last.name == b"f%06d" % N_ENTRIES
    # A difference deep in the chain is seen by __eq__.
    last.cookie += 1
    assert back != res


def test_linked_struct_repr_is_iterative_and_nested():
    head = _chain(3)
    text = repr(head)
    assert text.startswith("entry4(cookie=3, name=b'f000001'")
    assert text.endswith("nextentry=None)))")
    assert len(repr(_chain(20_000))) > 20_000 * 40     # no RecursionError


def test_write_data_decodes_without_copy():
    payload = bytes(range(256)) * 4096                      # 1 MiB
    args = n.COMPOUND4args(b"", 1, [
        n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(b"s" * 16, 1, 0, 0, False)),
        n.nfs_argop4(n.OP_PUTFH, n.PUTFH4args(b"fh")),
        n.nfs_argop4(n.OP_WRITE, n.WRITE4args(n.stateid4(0, b"\0" * 12), 0, n.UNSTABLE4,
                                              payload)),
    ])
    wire = encode(n.COMPOUND4args, args)
    got = decode(n.COMPOUND4args, wire)
    data = got.argarray[2].value.data
    assert isinstance(data, memoryview)
    assert data.obj is wire                                  # a view of the input buffer
    assert data.nbytes == len(payload) and data == payload
    # Also from a bytearray receive buffer (what a transport reuses).
    buf = bytearray(wire)
    data2 = decode(n.COMPOUND4args, buf).argarray[2].value.data
    assert data2.obj is buf
    # Other opaques stay bytes.
    assert type(got.argarray[1].value.object) is bytes
    # And packing accepts the memoryview back.
    assert encode(n.COMPOUND4args, got) == wire
