"""File handles, PUT*FH / GETFH / SAVEFH / RESTOREFH / LOOKUP / LOOKUPP, the pseudo-root."""
import asyncio

import pytest

from cache.store import Store
from nfsd.exports import Export, Exports
from nfsd.fh import FH_LEN, BadHandle, FhCodec
from testkit.ops_harness import FakeServer, Fs, make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


def test_codec_round_trip_and_forgery():
    c = FhCodec(b"k" * 16)
    fh = c.export(3, 42, 7)
    assert len(fh.raw) == FH_LEN
    back = c.decode(fh.raw)
    assert (back.export_id, back.ino, back.gen, back.is_pseudo) == (3, 42, 7, False)
    forged = bytearray(fh.raw)
    forged[10] ^= 1                                    # another inode number
    with pytest.raises(BadHandle):
        c.decode(bytes(forged))
    with pytest.raises(BadHandle):
        c.decode(fh.raw[:-1])
    with pytest.raises(BadHandle):
        FhCodec(b"other key").decode(fh.raw)           # another store's handle


def test_codec_memo_answers_as_the_codec_and_stays_bounded(monkeypatch):
    import nfsd.fh as fhmod
    monkeypatch.setattr(fhmod, "MEMO_ENTRIES", 8)
    c = FhCodec(b"k" * 16)
    fresh = FhCodec(b"k" * 16)
    for ino in range(100):
        fh = c.export(1, ino, 5)
        assert fh == fresh.export(1, ino, 5)           # same bytes with or without the memo
        assert c.decode(fh.raw) == fh
        assert c.decode(bytearray(fh.raw)) == fh       # any bytes-like, as the codec takes
        assert len(c._made) <= 8 and len(c._verified) <= 8
    forged = bytearray(c.export(1, 7, 5).raw)
    forged[-1] ^= 1                                    # the MAC: never remembered as good
    for _ in range(2):
        with pytest.raises(BadHandle):
            c.decode(bytes(forged))
    assert bytes(forged) not in c._verified


def test_putrootfh_lookup_crosses_into_export(fs):
    async def main():
        res = await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None),
                            (OP_GETATTR, GETATTR4args([1 << FATTR4_TYPE | 1 << FATTR4_FSID]))])
        root = res[1].value.object
        exp = await fs.root_fh()
        assert exp != root
        a_root = await fs.getattr(root, FATTR4_FSID, FATTR4_FILEID)
        a_exp = await fs.getattr(exp, FATTR4_FSID, FATTR4_FILEID, FATTR4_MOUNTED_ON_FILEID)
        assert a_root[FATTR4_FSID] != a_exp[FATTR4_FSID]       # a mount point for the client
        assert a_exp[FATTR4_FILEID] == 1                       # the store's root inode
        assert a_exp[FATTR4_MOUNTED_ON_FILEID] != a_exp[FATTR4_FILEID]
        # LOOKUPP leaves the export back into the pseudo root
        res = await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_LOOKUPP, None), (OP_GETFH, None)])
        assert res[2].value.object == root
        assert await fs.status([(OP_PUTROOTFH, None), (OP_LOOKUPP, None)]) == NFS4ERR_NOENT
        assert await fs.status([(OP_PUTROOTFH, None),
                                (OP_LOOKUP, LOOKUP4args(b"nope"))]) == NFS4ERR_NOENT
        # PUTPUBFH is the same root
        res = await fs.run([(OP_PUTPUBFH, None), (OP_GETFH, None)])
        assert res[1].value.object == root
    run(main())


def test_lookup_lookupp_savefh_restorefh(fs):
    async def main():
        exp = await fs.root_fh()
        d = await fs.mkdir(exp, "d")
        sub = await fs.mkdir(d, "sub")
        assert await fs.fh(exp, "d", "sub") == sub
        res = await fs.run([(OP_PUTFH, PUTFH4args(sub)), (OP_LOOKUPP, None), (OP_GETFH, None)])
        assert res[2].value.object == d
        res = await fs.run([(OP_PUTFH, PUTFH4args(d)), (OP_SAVEFH, None),
                            (OP_PUTFH, PUTFH4args(exp)), (OP_RESTOREFH, None), (OP_GETFH, None)])
        assert res[4].value.object == d
        # LOOKUP on a file: NOTDIR; LOOKUPP on a file: NOTDIR
        f, sid, _ = await fs.open(exp, "f")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_LOOKUP, LOOKUP4args(b"x"))]) == NFS4ERR_NOTDIR
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_LOOKUPP, None)]) == NFS4ERR_NOTDIR
    run(main())


def test_no_current_filehandle(fs):
    async def main():
        for op, args in [(OP_GETFH, None), (OP_SAVEFH, None), (OP_LOOKUP, LOOKUP4args(b"a")),
                         (OP_LOOKUPP, None), (OP_GETATTR, GETATTR4args([1])),
                         (OP_READ, READ4args(stateid4(0, bytes(12)), 0, 1)),
                         (OP_REMOVE, REMOVE4args(b"a")), (OP_READDIR, READDIR4args(0, bytes(8), 100, 1000, [])),
                         (OP_ACCESS, ACCESS4args(1)), (OP_READLINK, None), (OP_COMMIT, COMMIT4args(0, 0))]:
            assert await fs.status([(op, args)]) == NFS4ERR_NOFILEHANDLE, op
        assert await fs.status([(OP_RESTOREFH, None)]) == NFS4ERR_NOFILEHANDLE
    run(main())


def test_bad_and_stale_handles(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "gone")
        await fs.close(f, sid)
        bad = bytearray(f)
        bad[-1] ^= 0xFF
        assert await fs.status([(OP_PUTFH, PUTFH4args(bytes(bad)))]) == NFS4ERR_BADHANDLE
        assert await fs.status([(OP_PUTFH, PUTFH4args(b"\x01" * 5))]) == NFS4ERR_BADHANDLE
        assert await fs.status([(OP_PUTFH, PUTFH4args(b""))]) == NFS4ERR_BADHANDLE
        await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(b"gone"))])
        assert await fs.status([(OP_PUTFH, PUTFH4args(f))]) == NFS4ERR_STALE
    run(main())


def test_handles_survive_restart(tmp_path):
    async def phase1():
        fs, store = make_fs(tmp_path)
        exp = await fs.root_fh()
        d = await fs.mkdir(exp, "keep")
        store.close()
        return d

    async def phase2(d):
        fs, store = make_fs(tmp_path)
        try:
            a = await fs.getattr(d, FATTR4_TYPE)
            assert a[FATTR4_TYPE] == NF4DIR
        finally:
            store.close()
    d = run(phase1())
    run(phase2(d))


def test_export_at_root_and_nested_pseudo_dirs(tmp_path):
    store = Store.open(str(tmp_path / "s"))
    try:
        fs = Fs(FakeServer(store, Exports([Export(1, "/", root_squash=False)])))
        async def main():
            root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
            assert (await fs.getattr(root, FATTR4_FILEID))[FATTR4_FILEID] == 1   # the export itself
            fs2 = Fs(FakeServer(store, Exports([Export(2, "/a/b/c", root_squash=False)])))
            fh = await fs2.root_fh(("a", "b", "c"))
            assert (await fs2.getattr(fh, FATTR4_FILEID))[FATTR4_FILEID] == 1
            res = await fs2.run([(OP_PUTFH, PUTFH4args(fh)), (OP_LOOKUPP, None), (OP_LOOKUPP, None),
                                 (OP_GETFH, None)])
            assert res[3].value.object == await fs2.root_fh(("a",))
            # pseudo directories are read-only
            a = await fs2.root_fh(("a",))
            st = await fs2.status([(OP_PUTFH, PUTFH4args(a)),
                                   (OP_CREATE, CREATE4args(createtype4(NF4DIR), b"x", fattr4([], b"")))])
            assert st == NFS4ERR_ROFS
        run(main())
    finally:
        store.close()


def test_secinfo(fs):
    async def main():
        exp = await fs.root_fh()
        res = await fs.run([(OP_PUTROOTFH, None), (OP_SECINFO, SECINFO4args(b"checkpoints"))])
        assert [s.tag for s in res[1].value] == [1, 0]          # AUTH_SYS, AUTH_NONE
        # 4.1: SECINFO consumes the current filehandle
        assert await fs.status([(OP_PUTROOTFH, None), (OP_SECINFO, SECINFO4args(b"checkpoints")),
                                (OP_GETFH, None)]) == NFS4ERR_NOFILEHANDLE
        assert await fs.status([(OP_PUTROOTFH, None), (OP_SECINFO, SECINFO4args(b"nope"))]) == NFS4ERR_NOENT
        res = await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_SECINFO_NO_NAME, SECINFO_STYLE4_CURRENT_FH)])
        assert [s.tag for s in res[1].value] == [1, 0]
        res = await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_SECINFO_NO_NAME, SECINFO_STYLE4_PARENT)])
        assert await fs.status([(OP_PUTROOTFH, None), (OP_SECINFO_NO_NAME, SECINFO_STYLE4_PARENT)]) == NFS4ERR_NOENT
    run(main())


def test_handle_key_needs_the_secret_beside_the_store(tmp_path):
    from nfsd.fh import KEY_FILE, codec_for, load_secret
    from tests.nfsd.conftest import FakeStore

    store = FakeStore(path=str(tmp_path))
    secret = load_secret(str(tmp_path))
    assert (tmp_path / KEY_FILE).read_bytes() == secret and load_secret(str(tmp_path)) == secret
    fh = codec_for(store).export(1, 5, 1)
    # someone who knows only the instance_id (the NFS server owner) cannot make handles
    with pytest.raises(BadHandle):
        FhCodec(store.instance_id).decode(fh.raw)
    assert FhCodec(store.instance_id + secret).decode(fh.raw).ino == 5
    (tmp_path / KEY_FILE).write_bytes(b"short")
    with pytest.raises(ValueError):
        load_secret(str(tmp_path))
