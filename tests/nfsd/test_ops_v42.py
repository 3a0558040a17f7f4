"""NFSv4.2 ops (RFC 7862) through testkit/nfsclient.py in minor version 2 against a live server:
SEEK, ALLOCATE, DEALLOCATE, READ_PLUS, COPY, CLONE, OFFLOAD_STATUS/CANCEL (with a non-copy
stateid; asynchronous COPY is in test_offload.py), the NOTSUPP answers for the rest, and the minor-version rule (a 4.2 op in a 4.0/4.1 COMPOUND is illegal)."""
from __future__ import annotations

import asyncio

from cache.api import ROOT_INO, DataState, RemoteInfo
from cache.store import Store
from nfsd.exports import Export, Exports
from nfsd.xdr.nfs4 import *  # noqa: F401,F403
from testkit.nfsclient import check, op, status_of
from testkit.ops_harness import FakeServer, Fs

ANON = stateid4(0, bytes(12))
KiB = 1024
MiB = 1 << 20


def run42(nfs_client, body):
    return nfs_client(body, minorversion=2)


async def setup(c, name="f", data=b""):
    exp = await c.lookup_path("/checkpoints")
    fh, sid = await c.open_create(exp, name)
    if data:
        await c.write(fh, sid, 0, data, FILE_SYNC4)
    return exp, fh, sid


async def uploaded(c, store, exp, name, fh, sid):
    """What the uploader leaves: the file closed, committed (commit_settled) and CLEAN with
    an object recorded; then opened again for writing. Returns the new stateid. (A file a
    writer has open is never uploaded, and stays F_UNCOMMITTED while open.)"""
    await c.close_file(fh, sid)
    ino = await ino_of(None, c, fh)
    store.commit_settled(ino)
    a = store.getattr(ino)
    assert store.mark_uploaded(ino, RemoteInfo(key=name, etag="e", size=a.size,
                                               uploaded_change=a.change))
    _, sid = await c.open_existing(exp, name, access=OPEN4_SHARE_ACCESS_BOTH)
    return sid


async def on(c, fh, *ops, saved_fh=None):
    """COMPOUND [PUTFH saved, SAVEFH,] PUTFH fh, ops...; the results after the PUTFHs."""
    pre = [] if saved_fh is None else [op(OP_PUTFH, PUTFH4args(saved_fh)), op(OP_SAVEFH)]
    res = await c.compound(pre + [op(OP_PUTFH, PUTFH4args(fh))] + list(ops))
    return res, res.resarray[len(pre) + 1:]


def ino_of(nfs_server, c, fh):
    async def get():
        return (await c.getattr(fh, attrs=(FATTR4_FILEID,)))["fileid"]
    return get()


def seek(sid, offset, what):
    return op(OP_SEEK, SEEK4args(sid, offset, what))


def test_seek_finds_data_and_holes(nfs_client):
    async def body(c):
        _, fh, sid = await setup(c)
        await c.write(fh, sid, 0, b"x" * (8 * KiB))
        await c.write(fh, sid, MiB, b"y" * (8 * KiB))
        # ALLOCATE past the end extends the size: a hole up to 3 MiB
        check((await on(c, fh, op(OP_ALLOCATE, ALLOCATE4args(sid, MiB + 8 * KiB, 2 * MiB - 8 * KiB))))[0])
        size = 3 * MiB
        assert (await c.getattr(fh, attrs=(FATTR4_SIZE,)))["size"] == size
        for offset, what, expect in (
                (0, NFS4_CONTENT_DATA, (False, 0)),
                (100, NFS4_CONTENT_HOLE, (False, 8 * KiB)),
                (8 * KiB, NFS4_CONTENT_DATA, (False, MiB)),
                (MiB + 100, NFS4_CONTENT_HOLE, (False, MiB + 8 * KiB)),
                (MiB + 8 * KiB, NFS4_CONTENT_DATA, (True, size)),      # no data follows
                (2 * MiB, NFS4_CONTENT_HOLE, (False, 2 * MiB))):
            res, (r,) = await on(c, fh, seek(sid, offset, what))
            check(res)
            assert (r.value.value.sr_eof, r.value.value.sr_offset) == expect, (offset, what)
        res, (r,) = await on(c, fh, seek(sid, size, NFS4_CONTENT_HOLE))
        assert res.status == NFS4ERR_NXIO
        res, (r,) = await on(c, fh, seek(stateid4(1, b"bogus-state!"), 0, NFS4_CONTENT_DATA))
        assert res.status == NFS4ERR_BAD_STATEID
        exp = await c.lookup_path("/checkpoints")
        res, _ = await on(c, exp, seek(ANON, 0, NFS4_CONTENT_DATA))
        assert res.status == NFS4ERR_WRONG_TYPE
    run42(nfs_client, body)


def test_deallocate_punches_a_hole_read_plus_shows_it(nfs_client, nfs_server):
    data = bytes(range(256)) * 768                          # 192 KiB
    async def body(c):
        exp, fh, sid = await setup(c, data=data)
        ino = await ino_of(nfs_server, c, fh)
        store = nfs_server.store
        sid = await uploaded(c, store, exp, "f", fh, sid)
        seq = store.getattr(ino).data_seq
        check((await on(c, fh, op(OP_DEALLOCATE, DEALLOCATE4args(sid, 64 * KiB, 64 * KiB))))[0])
        a = store.getattr(ino)
        assert a.size == len(data) and a.data_state == DataState.DIRTY and a.data_seq != seq
        want = data[:64 * KiB] + bytes(64 * KiB) + data[128 * KiB:]
        assert (await c.read(fh, sid, 0, len(data)))[0] == want
        res, (r,) = await on(c, fh, op(OP_READ_PLUS, READ_PLUS4args(sid, 4 * KiB, MiB)))
        check(res)
        ok = r.value.value
        assert ok.rpr_eof
        segs = [(s.tag, s.value) for s in ok.rpr_contents]
        assert [t for t, _ in segs] == [NFS4_CONTENT_DATA, NFS4_CONTENT_HOLE, NFS4_CONTENT_DATA]
        assert (segs[0][1].d_offset, bytes(segs[0][1].d_data)) == (4 * KiB, data[4 * KiB:64 * KiB])
        assert (segs[1][1].di_offset, segs[1][1].di_length) == (64 * KiB, 64 * KiB)
        assert (segs[2][1].d_offset, bytes(segs[2][1].d_data)) == (128 * KiB, data[128 * KiB:])
        # a short READ_PLUS inside the hole; at the end: eof, nothing
        res, (r,) = await on(c, fh, op(OP_READ_PLUS, READ_PLUS4args(sid, 70 * KiB, 10)))
        ok = r.value.value
        assert not ok.rpr_eof and [(s.value.di_offset, s.value.di_length) for s in ok.rpr_contents] == [(70 * KiB, 10)]
        res, (r,) = await on(c, fh, op(OP_READ_PLUS, READ_PLUS4args(sid, len(data), 10)))
        assert r.value.value.rpr_eof and r.value.value.rpr_contents == []
        # errors: zero length, a read-only open, a directory
        res, _ = await on(c, fh, op(OP_DEALLOCATE, DEALLOCATE4args(sid, 0, 0)))
        assert res.status == NFS4ERR_INVAL
        exp = await c.lookup_path("/checkpoints")
        rfh, rsid = await c.open_create(exp, "r", access=OPEN4_SHARE_ACCESS_READ)
        res, _ = await on(c, rfh, op(OP_DEALLOCATE, DEALLOCATE4args(rsid, 0, 10)))
        assert res.status == NFS4ERR_OPENMODE
        res, _ = await on(c, rfh, op(OP_ALLOCATE, ALLOCATE4args(rsid, 0, 10)))
        assert res.status == NFS4ERR_OPENMODE
        res, _ = await on(c, exp, op(OP_DEALLOCATE, DEALLOCATE4args(ANON, 0, 10)))
        assert res.status == NFS4ERR_WRONG_TYPE
        res, _ = await on(c, exp, op(OP_READ_PLUS, READ_PLUS4args(ANON, 0, 10)))
        assert res.status == NFS4ERR_ISDIR
    run42(nfs_client, body)


def test_copy_and_clone_move_no_data_through_the_client(nfs_client, nfs_server):
    data = bytes(range(251)) * 1000                         # 251000 bytes: an unaligned tail
    async def body(c):
        exp, src, ssid = await setup(c, "src", data)
        _, dst, dsid = await setup(c, "dst", b"old" * 100)
        dino = await ino_of(nfs_server, c, dst)
        store = nfs_server.store
        dsid = await uploaded(c, store, exp, "dst", dst, dsid)
        seq = store.getattr(dino).data_seq
        # COPY of the whole source (count 0 = to its end), asked asynchronous: done at once
        res, (r,) = await on(c, dst, op(OP_COPY, COPY4args(ssid, dsid, 0, 0, 0, False, False, [])),
                             saved_fh=src)
        check(res)
        ok = r.value.value
        assert ok.cr_response.wr_count == len(data) and ok.cr_response.wr_callback_id == []
        assert ok.cr_response.wr_committed == FILE_SYNC4
        assert ok.cr_response.wr_writeverf == store.write_verifier
        assert (ok.cr_requirements.cr_consecutive, ok.cr_requirements.cr_synchronous) == (True, True)
        assert (await c.read(dst, dsid, 0, MiB))[0] == data
        a = store.getattr(dino)
        assert a.data_state == DataState.DIRTY and a.data_seq != seq   # the uploader sends it
        # CLONE: aligned offsets; the count may end at the source's end
        res, _ = await on(c, dst, op(OP_CLONE, CLONE4args(ssid, dsid, 8192, 1 << 20,
                                                          len(data) - 8192)), saved_fh=src)
        check(res)
        got, _ = await c.read(dst, dsid, 1 << 20, MiB)
        assert got == data[8192:]
        assert (await c.getattr(dst, attrs=(FATTR4_SIZE,)))["size"] == (1 << 20) + len(data) - 8192
        for args, status in (
                (CLONE4args(ssid, dsid, 100, 0, 4096), NFS4ERR_INVAL),          # misaligned offset
                (CLONE4args(ssid, dsid, 0, 0, 5000), NFS4ERR_INVAL),            # misaligned count
                (CLONE4args(ssid, dsid, 0, 0, len(data) + 4096), NFS4ERR_INVAL),  # past the end
                (CLONE4args(ssid, stateid4(1, b"bogus-state!"), 0, 0, 4096), NFS4ERR_BAD_STATEID)):
            res, _ = await on(c, dst, op(OP_CLONE, args), saved_fh=src)
            assert res.status == status, args
        res, _ = await on(c, dst, op(OP_COPY, COPY4args(ssid, dsid, len(data) + 1, 0, 0, True, True, [])),
                          saved_fh=src)
        assert res.status == NFS4ERR_INVAL
        # source and destination ranges overlapping in one file
        res, _ = await on(c, src, op(OP_COPY, COPY4args(ssid, ssid, 0, 100, 1000, True, True, [])),
                          saved_fh=src)
        assert res.status == NFS4ERR_INVAL
        # an inter-server copy is not offered
        res, _ = await on(c, dst, op(OP_COPY, COPY4args(ssid, dsid, 0, 0, 10, True, True,
                                                        [netloc4(NL4_NAME, b"other")])), saved_fh=src)
        assert res.status == NFS4ERR_NOTSUPP
        # no saved filehandle; a directory as the source
        res = await c.compound([op(OP_PUTFH, PUTFH4args(dst)),
                                op(OP_COPY, COPY4args(ssid, dsid, 0, 0, 0, True, True, []))])
        assert res.status == NFS4ERR_NOFILEHANDLE
        res, _ = await on(c, dst, op(OP_CLONE, CLONE4args(ANON, dsid, 0, 0, 0)), saved_fh=exp)
        assert res.status == NFS4ERR_WRONG_TYPE
    run42(nfs_client, body)


def test_offload_ops_know_no_stateid_and_other_42_ops_are_notsupp(nfs_client):
    async def body(c):
        _, fh, sid = await setup(c)
        for o in (op(OP_OFFLOAD_STATUS, OFFLOAD_STATUS4args(sid)),
                  op(OP_OFFLOAD_CANCEL, OFFLOAD_CANCEL4args(sid))):
            res, _ = await on(c, fh, o)
            assert res.status == NFS4ERR_BAD_STATEID
        for o in (op(OP_IO_ADVISE, IO_ADVISE4args(sid, 0, 10, [])),
                  op(OP_COPY_NOTIFY, COPY_NOTIFY4args(sid, netloc4(NL4_NAME, b"x"))),
                  op(OP_LAYOUTERROR, LAYOUTERROR4args(0, 10, sid, []))):
            res, results = await on(c, fh, o)
            assert res.status == NFS4ERR_NOTSUPP
            assert results[-1].tag == o.tag
    run42(nfs_client, body)


def test_42_ops_are_illegal_in_41_and_40_compounds(nfs_client):
    async def body41(c):
        exp = await c.lookup_path("/checkpoints")
        res, results = await on(c, exp, seek(ANON, 0, NFS4_CONTENT_DATA))
        assert res.status == NFS4ERR_OP_ILLEGAL and results[-1].tag == OP_ILLEGAL
    nfs_client(body41, minorversion=1)

    async def body40(c):
        res = await c.compound_raw([op(OP_PUTROOTFH), seek(ANON, 0, NFS4_CONTENT_DATA)])
        assert res.status == NFS4ERR_OP_ILLEGAL and res.resarray[-1].tag == OP_ILLEGAL
    nfs_client(body40, minorversion=0, setup=False)


def test_copy_across_exports_is_xdev(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    a = store.mkdir(ROOT_INO, b"a", 0o777, 0, 0)[0].ino
    b = store.mkdir(ROOT_INO, b"b", 0o777, 0, 0)[0].ino
    exports = Exports([Export(1, "/a", root_ino=a, root_squash=False),
                       Export(2, "/b", root_ino=b, root_squash=False)])
    fs = Fs(FakeServer(store, exports), minorversion=2)

    async def main():
        fa, sa, _ = await fs.open(await fs.root_fh(("a",)), "f")
        fb, sb, _ = await fs.open(await fs.root_fh(("b",)), "g")
        await fs.write(fa, sa, 0, b"z" * 4096)
        for o in ((OP_COPY, COPY4args(sa, sb, 0, 0, 0, True, True, [])),
                  (OP_CLONE, CLONE4args(sa, sb, 0, 0, 0))):
            assert await fs.status([(OP_PUTFH, PUTFH4args(fa)), (OP_SAVEFH, None),
                                    (OP_PUTFH, PUTFH4args(fb)), o]) == NFS4ERR_XDEV
    try:
        asyncio.run(main())
    finally:
        store.close()


def test_byte_changing_42_ops_on_a_read_only_export_are_rofs(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    f = store.create(ROOT_INO, b"f", 0o666, 0, 0)[0].ino
    store.write(f, 0, b"r" * 8192)
    store.commit(f)
    fs = Fs(FakeServer(store, Exports([Export(1, "/checkpoints", rw=False, root_squash=False)])),
            minorversion=2)

    async def main():
        fh = await fs.fh(await fs.root_fh(), "f")
        put = (OP_PUTFH, PUTFH4args(fh))
        for o in ((OP_ALLOCATE, ALLOCATE4args(ANON, 0, 10)),
                  (OP_DEALLOCATE, DEALLOCATE4args(ANON, 0, 10)),
                  (OP_CLONE, CLONE4args(ANON, ANON, 0, 4096, 4096)),
                  (OP_COPY, COPY4args(ANON, ANON, 0, 8192, 10, True, True, []))):
            ops = [put, (OP_SAVEFH, None), put, o]
            assert await fs.status(ops) == NFS4ERR_ROFS, o
        # reading ops work there
        res = await fs.run([put, (OP_SEEK, SEEK4args(ANON, 0, NFS4_CONTENT_HOLE))])
        assert (res[1].value.sr_eof, res[1].value.sr_offset) == (True, 8192)
        res = await fs.run([put, (OP_READ_PLUS, READ_PLUS4args(ANON, 0, 100))])
        assert [bytes(c.value.d_data) for c in res[1].value.rpr_contents] == [b"r" * 100]
    try:
        asyncio.run(main())
    finally:
        store.close()


def test_clone_blksize_is_a_42_attribute(nfs_client):
    from testkit.ops_harness import attrs_of, parse_attrs
    want = [FATTR4_SUPPORTED_ATTRS, FATTR4_CLONE_BLKSIZE]

    def getattr_op():
        words = [0, 0, 0]
        for b in want:
            words[b // 32] |= 1 << (b % 32)
        return op(OP_GETATTR, GETATTR4args(words))

    def supported_bits(words):
        return {w * 32 + b for w, word in enumerate(words) for b in range(32) if word >> b & 1}

    async def body(c):
        _, fh, sid = await setup(c)
        res, (r,) = await on(c, fh, getattr_op())
        check(res)
        got = parse_attrs(r.value.value.obj_attributes)
        if c.minorversion == 2:
            assert got[FATTR4_CLONE_BLKSIZE] == 4096
            assert FATTR4_CLONE_BLKSIZE in supported_bits(got[FATTR4_SUPPORTED_ATTRS])
            # read-only
            res, _ = await on(c, fh, op(OP_SETATTR, SETATTR4args(sid, attrs_of({FATTR4_CLONE_BLKSIZE: 1}))))
            assert res.status == NFS4ERR_INVAL
        else:
            assert FATTR4_CLONE_BLKSIZE not in got
            assert FATTR4_CLONE_BLKSIZE not in supported_bits(got[FATTR4_SUPPORTED_ATTRS])
            for o in (op(OP_SETATTR, SETATTR4args(sid, attrs_of({FATTR4_CLONE_BLKSIZE: 1}))),
                      op(OP_VERIFY, VERIFY4args(attrs_of({FATTR4_CLONE_BLKSIZE: 4096})))):
                res, _ = await on(c, fh, o)
                assert res.status == NFS4ERR_ATTRNOTSUPP
        return True
    assert nfs_client(body, minorversion=2) and nfs_client(body, minorversion=1)


def test_copy_asked_asynchronous_without_a_session_is_synchronous(tmp_path):
    """The engine alone (no session, so no back channel): a copy above the asynchronous
    threshold is still done before the reply."""
    store = Store.open(str(tmp_path / "s"))
    server = FakeServer(store, Exports([Export(1, "/checkpoints", root_squash=False)]))
    server.offloads.async_min = 1
    fs = Fs(server, minorversion=2)

    async def main():
        exp = await fs.root_fh()
        src, ssid, _ = await fs.open(exp, "src")
        await fs.write(src, ssid, 0, b"z" * 5000)
        dst, dsid, _ = await fs.open(exp, "dst")
        res = await fs.run([(OP_PUTFH, PUTFH4args(src)), (OP_SAVEFH, None),
                            (OP_PUTFH, PUTFH4args(dst)),
                            (OP_COPY, COPY4args(ssid, dsid, 0, 0, 0, False, False, []))])
        ok = res[-1].value
        assert ok.cr_response.wr_callback_id == [] and ok.cr_response.wr_count == 5000
        assert len(server.offloads) == 0
    try:
        asyncio.run(main())
    finally:
        store.close()
