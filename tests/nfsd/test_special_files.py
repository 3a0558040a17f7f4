"""Special files through the project's client in NFSv4.1 and 4.0 (issue 14, every file
type): CREATE of NF4BLK/NF4CHR (with specdata4)/NF4SOCK/NF4FIFO; their type, rawdev and
mode in GETATTR and READDIR; LOOKUP, LOOKUPP, PUTFH, RENAME, LINK, REMOVE, SETATTR on
them; and never I/O: OPEN, READ, WRITE, COMMIT, LOCK get the error each minor version's
RFC names (RFC 8881: WRONG_TYPE; RFC 7530: SYMLINK for OPEN, INVAL for I/O)."""
from __future__ import annotations

import os

import pytest

from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import bitmap, check, decode_attrs, encode_attrs, op, status_of

pytestmark = pytest.mark.timeout(60)

KINDS = [
    (NF4BLK, specdata4(8, 1), (8, 1)),
    (NF4CHR, specdata4(1, 3), (1, 3)),
    (NF4SOCK, None, (0, 0)),
    (NF4FIFO, None, (0, 0)),
]
IDS = ["blk", "chr", "sock", "fifo"]
ATTRS = (FATTR4_TYPE, FATTR4_MODE, FATTR4_SIZE, FATTR4_NUMLINKS, FATTR4_RAWDEV)


def put(fh):
    return op(OP_PUTFH, PUTFH4args(fh))


async def make(c, dir_fh, name: bytes, kind, dev, mode=0o640):
    """CREATE; returns (status, fh or None)."""
    res = await c.compound([put(dir_fh), op(OP_CREATE, CREATE4args(
        createtype4(kind, dev), name, encode_attrs({FATTR4_MODE: mode}))), op(OP_GETFH)])
    if res.status != NFS4_OK:
        return res.status, None
    return NFS4_OK, res.resarray[-1].value.value.object


async def status(c, ops) -> int:
    return (await c.compound(ops)).status


def open_nocreate(c, name: bytes):
    owner = open_owner4(c.clientid, b"special-" + os.urandom(4))
    return op(OP_OPEN, OPEN4args(seqid=c.take_seqid(owner.owner), share_access=OPEN4_SHARE_ACCESS_READ,
                                 share_deny=OPEN4_SHARE_DENY_NONE, owner=owner,
                                 openhow=openflag4(OPEN4_NOCREATE), claim=open_claim4(CLAIM_NULL, name)))


@pytest.fixture(params=[1, 0], ids=["v41", "v40"])
def mv(request):
    return request.param


@pytest.mark.parametrize("kind,dev,rdev", KINDS, ids=IDS)
def test_create_getattr_readdir_lookup(nfs_client, mv, kind, dev, rdev):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        before = (await c.getattr(root, (FATTR4_CHANGE,)))["change"]
        st, fh = await make(c, root, b"node", kind, dev)
        assert st == NFS4_OK
        a = await c.getattr(fh, ATTRS)
        assert (a["type"], a["mode"], a["size"], a["numlinks"]) == (kind, 0o640, 0, 1)
        assert (a["rawdev"].specdata1, a["rawdev"].specdata2) == rdev
        assert (await c.getattr(root, (FATTR4_CHANGE,)))["change"] > before
        [(name, ra, _)] = await c.readdir(root, ATTRS)
        assert name == b"node" and ra["type"] == kind
        assert (ra["rawdev"].specdata1, ra["rawdev"].specdata2) == rdev
        # LOOKUP finds it; PUTFH of its handle works; LOOKUP/LOOKUPP from it: not a directory
        assert await c.lookup_path("/checkpoints/node") == fh
        res = check(await c.compound([put(fh), op(OP_GETATTR, GETATTR4args(bitmap(FATTR4_TYPE)))]))
        assert decode_attrs(res.resarray[1].value.value.obj_attributes)["type"] == kind
        assert await status(c, [put(fh), op(OP_LOOKUPP)]) == NFS4ERR_NOTDIR
        assert await status(c, [put(fh), op(OP_LOOKUP, LOOKUP4args(b"x"))]) == NFS4ERR_NOTDIR
        assert await status(c, [put(fh), op(OP_READLINK)]) == NFS4ERR_INVAL
        assert await status(c, [put(fh), op(OP_READDIR, READDIR4args(0, bytes(8), 1024, 4096,
                                                                     bitmap(FATTR4_TYPE)))]) == NFS4ERR_NOTDIR
        # the name is taken, for any type
        assert (await make(c, root, b"node", NF4FIFO, None))[0] == NFS4ERR_EXIST
        assert (await make(c, root, b"node", NF4DIR, None))[0] == NFS4ERR_EXIST
    nfs_client(body, minorversion=mv)


@pytest.mark.parametrize("kind,dev,rdev", KINDS, ids=IDS)
def test_never_opened_for_io(nfs_client, mv, kind, dev, rdev):
    wrong = NFS4ERR_WRONG_TYPE if mv else NFS4ERR_INVAL

    async def body(c):
        root = await c.lookup_path("/checkpoints")
        _, fh = await make(c, root, b"n", kind, dev)
        anon = stateid4(0, bytes(12))
        assert await status(c, [put(root), open_nocreate(c, b"n")]) == (
            NFS4ERR_WRONG_TYPE if mv else NFS4ERR_SYMLINK)
        assert await status(c, [put(fh), op(OP_READ, READ4args(anon, 0, 10))]) == wrong
        assert await status(c, [put(fh), op(OP_WRITE, WRITE4args(anon, 0, UNSTABLE4, b"x"))]) == wrong
        assert await status(c, [put(fh), op(OP_COMMIT, COMMIT4args(0, 0))]) == wrong
        assert await status(c, [put(fh), op(OP_LOCKT, LOCKT4args(
            WRITE_LT, 0, 1, lock_owner4(c.clientid, b"lo")))]) == wrong
        # mode can be set, size cannot
        assert await status(c, [put(fh), op(OP_SETATTR, SETATTR4args(
            anon, encode_attrs({FATTR4_MODE: 0o600})))]) == NFS4_OK
        assert (await c.getattr(fh, (FATTR4_MODE,)))["mode"] == 0o600
        assert await status(c, [put(fh), op(OP_SETATTR, SETATTR4args(
            anon, encode_attrs({FATTR4_SIZE: 0})))]) == NFS4ERR_INVAL
        assert (await c.getattr(fh, (FATTR4_SIZE,)))["size"] == 0
    nfs_client(body, minorversion=mv)


@pytest.mark.parametrize("kind,dev,rdev", KINDS, ids=IDS)
def test_rename_link_remove(nfs_client, mv, kind, dev, rdev):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        st, d = await make(c, root, b"d", NF4DIR, None, 0o755)
        _, fh = await make(c, root, b"n", kind, dev)
        await c.rename(root, b"n", d, b"moved")
        assert await c.lookup_path("/checkpoints/d/moved") == fh
        assert await status(c, [put(root), op(OP_LOOKUP, LOOKUP4args(b"n"))]) == NFS4ERR_NOENT
        res = await c.compound([put(fh), op(OP_SAVEFH), put(root), op(OP_LINK, LINK4args(b"hard"))])
        assert res.status == NFS4_OK
        assert (await c.getattr(fh, (FATTR4_NUMLINKS,)))["numlinks"] == 2
        # renamed over a regular file and over by one
        f, sid = await c.open_create(root, "f")
        await c.close_file(f, sid)
        await c.rename(root, b"hard", root, b"f")
        assert await c.lookup_path("/checkpoints/f") == fh
        # a special file cannot replace a directory (as for a regular file: EISDIR's
        # NFS4ERR_ISDIR), nor be the saved dir of RENAME
        _, e = await make(c, root, b"e", NF4DIR, None, 0o755)
        assert await status(c, [put(root), op(OP_SAVEFH), put(root),
                                op(OP_RENAME, RENAME4args(b"f", b"e"))]) == NFS4ERR_ISDIR
        assert await status(c, [put(fh), op(OP_SAVEFH), put(root),
                                op(OP_RENAME, RENAME4args(b"x", b"y"))]) == NFS4ERR_NOTDIR
        await c.remove(root, b"f")
        await c.remove(d, b"moved")
        assert await status(c, [put(fh), op(OP_GETATTR, GETATTR4args(bitmap(FATTR4_TYPE)))]) == NFS4ERR_STALE
    nfs_client(body, minorversion=mv)


@pytest.mark.parametrize("kind", [NF4REG, NF4ATTRDIR, NF4NAMEDATTR])
def test_create_of_other_types_is_badtype(nfs_client, mv, kind):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        assert (await make(c, root, b"x", kind, None))[0] == NFS4ERR_BADTYPE
    nfs_client(body, minorversion=mv)


def test_create_needs_a_directory_and_write_permission(nfs_client, mv):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        _, fifo = await make(c, root, b"p", NF4FIFO, None)
        assert (await make(c, fifo, b"x", NF4CHR, specdata4(1, 1)))[0] == NFS4ERR_NOTDIR
        assert (await make(c, root, b"a/b", NF4SOCK, None))[0] == NFS4ERR_BADCHAR
        assert (await make(c, root, b"", NF4SOCK, None))[0] == NFS4ERR_INVAL
        res = await c.compound([op(OP_CREATE, CREATE4args(createtype4(NF4FIFO), b"z",
                                                          encode_attrs({})))])
        assert status_of(res.resarray[0]) == NFS4ERR_NOFILEHANDLE
    nfs_client(body, minorversion=mv)
