"""LOCK LOCKT LOCKU: POSIX byte-range locks, lock stateids for I/O, FREE_STATEID."""
import asyncio

import pytest

from testkit.ops_harness import make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403

TO_END = 0xFFFFFFFFFFFFFFFF


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


def new_lock(fs, open_sid, owner, locktype=WRITE_LT, offset=0, length=TO_END):
    return LOCK4args(locktype, False, offset, length, locker4(True, open_to_lock_owner4(
        0, open_sid, 0, lock_owner4(fs.client.clientid, owner))))


def more_lock(lock_sid, locktype=WRITE_LT, offset=0, length=TO_END):
    return LOCK4args(locktype, False, offset, length, locker4(False, exist_lock_owner4(lock_sid, 0)))


async def do(fs, fh, *ops):
    return await fs.run([(OP_PUTFH, PUTFH4args(fh))] + list(ops))


def test_lock_conflicts_between_owners(fs):
    async def main():
        exp = await fs.root_fh()
        f, s1, _ = await fs.open(exp, "f", owner=b"p1")
        _, s2, _ = await fs.open(exp, "f", owner=b"p2")
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s1, b"lk1", WRITE_LT, 0, 100)))
        l1 = res[1].value.lock_stateid
        assert l1.seqid == 1
        # another owner: overlapping write lock denied with the holder's range
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)), (OP_LOCK, new_lock(fs, s2, b"lk2", READ_LT, 50, 10))])
        assert res[1].tag == NFS4ERR_DENIED
        d = res[1].value
        assert (d.offset, d.length, d.locktype, d.owner.owner) == (0, 100, WRITE_LT, b"lk1")
        res = await do(fs, f, (OP_LOCKT, LOCKT4args(READ_LT, 99, 1, lock_owner4(fs.client.clientid, b"lk2"))))
        assert res[1].tag == NFS4ERR_DENIED
        # the owner itself never conflicts; a disjoint range is fine
        res = await do(fs, f, (OP_LOCKT, LOCKT4args(WRITE_LT, 0, 10, lock_owner4(fs.client.clientid, b"lk1"))))
        assert res[1].tag == NFS4_OK
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s2, b"lk2", WRITE_LT, 100, TO_END)))
        l2 = res[1].value.lock_stateid
        # unlock the middle of lk1's range: [0,40) and [60,100) stay locked
        res = await do(fs, f, (OP_LOCKU, LOCKU4args(WRITE_LT, 0, l1, 40, 20)))
        l1 = res[1].value
        assert l1.seqid == 2
        res = await do(fs, f, (OP_LOCK, more_lock(l2, READ_LT, 45, 10)))
        assert res[1].tag == NFS4_OK
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)),
                                (OP_LOCK, more_lock(l2, READ_LT, 45, 10))]) == NFS4ERR_OLD_STATEID
        l2 = res[1].value.lock_stateid
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)), (OP_LOCK, more_lock(l2, READ_LT, 30, 20))])
        assert res[1].tag == NFS4ERR_DENIED and res[1].value.offset == 0 and res[1].value.length == 40
        # read locks share
        res = await do(fs, f, (OP_LOCK, more_lock(l1, READ_LT, 1000, 10)))
        assert res[1].tag == NFS4ERR_DENIED             # l2 holds a write lock to the end
    run(main())


def test_lock_stateids_for_io_free_and_close(fs):
    async def main():
        exp = await fs.root_fh()
        f, s1, _ = await fs.open(exp, "f")
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s1, b"lk")))
        lsid = res[1].value.lock_stateid
        await fs.write(f, lsid, 0, b"locked write")
        assert await fs.read(f, lsid, 0, 6) == (b"locked", False)
        res = await fs.run([(OP_TEST_STATEID, TEST_STATEID4args([lsid]))])
        assert res[0].value.tsr_status_codes == [NFS4_OK]
        assert await fs.status([(OP_FREE_STATEID, FREE_STATEID4args(lsid))]) == NFS4ERR_LOCKS_HELD
        # a lock stateid is not an open stateid
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_CLOSE, CLOSE4args(0, lsid))]) == NFS4ERR_BAD_STATEID
        res = await do(fs, f, (OP_LOCKU, LOCKU4args(WRITE_LT, 0, stateid4(0, lsid.other), 0, TO_END)))
        await fs.run([(OP_FREE_STATEID, FREE_STATEID4args(stateid4(0, lsid.other)))])
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_READ, READ4args(lsid, 0, 1))]) == NFS4ERR_BAD_STATEID
        # CLOSE releases what is still locked
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s1, b"lk2")))
        await fs.close(f, s1)
        f2, s2, _ = await fs.open(exp, "f", owner=b"other")
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s2, b"lk3")))
        assert res[1].tag == NFS4_OK
    run(main())


def test_lock_errors(fs):
    async def main():
        exp = await fs.root_fh()
        f, s1, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_READ)
        for args, status in ((new_lock(fs, s1, b"l", WRITE_LT), NFS4ERR_OPENMODE),
                             (new_lock(fs, s1, b"l", READ_LT, 0, 0), NFS4ERR_INVAL),
                             (new_lock(fs, s1, b"l", READ_LT, TO_END - 5, 10), NFS4ERR_INVAL),
                             (new_lock(fs, stateid4(1, b"x" * 12), b"l", READ_LT), NFS4ERR_BAD_STATEID),
                             (LOCK4args(READ_LT, True, 0, 1, locker4(True, open_to_lock_owner4(
                                 0, s1, 0, lock_owner4(0, b"l")))), NFS4ERR_NO_GRACE)):
            assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_LOCK, args)]) == status
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_LOCK, new_lock(fs, s1, b"l", READ_LT))]) == NFS4ERR_ISDIR
        res = await do(fs, f, (OP_LOCK, new_lock(fs, s1, b"l", READW_LT, 0, 10)))
        assert res[1].tag == NFS4_OK
        # client expiry drops locks with the opens
        fs.server.opens.drop_client(fs.client)
        assert len(fs.server.opens._locks) == 0
    run(main())
