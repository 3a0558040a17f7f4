"""Exports: networks, squashing, read-only exports, AUTH_SYS permission checks."""
import asyncio

import pytest

from cache.api import Attr, FileType, SetAttr
from nfsd.context import Cred
from nfsd.exports import (AUTH_NONE, AUTH_SYS, MAY_EXEC, MAY_READ, MAY_WRITE, EffectiveCred,
                          Export, Exports, permitted)
from testkit.ops_harness import Failed, Fs, attrs_of, make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


def run(coro):
    return asyncio.run(coro)


ANON = stateid4(0, bytes(12))


def test_networks_ipv4_ipv6():
    e = Export(1, "/checkpoints", networks=("10.0.0.0/8", "fd00::/8", "192.168.1.7"))
    assert e.allows("10.1.2.3") and e.allows("192.168.1.7") and e.allows("fd00::1")
    assert e.allows("::ffff:10.0.0.1")                        # v4-mapped v6 peer
    assert not e.allows("11.0.0.1") and not e.allows("::1") and not e.allows("garbage")
    ex = Exports([e])
    assert ex.client_allowed("10.0.0.5") and not ex.client_allowed("127.0.0.1")
    with pytest.raises(ValueError):
        Export(1, "/x", networks=("not-a-net",))
    with pytest.raises(ValueError):
        Exports([Export(1, "/a"), Export(2, "/a/b")])
    with pytest.raises(ValueError):
        Exports([Export(1, "/a"), Export(1, "/b")])


def test_squash_rules():
    root = Cred(AUTH_SYS, 0, 0, (0, 5))
    user = Cred(AUTH_SYS, 1000, 100, (100, 7))
    ex = Exports([Export(1, "/a", root_squash=True, anonuid=99, anongid=98)])
    e = ex.get(1)
    assert ex.effective_cred(e, root) == EffectiveCred(99, 98, frozenset({98, 5}))
    assert ex.effective_cred(e, user) == EffectiveCred(1000, 100, frozenset({100, 7}))
    assert ex.effective_cred(e, Cred(AUTH_NONE)) == EffectiveCred(99, 98, frozenset())
    e.root_squash = False
    assert ex.effective_cred(e, root).uid == 0
    e.all_squash = True
    assert ex.effective_cred(e, user) == EffectiveCred(99, 98, frozenset())


def test_permitted_mode_bits():
    def attr(mode, uid=10, gid=20, t=FileType.REG):
        return Attr(ino=5, gen=1, type=t, mode=mode, nlink=1, uid=uid, gid=gid, size=0, space_used=0,
                    atime_ns=0, mtime_ns=0, ctime_ns=0, change=1, parent=0)
    owner, member, other = (EffectiveCred(10, 1, frozenset()), EffectiveCred(11, 2, frozenset({20})),
                            EffectiveCred(12, 3, frozenset()))
    root = EffectiveCred(0, 0, frozenset())
    a = attr(0o640)
    assert permitted(a, owner, MAY_READ | MAY_WRITE) and not permitted(a, owner, MAY_EXEC)
    assert permitted(a, member, MAY_READ) and not permitted(a, member, MAY_WRITE)
    assert not permitted(a, other, MAY_READ)
    assert permitted(attr(0), root, MAY_READ | MAY_WRITE)
    assert not permitted(attr(0o644), root, MAY_EXEC) and permitted(attr(0o100), root, MAY_EXEC)
    assert permitted(attr(0, t=FileType.DIR), root, MAY_EXEC)
    assert not permitted(attr(0o070), owner, MAY_READ)        # owner bits win, as POSIX


def test_root_squash_over_the_ops(tmp_path):
    async def main():
        fs, store = make_fs(tmp_path, root_squash=True)
        try:
            exp = await fs.root_fh()               # store root: 0755 root:root
            assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_CREATE, CREATE4args(
                createtype4(NF4DIR), b"d", fattr4([], b"")))]) == NFS4ERR_ACCESS
            with pytest.raises(Failed) as e:
                await fs.open(exp, "f")
            assert e.value.status == NFS4ERR_ACCESS
            store.setattr(1, SetAttr(mode=0o777))
            f, sid, _ = await fs.open(exp, "f")
            assert (await fs.getattr(f, FATTR4_OWNER))[FATTR4_OWNER] == b"65534"
        finally:
            store.close()
    run(main())


def test_read_only_export(tmp_path):
    async def main():
        fs, store = make_fs(tmp_path, rw=False)
        try:
            at, _, _ = store.create(1, b"existing", 0o666, 0, 0)
            exp = await fs.root_fh()
            f = await fs.fh(exp, "existing")
            for ops in ([(OP_PUTFH, PUTFH4args(exp)), (OP_CREATE, CREATE4args(createtype4(NF4DIR), b"d", fattr4([], b"")))],
                        [(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(b"existing"))],
                        [(OP_PUTFH, PUTFH4args(exp)), (OP_SAVEFH, None), (OP_RENAME, RENAME4args(b"existing", b"x"))],
                        [(OP_PUTFH, PUTFH4args(f)), (OP_WRITE, WRITE4args(ANON, 0, UNSTABLE4, b"x"))],
                        [(OP_PUTFH, PUTFH4args(f)), (OP_SETATTR, SETATTR4args(ANON, attrs_of({FATTR4_MODE: 0o600})))]):
                assert await fs.status(ops) == NFS4ERR_ROFS, ops[-1][0]
            for kw in ({"create": True}, {"create": False, "access": OPEN4_SHARE_ACCESS_WRITE}):
                with pytest.raises(Failed) as e:
                    await fs.open(exp, "existing", **kw)
                assert e.value.status == NFS4ERR_ROFS
            f2, sid, _ = await fs.open(exp, "existing", create=False, access=OPEN4_SHARE_ACCESS_READ)
            res = await fs.run([(OP_PUTFH, PUTFH4args(exp)), (OP_ACCESS, ACCESS4args(0x1F))])
            assert res[1].value.access == ACCESS4_READ | ACCESS4_LOOKUP
        finally:
            store.close()
    run(main())


def test_client_outside_allowed_networks(tmp_path):
    async def main():
        fs, store = make_fs(tmp_path)
        try:
            exp = await fs.root_fh()
            outsider = fs.as_user(0, ip="192.0.2.1")
            assert not fs.server.exports.client_allowed("192.0.2.1")
            assert await outsider.status([(OP_PUTFH, PUTFH4args(exp))]) == NFS4ERR_ACCESS
            assert await outsider.status([(OP_PUTROOTFH, None),
                                          (OP_LOOKUP, LOOKUP4args(b"checkpoints"))]) == NFS4ERR_ACCESS
        finally:
            store.close()
    run(main())


def test_permission_denials_as_other_uid(tmp_path):
    async def main():
        fs, store = make_fs(tmp_path)
        try:
            exp = await fs.root_fh()
            alice, bob = fs.as_user(1000), fs.as_user(1001)
            priv = await fs.mkdir(exp, "private", mode=0o700)
            await fs.run([(OP_PUTFH, PUTFH4args(priv)), (OP_SETATTR, SETATTR4args(ANON, attrs_of({FATTR4_OWNER: b"1000"})))])
            f, sid, _ = await alice.open(priv, "mine", mode=0o600)
            await alice.close(f, sid)
            # bob cannot look into, create in, remove from or rename within alice's directory
            assert await bob.status([(OP_PUTFH, PUTFH4args(priv)), (OP_LOOKUP, LOOKUP4args(b"mine"))]) == NFS4ERR_ACCESS
            with pytest.raises(Failed) as e:
                await bob.open(priv, "intruder")
            assert e.value.status == NFS4ERR_ACCESS
            assert await bob.status([(OP_PUTFH, PUTFH4args(priv)), (OP_REMOVE, REMOVE4args(b"mine"))]) == NFS4ERR_ACCESS
            assert await bob.status([(OP_PUTFH, PUTFH4args(priv)), (OP_SAVEFH, None),
                                     (OP_RENAME, RENAME4args(b"mine", b"x"))]) == NFS4ERR_ACCESS
            for create in (True, False):          # no search permission: not even an existing name
                with pytest.raises(Failed) as e:
                    await bob.open(priv, "mine", create=create, access=OPEN4_SHARE_ACCESS_READ)
                assert e.value.status == NFS4ERR_ACCESS
            # nor open alice's 0600 file for reading, nor write it anonymously
            shared = await fs.mkdir(exp, "shared", mode=0o1777)     # sticky, world-writable
            g, gs, _ = await alice.open(shared, "g", mode=0o600)
            with pytest.raises(Failed) as e:
                await bob.open(shared, "g", create=False, access=OPEN4_SHARE_ACCESS_READ)
            assert e.value.status == NFS4ERR_ACCESS
            # the sticky bit keeps bob from removing or renaming alice's file
            assert await bob.status([(OP_PUTFH, PUTFH4args(shared)), (OP_REMOVE, REMOVE4args(b"g"))]) == NFS4ERR_PERM
            assert await bob.status([(OP_PUTFH, PUTFH4args(shared)), (OP_SAVEFH, None),
                                     (OP_RENAME, RENAME4args(b"g", b"h"))]) == NFS4ERR_PERM
            b2, bs, _ = await bob.open(shared, "b")
            await bob.run([(OP_PUTFH, PUTFH4args(shared)), (OP_REMOVE, REMOVE4args(b"b"))])
            # mode bits bind the owner too, by name or by handle (CLAIM_FH)
            await alice.run([(OP_PUTFH, PUTFH4args(g)), (OP_SETATTR, SETATTR4args(ANON, attrs_of({FATTR4_MODE: 0o400})))])
            with pytest.raises(Failed) as e:
                await alice.open(shared, "g", create=False, access=OPEN4_SHARE_ACCESS_WRITE, owner=b"o9")
            assert e.value.status == NFS4ERR_ACCESS
            reopen = OPEN4args(seqid=0, share_access=OPEN4_SHARE_ACCESS_WRITE, share_deny=0,
                               owner=alice.owner(b"o9"), openhow=openflag4(OPEN4_NOCREATE),
                               claim=open_claim4(CLAIM_FH))
            assert await alice.status([(OP_PUTFH, PUTFH4args(g)), (OP_OPEN, reopen)]) == NFS4ERR_ACCESS
            # AUTH_NONE is squashed to the anonymous ids
            anon = Fs(fs.server, Cred(AUTH_NONE), "127.0.0.1")
            a2, _, _ = await anon.open(shared, "anon")
            assert (await fs.getattr(a2, FATTR4_OWNER))[FATTR4_OWNER] == b"65534"
        finally:
            store.close()
    run(main())
