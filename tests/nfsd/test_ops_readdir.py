"""READDIR: paging with cookies, maxcount/dircount, TOOSMALL, verifiers, the pseudo root."""
import asyncio

import pytest

from nfsd import attrs as fattr
from testkit.ops_harness import attrs_of, make_fs, parse_attrs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


def entries_of(ok):
    out, e = [], ok.reply.entries
    while e is not None:
        out.append(e)
        e = e.nextentry
    return out


async def readdir(fs, fh, cookie=0, maxcount=8192, dircount=0, attrs=(FATTR4_FILEID, FATTR4_TYPE),
                  verf=bytes(8)):
    res = await fs.run([(OP_PUTFH, PUTFH4args(fh)),
                        (OP_READDIR, READDIR4args(cookie, verf, dircount, maxcount,
                                                  fattr.bitmap_of(sorted(attrs))))])
    return res[1].value


def test_readdir_10000_entries_small_pages(fs):
    async def main():
        exp = await fs.root_fh()
        d = await fs.mkdir(exp, "big")
        store = fs.server.store
        dino = (await fs.getattr(d, FATTR4_FILEID))[FATTR4_FILEID]
        for i in range(10_000):
            store.create(dino, f"file-{i:05d}".encode(), 0o644, 0, 0)
        names, cookie, pages = [], 0, 0
        while True:
            ok = await readdir(fs, d, cookie, maxcount=2048)
            es = entries_of(ok)
            assert es or ok.reply.eof
            for e in es:
                assert e.cookie not in (0, 1, 2)
                names.append(e.name)
                attrs = parse_attrs(e.attrs)
                assert attrs[FATTR4_TYPE] == NF4REG
            pages += 1
            if ok.reply.eof:
                break
            cookie = es[-1].cookie
        assert len(names) == 10_000 and len(set(names)) == 10_000
        assert pages > 100
        # one reply with room for everything
        ok = await readdir(fs, d, 0, maxcount=1 << 20)
        assert len(entries_of(ok)) == 10_000 and ok.reply.eof
    run(main())


def test_maxcount_dircount_toosmall_and_cookies(fs):
    async def main():
        exp = await fs.root_fh()
        for n in ("a", "b", "c"):
            await fs.mkdir(exp, n)
        ok = await readdir(fs, exp)
        es = entries_of(ok)
        assert [e.name for e in es] == [b"a", b"b", b"c"] and ok.reply.eof
        # resume after the first entry
        ok = await readdir(fs, exp, cookie=es[0].cookie, verf=ok.cookieverf)
        assert [e.name for e in entries_of(ok)] == [b"b", b"c"]
        # dircount small: one entry per reply, not eof
        ok = await readdir(fs, exp, dircount=1)
        assert len(entries_of(ok)) == 1 and not ok.reply.eof
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)),
                                (OP_READDIR, READDIR4args(0, bytes(8), 0, 40, [2]))]) == NFS4ERR_TOOSMALL
        # a reply with room for exactly the header and no entry of an empty dir: fine
        empty = await fs.mkdir(exp, "empty")
        ok = await readdir(fs, empty, maxcount=64)
        assert entries_of(ok) == [] and ok.reply.eof
        for cookie, status in ((1, NFS4ERR_BAD_COOKIE), (2, NFS4ERR_BAD_COOKIE)):
            assert await fs.status([(OP_PUTFH, PUTFH4args(exp)),
                                    (OP_READDIR, READDIR4args(cookie, bytes(8), 0, 4096, []))]) == status
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)),
                                (OP_READDIR, READDIR4args(es[0].cookie, b"x" * 8, 0, 4096, []))]) == NFS4ERR_NOT_SAME
        f, sid, _ = await fs.open(exp, "file")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)),
                                (OP_READDIR, READDIR4args(0, bytes(8), 0, 4096, []))]) == NFS4ERR_NOTDIR
        # no read permission on the directory
        bob = fs.as_user(1001)
        await fs.run([(OP_PUTFH, PUTFH4args(empty)), (OP_SETATTR, SETATTR4args(stateid4(0, bytes(12)),
                      attrs_of({FATTR4_MODE: 0o711})))])
        assert await bob.status([(OP_PUTFH, PUTFH4args(empty)),
                                 (OP_READDIR, READDIR4args(0, bytes(8), 0, 4096, []))]) == NFS4ERR_ACCESS
    run(main())


def test_pseudo_root_readdir(fs):
    async def main():
        root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        ok = await readdir(fs, root, attrs=(FATTR4_FILEID, FATTR4_MOUNTED_ON_FILEID, FATTR4_FSID,
                                            FATTR4_RDATTR_ERROR))
        (e,) = entries_of(ok)
        a = parse_attrs(e.attrs)
        assert e.name == b"checkpoints" and a[FATTR4_FSID] == fsid4(1, 0)
        assert a[FATTR4_FILEID] == 1 and a[FATTR4_MOUNTED_ON_FILEID] != 1
        assert a[FATTR4_RDATTR_ERROR] == NFS4_OK
        # a client outside the export's networks does not see it
        outsider = fs.as_user(0, ip="10.9.9.9")
        ok = await readdir(outsider, root)
        assert entries_of(ok) == [] and ok.reply.eof
    run(main())
