"""RFC 8276 xattrs (nfsd/ops/xattr.py): a file's upload state and a directory's pending
counts, read-only, on the ops harness over a real Store (minor version 2), then once through
the wire (the compound client, native codec) and the minor-version rule."""
from __future__ import annotations

import asyncio

import pytest

from cache.api import DataState, RemoteInfo
from nfsd.ops.xattr import XATTR_NAME_MAX
from nfsd.xdr.nfs4 import *  # noqa: F401,F403
from testkit.nfsclient import op
from testkit.ops_harness import Failed, make_fs

XA_ALL = ACCESS4_XAREAD | ACCESS4_XAWRITE | ACCESS4_XALIST


def fs42(tmp_path, **kw):
    fs, store = make_fs(tmp_path, **kw)
    fs.minorversion = 2
    return fs, store


def getx(fh, name):
    return [(OP_PUTFH, PUTFH4args(fh)), (OP_GETXATTR, GETXATTR4args(name))]


def listx(fh, cookie=0, maxcount=4096):
    return [(OP_PUTFH, PUTFH4args(fh)), (OP_LISTXATTRS, LISTXATTRS4args(cookie, maxcount))]


async def value(fs, fh, name) -> bytes:
    return bytes((await fs.run(getx(fh, name)))[1].value)


async def names(fs, fh, cookie=0, maxcount=4096):
    ok = (await fs.run(listx(fh, cookie, maxcount)))[1].value
    return [bytes(n) for n in ok.lxr_names], ok.lxr_cookie, ok.lxr_eof


async def saved_file(fs, root, name, data=b"x" * 100):
    fh, sid, _ = await fs.open(root, name)
    await fs.write(fh, sid, 0, data, FILE_SYNC4)
    await fs.close(fh, sid)
    return fh


def upload(store, ino, key, version=None):
    """What the uploader leaves behind (commit_settled, then the object recorded)."""
    store.commit_settled(ino)
    a = store.getattr(ino)
    assert store.mark_uploaded(ino, RemoteInfo(key=key, etag='"e1"', checksum="crc32:AAAAAA==",
                                               version_id=version, size=a.size,
                                               uploaded_change=a.change))


def test_file_state_moves_from_dirty_to_in_s3_with_its_object(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        fh = await saved_file(fs, root, "step1.pt")
        ino = (await fs.getattr(fh, FATTR4_FILEID))[FATTR4_FILEID]
        assert await value(fs, fh, b"ckptgw.state") == b"dirty"
        assert (await names(fs, fh)) == ([b"ckptgw.state"], 1, True)
        for absent in (b"ckptgw.key", b"ckptgw.etag", b"ckptgw.pending_files", b"other", b"user.x"):
            with pytest.raises(Failed) as e:
                await fs.run(getx(fh, absent))
            assert e.value.status == NFS4ERR_NOXATTR, absent
        store.set_data_state(ino, DataState.UPLOADING)
        assert await value(fs, fh, b"ckptgw.state") == b"uploading"
        upload(store, ino, "runs/step1.pt", version="v7")
        assert await value(fs, fh, b"ckptgw.state") == b"in_s3"
        assert await value(fs, fh, b"ckptgw.key") == b"runs/step1.pt"
        assert await value(fs, fh, b"ckptgw.etag") == b'"e1"'
        assert await value(fs, fh, b"ckptgw.version") == b"v7"
        assert await value(fs, fh, b"ckptgw.checksum") == b"crc32:AAAAAA=="
        assert (await names(fs, fh))[0] == [b"ckptgw.state", b"ckptgw.key", b"ckptgw.etag",
                                            b"ckptgw.version", b"ckptgw.checksum"]
        # a fresh-read alias (the Linux client caches values by name): same value, not listed
        assert await value(fs, fh, b"ckptgw.state.p17") == b"in_s3"
        for bad in (b"ckptgw.state.", b"ckptgw.state.a/b", b"ckptgw.state." + b"a" * 33,
                    b"ckptgw.nope.x"):
            with pytest.raises(Failed) as e:
                await fs.run(getx(fh, bad))
            assert e.value.status == NFS4ERR_NOXATTR, bad
        # a new write: dirty again, and the old object's etag is not shown as if current
        _, sid, _ = await fs.open(root, "step1.pt", create=False)
        await fs.write(fh, sid, 0, b"y", FILE_SYNC4)
        await fs.close(fh, sid)
        assert await value(fs, fh, b"ckptgw.state") == b"dirty"
        assert (await names(fs, fh))[0] == [b"ckptgw.state"]
    asyncio.run(body())


def test_directory_counts_what_is_not_in_s3_below_it(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        run = await fs.mkdir(root, "run")
        sub = await fs.mkdir(run, "shards")
        a = await saved_file(fs, run, "a.pt", b"a" * 10)
        await saved_file(fs, sub, "b.pt", b"b" * 1000)
        assert await value(fs, run, b"ckptgw.pending_files") == b"2"
        assert await value(fs, run, b"ckptgw.pending_bytes") == b"1010"
        assert await value(fs, sub, b"ckptgw.pending_files") == b"1"
        assert (await names(fs, run))[0] == [b"ckptgw.pending_files", b"ckptgw.pending_bytes"]
        with pytest.raises(Failed) as e:
            await fs.run(getx(run, b"ckptgw.state"))
        assert e.value.status == NFS4ERR_NOXATTR
        upload(store, (await fs.getattr(a, FATTR4_FILEID))[FATTR4_FILEID], "run/a.pt")
        assert await value(fs, run, b"ckptgw.pending_files.n1") == b"1"
        assert await value(fs, run, b"ckptgw.pending_bytes") == b"1000"
        # the walk runs off the event loop
        assert "pending_below" in fs.server.blocking_calls
    asyncio.run(body())


def test_directory_walks_are_one_at_a_time_shared_and_never_older_than_the_request(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        run = await fs.mkdir(root, "run")
        await saved_file(fs, run, "a.pt")
        fs.server.blocking_calls.clear()
        got = await asyncio.gather(*(value(fs, run, b"ckptgw.pending_files") for _ in range(20)))
        assert got == [b"1"] * 20
        walks = fs.server.blocking_calls.count("pending_below")
        assert 1 <= walks <= 2, walks          # the first, and one shared by all that queued
        # a file saved after the last walk is counted: no answer older than the request
        await saved_file(fs, run, "b.pt")
        assert await value(fs, run, b"ckptgw.pending_files") == b"2"
    asyncio.run(body())


def test_listxattrs_cookie_and_maxcount_are_bounded(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        fh = await saved_file(fs, root, "f")
        upload(store, (await fs.getattr(fh, FATTR4_FILEID))[FATTR4_FILEID], "f")
        every, _, _ = await names(fs, fh)
        assert len(every) == 4                     # no version on an unversioned bucket
        # room for the overhead (16) and one name (4 + 12): one at a time, cookies chain
        got, cookie, eof = [], 0, False
        while not eof:
            part, cookie, eof = await names(fs, fh, cookie, 16 + 4 + 16)
            assert len(part) == 1
            got += part
        assert got == every
        with pytest.raises(Failed) as e:           # not even one name fits
            await fs.run(listx(fh, 0, 20))
        assert e.value.status == NFS4ERR_TOOSMALL
        assert (await names(fs, fh, cookie=4)) == ([], 4, True)
        with pytest.raises(Failed) as e:
            await fs.run(listx(fh, cookie=5))
        assert e.value.status == NFS4ERR_BAD_COOKIE
        with pytest.raises(Failed) as e:
            await fs.run(listx(fh, cookie=2 ** 64 - 1))
        assert e.value.status == NFS4ERR_BAD_COOKIE
    asyncio.run(body())


def test_writes_are_refused_and_names_bounded(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        fh = await saved_file(fs, root, "f")
        for opnum, args in ((OP_SETXATTR, SETXATTR4args(SETXATTR4_EITHER, b"ckptgw.state", b"in_s3")),
                            (OP_SETXATTR, SETXATTR4args(SETXATTR4_CREATE, b"mine", b"v")),
                            (OP_REMOVEXATTR, REMOVEXATTR4args(b"ckptgw.state"))):
            with pytest.raises(Failed) as e:
                await fs.run([(OP_PUTFH, PUTFH4args(fh)), (opnum, args)])
            assert e.value.status == NFS4ERR_ACCESS
        assert await value(fs, fh, b"ckptgw.state") == b"dirty"
        long = b"ckptgw.state." + b"a" * XATTR_NAME_MAX
        for ops in (getx(fh, long), [(OP_PUTFH, PUTFH4args(fh)),
                                     (OP_SETXATTR, SETXATTR4args(SETXATTR4_EITHER, long, b""))]):
            with pytest.raises(Failed) as e:
                await fs.run(ops)
            assert e.value.status == NFS4ERR_NAMETOOLONG
        with pytest.raises(Failed) as e:
            await fs.run(getx(fh, b""))
        assert e.value.status == NFS4ERR_INVAL
    asyncio.run(body())


def test_access_grants_xattr_read_and_list_never_write(tmp_path):
    fs, store = fs42(tmp_path)

    async def access(fs, fh, bits):
        res = await fs.run([(OP_PUTFH, PUTFH4args(fh)), (OP_ACCESS, ACCESS4args(bits))])
        return res[1].value.supported, res[1].value.access

    async def body():
        root = await fs.root_fh()
        fh = await saved_file(fs, root, "f")
        assert await access(fs, fh, XA_ALL | ACCESS4_READ) == (
            XA_ALL | ACCESS4_READ, ACCESS4_XAREAD | ACCESS4_XALIST | ACCESS4_READ)
        assert await access(fs, root, XA_ALL) == (XA_ALL, ACCESS4_XAREAD | ACCESS4_XALIST)
        # who may not read the file may not read its xattrs either
        fh2, sid, _ = await fs.open(root, "private", mode=0o600)
        await fs.close(fh2, sid)
        other = fs.as_user(1000)
        other.minorversion = 2
        assert await access(other, fh2, XA_ALL) == (XA_ALL, 0)
        with pytest.raises(Failed) as e:
            await other.run(getx(fh2, b"ckptgw.state"))
        assert e.value.status == NFS4ERR_ACCESS
        # 4.1 knows nothing of these bits: neither supported nor granted
        fs.minorversion = 1
        assert await access(fs, fh, XA_ALL) == (0, 0)
    asyncio.run(body())


def test_xattr_support_attribute(tmp_path):
    fs, store = fs42(tmp_path)

    async def body():
        root = await fs.root_fh()
        fh = await saved_file(fs, root, "f")
        assert (await fs.getattr(fh, FATTR4_XATTR_SUPPORT))[FATTR4_XATTR_SUPPORT] is True
        assert (await fs.getattr(root, FATTR4_XATTR_SUPPORT))[FATTR4_XATTR_SUPPORT] is True
        pseudo = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        assert (await fs.getattr(pseudo, FATTR4_XATTR_SUPPORT))[FATTR4_XATTR_SUPPORT] is False
        # not a 4.1 attribute
        fs.minorversion = 1
        assert FATTR4_XATTR_SUPPORT not in await fs.getattr(fh, FATTR4_XATTR_SUPPORT)
    asyncio.run(body())


def test_through_the_wire_in_4_2_and_illegal_before(nfs_client):
    """Encoded and decoded by the server's codec (native when built) and the test client's."""
    async def body(c):
        exp = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(exp, "wire")
        await c.write(fh, sid, 0, b"abc", FILE_SYNC4)
        await c.close_file(fh, sid)
        res = await c.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                op(OP_GETXATTR, GETXATTR4args(b"ckptgw.state")),
                                op(OP_LISTXATTRS, LISTXATTRS4args(0, 1024))])
        assert res.status == NFS4_OK
        assert bytes(res.resarray[1].value.value) == b"dirty"
        assert [bytes(n) for n in res.resarray[2].value.value.lxr_names] == [b"ckptgw.state"]
        res = await c.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                op(OP_SETXATTR, SETXATTR4args(SETXATTR4_EITHER, b"ckptgw.state", b"x"))])
        assert res.status == NFS4ERR_ACCESS
    nfs_client(body, minorversion=2)

    async def body41(c):
        exp = await c.lookup_path("/checkpoints")
        res = await c.compound([op(OP_PUTFH, PUTFH4args(exp)),
                                op(OP_GETXATTR, GETXATTR4args(b"ckptgw.state"))])
        assert res.status == NFS4ERR_OP_ILLEGAL
    nfs_client(body41)
