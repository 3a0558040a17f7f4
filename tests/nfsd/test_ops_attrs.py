"""GETATTR SETATTR ACCESS VERIFY NVERIFY and the fattr4 table."""
import asyncio

import pytest

from nfsd import attrs as fattr
from testkit.ops_harness import Fs, attrs_of, bitmap_of, make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


ANON = stateid4(0, bytes(12))


def setattr_ops(fh, values, sid=ANON):
    return [(OP_PUTFH, PUTFH4args(fh)), (OP_SETATTR, SETATTR4args(sid, attrs_of(values)))]


def test_bitmap_helpers():
    assert fattr.bits_of([0b101, 1 << 1]) == [0, 2, 33]
    assert fattr.bitmap_of([0, 2, 33]) == [0b101, 2]
    assert fattr.bitmap_of([]) == []


def test_getattr_all_supported(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "f", mode=0o640)
        await fs.write(f, sid, 0, b"x" * 100)
        a = await fs.getattr(f, *sorted(fattr.SUPPORTED_IN[fs.minorversion] - fattr.WRITE_ONLY))
        assert a[FATTR4_TYPE] == NF4REG and a[FATTR4_SIZE] == 100 and a[FATTR4_MODE] == 0o640
        assert a[FATTR4_FH_EXPIRE_TYPE] == FH4_PERSISTENT
        assert a[FATTR4_FILEHANDLE] == f
        assert a[FATTR4_OWNER] == b"0" and a[FATTR4_OWNER_GROUP] == b"0"
        assert a[FATTR4_MAXREAD] == a[FATTR4_MAXWRITE] == 1 << 20
        assert a[FATTR4_MAXNAME] == 255 and a[FATTR4_LEASE_TIME] == 90
        assert a[FATTR4_FSID] == fsid4(1, 0)
        assert a[FATTR4_NAMED_ATTR] is False and a[FATTR4_CASE_INSENSITIVE] is False
        assert a[FATTR4_SPACE_TOTAL] > 0 and a[FATTR4_FILES_TOTAL] > 0
        assert a[FATTR4_MOUNTED_ON_FILEID] == a[FATTR4_FILEID]
        assert set(fattr.bits_of(a[FATTR4_SUPPORTED_ATTRS])) == set(fattr.SUPPORTED_IN[fs.minorversion])
        assert FATTR4_MODE in fattr.bits_of(a[FATTR4_SUPPATTR_EXCLCREAT])
        # change is monotonic
        c1 = a[FATTR4_CHANGE]
        await fs.write(f, sid, 100, b"y")
        assert (await fs.getattr(f, FATTR4_CHANGE))[FATTR4_CHANGE] > c1
        # unsupported attributes are left out, write-only ones are INVAL
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)), (OP_GETATTR, GETATTR4args(bitmap_of([FATTR4_ACL, FATTR4_SIZE])))])
        assert fattr.bits_of(res[1].value.obj_attributes.attrmask) == [FATTR4_SIZE]
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)),
                                (OP_GETATTR, GETATTR4args(bitmap_of([FATTR4_TIME_MODIFY_SET])))]) == NFS4ERR_INVAL
        # pseudo root attributes
        root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        r = await fs.getattr(root, FATTR4_TYPE, FATTR4_MODE, FATTR4_FSID, FATTR4_FILEID)
        assert r[FATTR4_TYPE] == NF4DIR and r[FATTR4_MODE] == 0o555 and r[FATTR4_FSID] != fsid4(1, 0)
    run(main())


def test_supported_attrs_per_minor_version(fs):
    """A 4.0 client sees only RFC 7530's attributes (0-55) in supported_attrs; an attribute
    a later minor version defined (suppattr_exclcreat, 75) is unsupported to it: GETATTR
    leaves it out, VERIFY and SETATTR answer NFS4ERR_ATTRNOTSUPP."""
    async def main():
        exp = await fs.root_fh()
        f, _, _ = await fs.open(exp, "f", mode=0o640)
        v40 = Fs(fs.server, minorversion=0)
        v41 = Fs(fs.server, minorversion=1)
        seen40 = set(fattr.bits_of((await v40.getattr(f, FATTR4_SUPPORTED_ATTRS))[FATTR4_SUPPORTED_ATTRS]))
        seen41 = set(fattr.bits_of((await v41.getattr(f, FATTR4_SUPPORTED_ATTRS))[FATTR4_SUPPORTED_ATTRS]))
        assert max(seen40) <= FATTR4_MOUNTED_ON_FILEID and FATTR4_MODE in seen40
        assert seen41 == seen40 | {FATTR4_SUPPATTR_EXCLCREAT}
        assert await v40.getattr(f, FATTR4_SUPPATTR_EXCLCREAT, FATTR4_SIZE) == {FATTR4_SIZE: 0}
        assert FATTR4_SUPPATTR_EXCLCREAT in await v41.getattr(f, FATTR4_SUPPATTR_EXCLCREAT)
        excl = attrs_of({FATTR4_SUPPATTR_EXCLCREAT: fattr.EXCLCREAT_BITMAP})
        verify = [(OP_PUTFH, PUTFH4args(f)), (OP_VERIFY, VERIFY4args(excl))]
        assert await v40.status(verify) == NFS4ERR_ATTRNOTSUPP
        assert await v41.status(verify) == NFS4_OK
        assert await v40.status([(OP_PUTFH, PUTFH4args(f)),
                                 (OP_SETATTR, SETATTR4args(ANON, excl))]) == NFS4ERR_ATTRNOTSUPP
    run(main())


def test_setattr_mode_owner_times_size(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "f")
        await fs.write(f, sid, 0, b"0123456789")
        fs.server.blocking_calls.clear()
        res = await fs.run(setattr_ops(f, {FATTR4_MODE: 0o600, FATTR4_OWNER: b"1000",
                                           FATTR4_OWNER_GROUP: b"2000"}))
        # its txn fdatasyncs: applied by the store's batch committer, which the loop
        # awaits without a worker thread; durable once the reply is there
        assert fs.server.blocking_calls == []
        assert fs.server.store.durable()
        assert fattr.bits_of(res[1].attrsset) == [FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP]
        a = await fs.getattr(f, FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP)
        assert a == {FATTR4_MODE: 0o600, FATTR4_OWNER: b"1000", FATTR4_OWNER_GROUP: b"2000"}
        await fs.run(setattr_ops(f, {FATTR4_SIZE: 4}, sid))
        assert (await fs.read(f, sid, 0, 100)) == (b"0123", True)
        when = nfstime4(1_600_000_000, 123)
        await fs.run(setattr_ops(f, {FATTR4_TIME_MODIFY_SET: settime4(SET_TO_CLIENT_TIME4, when),
                                     FATTR4_TIME_ACCESS_SET: settime4(SET_TO_SERVER_TIME4)}))
        a = await fs.getattr(f, FATTR4_TIME_MODIFY, FATTR4_TIME_ACCESS)
        assert a[FATTR4_TIME_MODIFY] == when and a[FATTR4_TIME_ACCESS].seconds > 1_700_000_000
        # errors
        assert await fs.status(setattr_ops(f, {FATTR4_OWNER: b"no-such-user@nowhere"})) == NFS4ERR_BADOWNER
        assert await fs.status(setattr_ops(f, {FATTR4_OWNER: b"nosuchuser-xyz"})) == NFS4ERR_BADOWNER
        assert await fs.status(setattr_ops(f, {FATTR4_OWNER: b""})) == NFS4ERR_INVAL
        assert await fs.status(setattr_ops(f, {FATTR4_OWNER_GROUP: b""})) == NFS4ERR_INVAL
        assert await fs.status(setattr_ops(f, {FATTR4_FILEID: 3})) == NFS4ERR_INVAL
        bad = fattr4(attrmask=bitmap_of([FATTR4_ACL]), attr_vals=b"\0\0\0\0")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_SETATTR, SETATTR4args(ANON, bad))]) == NFS4ERR_ATTRNOTSUPP
        short = fattr4(attrmask=bitmap_of([FATTR4_SIZE]), attr_vals=b"\0\0")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_SETATTR, SETATTR4args(ANON, short))]) == NFS4ERR_BADXDR
        assert await fs.status(setattr_ops(f, {FATTR4_MODE: 0o170000})) == NFS4ERR_INVAL
        assert await fs.status(setattr_ops(exp, {FATTR4_SIZE: 0})) == NFS4ERR_ISDIR
        bogus = stateid4(1, b"q" * 12)
        assert await fs.status(setattr_ops(f, {FATTR4_SIZE: 0}, bogus)) == NFS4ERR_BAD_STATEID
        root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        assert await fs.status(setattr_ops(root, {FATTR4_MODE: 0o777})) == NFS4ERR_ROFS
    run(main())


def test_setattr_permissions_as_other_users(fs):
    async def main():
        exp = await fs.root_fh()
        await fs.run(setattr_ops(exp, {FATTR4_MODE: 0o777}))
        alice = fs.as_user(1000, 1000, gids=(1000, 50))
        bob = fs.as_user(1001, 1001)
        f, sid, _ = await alice.open(exp, "a", mode=0o644)
        assert (await alice.getattr(f, FATTR4_OWNER))[FATTR4_OWNER] == b"1000"
        assert await bob.status(setattr_ops(f, {FATTR4_MODE: 0o777})) == NFS4ERR_PERM
        assert await bob.status(setattr_ops(f, {FATTR4_SIZE: 0})) == NFS4ERR_ACCESS
        assert await alice.status(setattr_ops(f, {FATTR4_OWNER: b"1001"})) == NFS4ERR_PERM
        assert await alice.status(setattr_ops(f, {FATTR4_OWNER_GROUP: b"1001"})) == NFS4ERR_PERM
        await alice.run(setattr_ops(f, {FATTR4_OWNER_GROUP: b"50"}))       # a group alice is in
        assert await bob.status(setattr_ops(f, {FATTR4_TIME_MODIFY_SET: settime4(SET_TO_CLIENT_TIME4, nfstime4(1, 0))})) == NFS4ERR_PERM
        assert await bob.status(setattr_ops(f, {FATTR4_TIME_MODIFY_SET: settime4(SET_TO_SERVER_TIME4)})) == NFS4ERR_ACCESS
        await fs.run(setattr_ops(f, {FATTR4_MODE: 0o666}))                  # root may
        await bob.run(setattr_ops(f, {FATTR4_TIME_MODIFY_SET: settime4(SET_TO_SERVER_TIME4)}))
        await bob.run(setattr_ops(f, {FATTR4_SIZE: 1}))
    run(main())


def test_access(fs):
    async def main():
        exp = await fs.root_fh()
        await fs.run(setattr_ops(exp, {FATTR4_MODE: 0o755}))
        f, sid, _ = await fs.open(exp, "f", mode=0o640)
        await fs.run(setattr_ops(f, {FATTR4_OWNER_GROUP: b"50"}))
        ALL = ACCESS4_READ | ACCESS4_LOOKUP | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE | ACCESS4_EXECUTE

        async def access(who, fh):
            res = await who.run([(OP_PUTFH, PUTFH4args(fh)), (OP_ACCESS, ACCESS4args(ALL))])
            return res[1].value.supported, res[1].value.access
        FILE_BITS = ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_EXECUTE
        DIR_BITS = ACCESS4_READ | ACCESS4_LOOKUP | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
        assert await access(fs, f) == (FILE_BITS, ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND)
        assert await access(fs.as_user(7, 7, gids=(50,)), f) == (FILE_BITS, ACCESS4_READ)
        assert await access(fs.as_user(8, 8), f) == (FILE_BITS, 0)
        assert await access(fs, exp) == (DIR_BITS, DIR_BITS)
        assert await access(fs.as_user(8, 8), exp) == (DIR_BITS, ACCESS4_READ | ACCESS4_LOOKUP)
        root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        assert await access(fs, root) == (DIR_BITS, ACCESS4_READ | ACCESS4_LOOKUP)
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_ACCESS, ACCESS4args(0x10000))]) == NFS4ERR_INVAL
    run(main())


def test_verify_nverify(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "f")
        await fs.write(f, sid, 0, b"abc")
        same = attrs_of({FATTR4_SIZE: 3, FATTR4_TYPE: NF4REG})
        differ = attrs_of({FATTR4_SIZE: 4})
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_VERIFY, VERIFY4args(same))]) == NFS4_OK
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_VERIFY, VERIFY4args(differ))]) == NFS4ERR_NOT_SAME
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_NVERIFY, NVERIFY4args(same))]) == NFS4ERR_SAME
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_NVERIFY, NVERIFY4args(differ))]) == NFS4_OK
        bad = fattr4(attrmask=bitmap_of([FATTR4_ACL]), attr_vals=b"\0\0\0\0")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_VERIFY, VERIFY4args(bad))]) == NFS4ERR_ATTRNOTSUPP
        rderr = attrs_of({FATTR4_RDATTR_ERROR: 0})
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_VERIFY, VERIFY4args(rderr))]) == NFS4ERR_INVAL
    run(main())


def test_owner_names_with_domain(tmp_path):
    from nfsd.exports import IdMapper
    m = IdMapper("example.org", reply_names=True)
    assert m.owner(0) == b"root@example.org"
    assert m.uid_of(b"root@EXAMPLE.org") == 0 and m.uid_of(b"0") == 0
    assert m.uid_of(b"root@other.org") is None and m.uid_of(b"") is None
    assert m.gid_of(b"root@example.org") == 0
    assert m.owner(4_000_000) == b"4000000"                 # no name: numeric
    plain = IdMapper()
    assert plain.owner(0) == b"0" and plain.uid_of(b"root") == 0 and plain.uid_of(b"root@x") is None
