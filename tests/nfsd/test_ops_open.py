"""OPEN (create modes, claims, share reservations) OPEN_DOWNGRADE CLOSE DELEGRETURN
TEST_STATEID FREE_STATEID and stateid checking."""
import asyncio

import pytest

from testkit.ops_harness import Failed, attrs_of, make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


def open_args(fs, name, how=None, access=OPEN4_SHARE_ACCESS_BOTH, deny=OPEN4_SHARE_DENY_NONE,
              owner=b"o1", claim=None):
    openhow = openflag4(OPEN4_CREATE, how) if how is not None else openflag4(OPEN4_NOCREATE)
    return OPEN4args(seqid=0, share_access=access, share_deny=deny, owner=fs.owner(owner),
                     openhow=openhow, claim=claim or open_claim4(CLAIM_NULL, name))


def test_open_create_modes(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, ok = await fs.open(exp, "u", mode=0o600)
        assert ok.rflags & OPEN4_RESULT_LOCKTYPE_POSIX
        assert ok.delegation.tag == OPEN_DELEGATE_NONE
        assert ok.cinfo.after > ok.cinfo.before
        assert (await fs.getattr(f, FATTR4_MODE))[FATTR4_MODE] == 0o600
        await fs.write(f, sid, 0, b"abc")
        await fs.close(f, sid)
        # UNCHECKED4 over an existing file opens it unchanged; with size 0 it truncates
        f2, sid2, _ = await fs.open(exp, "u", mode=0o644)
        assert f2 == f and (await fs.getattr(f, FATTR4_MODE, FATTR4_SIZE)) == {FATTR4_MODE: 0o600, FATTR4_SIZE: 3}
        await fs.close(f2, sid2)
        how = createhow4(UNCHECKED4, attrs_of({FATTR4_SIZE: 0}))
        f3, sid3, _ = await fs.open(exp, "u", how=how)
        assert (await fs.getattr(f, FATTR4_SIZE))[FATTR4_SIZE] == 0
        await fs.close(f3, sid3)
        # GUARDED4: EXIST
        with pytest.raises(Failed) as e:
            await fs.open(exp, "u", how=createhow4(GUARDED4, attrs_of({FATTR4_MODE: 0o644})))
        assert e.value.status == NFS4ERR_EXIST
        g, gs, _ = await fs.open(exp, "g", how=createhow4(GUARDED4, attrs_of({FATTR4_MODE: 0o640})))
        assert (await fs.getattr(g, FATTR4_MODE))[FATTR4_MODE] == 0o640
        # NOCREATE of a missing name, of a directory, of a symlink
        await fs.mkdir(exp, "dir")
        for name, status in ((b"missing", NFS4ERR_NOENT), (b"dir", NFS4ERR_ISDIR)):
            assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_OPEN, open_args(fs, name))]) == status
        await fs.run([(OP_PUTFH, PUTFH4args(exp)),
                      (OP_CREATE, CREATE4args(createtype4(NF4LNK, b"u"), b"ln", fattr4([], b"")))])
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_OPEN, open_args(fs, b"ln"))]) == NFS4ERR_SYMLINK
        # creating over a directory name
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)),
                                (OP_OPEN, open_args(fs, b"dir", createhow4(UNCHECKED4, fattr4([], b""))))]) == NFS4ERR_ISDIR
    run(main())


@pytest.mark.parametrize("mode", ["EXCLUSIVE4", "EXCLUSIVE4_1"])
def test_exclusive_create_retry_succeeds(fs, mode):
    async def main():
        exp = await fs.root_fh()
        verf = b"\x01\x02\x03\x04\x05\x06\x07\x08"
        if mode == "EXCLUSIVE4":
            how = createhow4(EXCLUSIVE4, verf)
        else:
            how = createhow4(EXCLUSIVE4_1, creatverfattr(verf, attrs_of({FATTR4_MODE: 0o600})))
        f, sid, ok = await fs.open(exp, "x", how=how)
        from nfsd.attrs import bits_of
        assert {FATTR4_TIME_ACCESS_SET, FATTR4_TIME_MODIFY_SET} <= set(bits_of(ok.attrset))
        # the retransmission (same verifier) succeeds with the same file
        f2, sid2, _ = await fs.open(exp, "x", how=how)
        assert f2 == f
        # another client's exclusive create (other verifier) fails
        other = createhow4(EXCLUSIVE4, b"\x09" * 8)
        with pytest.raises(Failed) as e:
            await fs.open(exp, "x", how=other)
        assert e.value.status == NFS4ERR_EXIST
        if mode == "EXCLUSIVE4_1":
            assert (await fs.getattr(f, FATTR4_MODE))[FATTR4_MODE] == 0o600
            bad = createhow4(EXCLUSIVE4_1, creatverfattr(verf, attrs_of({FATTR4_TIME_MODIFY_SET: settime4(SET_TO_SERVER_TIME4)})))
            with pytest.raises(Failed) as e:
                await fs.open(exp, "y", how=bad)
            assert e.value.status == NFS4ERR_INVAL
    run(main())


def test_claims(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "f")
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)),
                            (OP_OPEN, open_args(fs, None, owner=b"o2", access=OPEN4_SHARE_ACCESS_READ,
                                                claim=open_claim4(CLAIM_FH)))])
        assert res[1].value.stateid.other != sid.other
        for claim, status in ((open_claim4(CLAIM_PREVIOUS, OPEN_DELEGATE_NONE), NFS4ERR_NO_GRACE),
                              (open_claim4(CLAIM_DELEGATE_PREV, b"f"), NFS4ERR_NOTSUPP),
                              (open_claim4(CLAIM_DELEG_PREV_FH), NFS4ERR_NOTSUPP),
                              (open_claim4(CLAIM_DELEG_CUR_FH, stateid4(1, b"d" * 12)), NFS4ERR_BAD_STATEID)):
            assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_OPEN, open_args(fs, None, claim=claim))]) == status
        # bad share values
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_OPEN, open_args(fs, b"f", access=0))]) == NFS4ERR_INVAL
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_OPEN, open_args(fs, b"f", deny=4))]) == NFS4ERR_INVAL
        # 4.1 "want no delegation"
        res = await fs.run([(OP_PUTFH, PUTFH4args(exp)),
                            (OP_OPEN, open_args(fs, b"f", access=OPEN4_SHARE_ACCESS_READ | OPEN4_SHARE_ACCESS_WANT_NO_DELEG))])
        assert res[1].value.delegation.tag == OPEN_DELEGATE_NONE_EXT
        assert res[1].value.delegation.value.tag == WND4_NOT_WANTED
    run(main())


def test_upgrade_downgrade_close_and_seqids(fs):
    async def main():
        exp = await fs.root_fh()
        store = fs.server.store
        f, s1, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_READ)
        assert s1.seqid == 1
        f, s2, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_WRITE)
        assert s2.other == s1.other and s2.seqid == 2
        assert len(fs.server.opens) == 1
        # the old seqid is OLD, a future one BAD, seqid 0 means "current"
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_WRITE, WRITE4args(s1, 0, UNSTABLE4, b"x"))]) == NFS4ERR_OLD_STATEID
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)),
                                (OP_WRITE, WRITE4args(stateid4(9, s1.other), 0, UNSTABLE4, b"x"))]) == NFS4ERR_BAD_STATEID
        await fs.write(f, stateid4(0, s1.other), 0, b"x")
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)),
                            (OP_OPEN_DOWNGRADE, OPEN_DOWNGRADE4args(s2, 0, OPEN4_SHARE_ACCESS_READ, 0))])
        s3 = res[1].value.open_stateid
        assert s3.seqid == 3
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_WRITE, WRITE4args(s3, 0, UNSTABLE4, b"x"))]) == NFS4ERR_OPENMODE
        # downgrade to something not held
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)),
                                (OP_OPEN_DOWNGRADE, OPEN_DOWNGRADE4args(s3, 0, OPEN4_SHARE_ACCESS_BOTH, 0))]) == NFS4ERR_INVAL
        closed = await fs.close(f, s3)
        assert closed == stateid4(0xFFFFFFFF, bytes(12))
        assert len(fs.server.opens) == 0
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_CLOSE, CLOSE4args(0, s3))]) == NFS4ERR_BAD_STATEID
        # another file's stateid, another client's stateid
        g, gs, _ = await fs.open(exp, "g")
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_READ, READ4args(gs, 0, 1))]) == NFS4ERR_BAD_STATEID
        other = fs.as_user(0, clientid=99)
        assert await other.status([(OP_PUTFH, PUTFH4args(g)), (OP_READ, READ4args(gs, 0, 1))]) == NFS4ERR_BAD_STATEID
        # the current stateid (seqid 1, other 0) inside one COMPOUND
        cur = stateid4(1, bytes(12))
        res = await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_OPEN, open_args(fs, b"h", createhow4(UNCHECKED4, fattr4([], b"")))),
                            (OP_WRITE, WRITE4args(cur, 0, UNSTABLE4, b"cur")), (OP_CLOSE, CLOSE4args(0, cur))])
        assert res[2].value.count == 3
        # PUTFH clears the current stateid
        assert await fs.status([(OP_PUTFH, PUTFH4args(g)), (OP_READ, READ4args(cur, 0, 1))]) == NFS4ERR_BAD_STATEID
    run(main())


def test_share_deny(fs):
    async def main():
        exp = await fs.root_fh()
        f, s1, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_READ, deny=OPEN4_SHARE_DENY_WRITE)
        with pytest.raises(Failed) as e:
            await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_WRITE, owner=b"o2")
        assert e.value.status == NFS4ERR_SHARE_DENIED
        with pytest.raises(Failed) as e:
            await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_READ, deny=OPEN4_SHARE_DENY_READ, owner=b"o3")
        assert e.value.status == NFS4ERR_SHARE_DENIED
        # anonymous writes honour the deny, READ bypass reads anyway
        anon = stateid4(0, bytes(12))
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_WRITE, WRITE4args(anon, 0, UNSTABLE4, b"x"))]) == NFS4ERR_LOCKED
        await fs.read(f, stateid4(0xFFFFFFFF, b"\xff" * 12), 0, 10)
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_WRITE, WRITE4args(
            stateid4(0xFFFFFFFF, b"\xff" * 12), 0, UNSTABLE4, b"x"))]) == NFS4ERR_LOCKED
        await fs.close(f, s1)
        f, s2, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_WRITE, owner=b"o2")
    run(main())


def test_store_open_accounting_and_client_expiry(fs, monkeypatch):
    async def main():
        store = fs.server.store
        calls = []
        real_open, real_close = store.open_file, store.close_file
        monkeypatch.setattr(store, "open_file", lambda ino, w: (calls.append(("open", w)), real_open(ino, w)))
        monkeypatch.setattr(store, "close_file",
                            lambda ino, w, **kw: (calls.append(("close", w)), real_close(ino, w, **kw)))
        exp = await fs.root_fh()
        f, s, _ = await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_READ)
        await fs.open(exp, "f", access=OPEN4_SHARE_ACCESS_WRITE)
        assert calls == [("open", False), ("open", True), ("close", False)]
        g, gs, _ = await fs.open(exp, "g")
        assert fs.server.opens.has_state(fs.client) and not fs.server.opens.has_state(12345)
        fs.server.opens.drop_client(fs.client)
        assert not fs.server.opens.has_state(fs.client)
        assert len(fs.server.opens) == 0
        assert sorted(calls[3:]) == [("close", True), ("close", True), ("open", True)]
    run(main())


def test_test_stateid_free_stateid_delegreturn(fs):
    async def main():
        exp = await fs.root_fh()
        f, s, _ = await fs.open(exp, "f")
        bogus = stateid4(1, b"z" * 12)
        old = stateid4(0, s.other)
        res = await fs.run([(OP_TEST_STATEID, TEST_STATEID4args([s, bogus, stateid4(0, bytes(12)), old]))])
        assert res[0].value.tsr_status_codes == [NFS4_OK, NFS4ERR_BAD_STATEID, NFS4ERR_BAD_STATEID, NFS4_OK]
        assert await fs.status([(OP_FREE_STATEID, FREE_STATEID4args(s))]) == NFS4ERR_LOCKS_HELD
        assert await fs.status([(OP_FREE_STATEID, FREE_STATEID4args(bogus))]) == NFS4ERR_BAD_STATEID
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_DELEGRETURN, DELEGRETURN4args(s))]) == NFS4ERR_BAD_STATEID
        assert await fs.status([(OP_DELEGRETURN, DELEGRETURN4args(s))]) == NFS4ERR_NOFILEHANDLE
    run(main())


def test_removed_open_file_lives_until_close(fs):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "f")
        await fs.write(f, sid, 0, b"data")
        await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(b"f"))])
        assert await fs.read(f, sid, 0, 10) == (b"data", True)
        assert (await fs.getattr(f, FATTR4_NUMLINKS))[FATTR4_NUMLINKS] == 0
        await fs.close(f, sid)
        assert await fs.status([(OP_PUTFH, PUTFH4args(f))]) == NFS4ERR_STALE
    run(main())
