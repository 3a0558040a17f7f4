"""CREATE LINK REMOVE RENAME READLINK, and name validation."""
import asyncio

import pytest

from nfsd.attrs import bits_of
from testkit.ops_harness import attrs_of, make_fs
from nfsd.xdr.nfs4 import *  # noqa: F401,F403


@pytest.fixture
def fs(tmp_path):
    fs, store = make_fs(tmp_path)
    yield fs
    store.close()


def run(coro):
    return asyncio.run(coro)


NO_ATTRS = fattr4(attrmask=[], attr_vals=b"")


def create(dir_fh, kind, name, attrs=NO_ATTRS):
    return [(OP_PUTFH, PUTFH4args(dir_fh)), (OP_CREATE, CREATE4args(kind, name, attrs)), (OP_GETFH, None)]


@pytest.mark.parametrize("name,status", [
    (b"", NFS4ERR_INVAL), (b".", NFS4ERR_BADNAME), (b"..", NFS4ERR_BADNAME),
    (b"a/b", NFS4ERR_BADCHAR), (b"a\0b", NFS4ERR_BADCHAR), (b"x" * 256, NFS4ERR_NAMETOOLONG),
    (b"\xff\xfe", NFS4ERR_INVAL)])
def test_bad_names_everywhere(fs, name, status):
    async def main():
        exp = await fs.root_fh()
        f, sid, _ = await fs.open(exp, "ok")
        for ops in ([(OP_PUTFH, PUTFH4args(exp)), (OP_LOOKUP, LOOKUP4args(name))],
                    create(exp, createtype4(NF4DIR), name),
                    [(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(name))],
                    [(OP_PUTFH, PUTFH4args(exp)), (OP_SAVEFH, None), (OP_RENAME, RENAME4args(b"ok", name))],
                    [(OP_PUTFH, PUTFH4args(exp)), (OP_SAVEFH, None), (OP_RENAME, RENAME4args(name, b"z"))],
                    [(OP_PUTFH, PUTFH4args(f)), (OP_SAVEFH, None), (OP_PUTFH, PUTFH4args(exp)),
                     (OP_LINK, LINK4args(name))]):
            assert await fs.status(ops) == status, ops[-1][0]
        with pytest.raises(Exception) as e:
            await fs.open(exp, name)
        assert e.value.status == status
    run(main())


def test_name_of_255_bytes_works(fs):
    async def main():
        exp = await fs.root_fh()
        await fs.mkdir(exp, b"n" * 255)
        assert await fs.fh(exp, b"n" * 255)
    run(main())


def test_create_dir_symlink_and_badtypes(fs):
    async def main():
        exp = await fs.root_fh()
        before = (await fs.getattr(exp, FATTR4_CHANGE))[FATTR4_CHANGE]
        res = await fs.run(create(exp, createtype4(NF4DIR), b"d", attrs_of({FATTR4_MODE: 0o750})))
        ok = res[1].value
        assert ok.cinfo.atomic and ok.cinfo.before == before and ok.cinfo.after > before
        assert FATTR4_MODE in bits_of(ok.attrset)
        d = res[2].value.object
        a = await fs.getattr(d, FATTR4_TYPE, FATTR4_MODE)
        assert a == {FATTR4_TYPE: NF4DIR, FATTR4_MODE: 0o750}
        # through the store's batch committer, which answers only once the op is durable
        assert fs.server.store.batch.ops >= 1
        res = await fs.run(create(exp, createtype4(NF4LNK, b"target/path"), b"ln"))
        ln = res[2].value.object
        res = await fs.run([(OP_PUTFH, PUTFH4args(ln)), (OP_READLINK, None)])
        assert res[1].value.link == b"target/path"
        assert (await fs.getattr(ln, FATTR4_TYPE))[FATTR4_TYPE] == NF4LNK
        # READLINK of a non-link, LOOKUP through a symlink
        assert await fs.status([(OP_PUTFH, PUTFH4args(d)), (OP_READLINK, None)]) == NFS4ERR_INVAL
        assert await fs.status([(OP_PUTFH, PUTFH4args(ln)), (OP_LOOKUP, LOOKUP4args(b"x"))]) == NFS4ERR_SYMLINK
        for kind in (createtype4(NF4REG), createtype4(NF4ATTRDIR), createtype4(NF4NAMEDATTR)):
            assert await fs.status(create(exp, kind, b"dev")) == NFS4ERR_BADTYPE
        assert await fs.status(create(exp, createtype4(NF4DIR), b"d")) == NFS4ERR_EXIST
        assert await fs.status(create(exp, createtype4(NF4LNK, b""), b"l2")) == NFS4ERR_INVAL
        # unsupported / read-only create attributes
        bad = fattr4(attrmask=[1 << FATTR4_ACL], attr_vals=b"\0\0\0\0")
        assert await fs.status(create(exp, createtype4(NF4DIR), b"e", bad)) == NFS4ERR_ATTRNOTSUPP
        ro = attrs_of({FATTR4_FILEID: 5})
        assert await fs.status(create(exp, createtype4(NF4DIR), b"e", ro)) == NFS4ERR_INVAL
        # CREATE in a file
        f, sid, _ = await fs.open(exp, "f")
        assert await fs.status(create(f, createtype4(NF4DIR), b"x")) == NFS4ERR_NOTDIR
    run(main())


def test_link_and_remove(fs):
    async def main():
        exp = await fs.root_fh()
        d = await fs.mkdir(exp, "d")
        f, sid, _ = await fs.open(exp, "f")
        await fs.close(f, sid)
        res = await fs.run([(OP_PUTFH, PUTFH4args(f)), (OP_SAVEFH, None), (OP_PUTFH, PUTFH4args(d)),
                            (OP_LINK, LINK4args(b"f2"))])
        assert res[3].value.cinfo.after > res[3].value.cinfo.before
        assert (await fs.getattr(f, FATTR4_NUMLINKS))[FATTR4_NUMLINKS] == 2
        assert await fs.fh(d, "f2") == f
        # links to directories, over existing names, without a saved fh
        assert await fs.status([(OP_PUTFH, PUTFH4args(d)), (OP_SAVEFH, None), (OP_PUTFH, PUTFH4args(exp)),
                                (OP_LINK, LINK4args(b"dl"))]) == NFS4ERR_ISDIR
        assert await fs.status([(OP_PUTFH, PUTFH4args(f)), (OP_SAVEFH, None), (OP_PUTFH, PUTFH4args(d)),
                                (OP_LINK, LINK4args(b"f2"))]) == NFS4ERR_EXIST
        assert await fs.status([(OP_PUTFH, PUTFH4args(d)), (OP_LINK, LINK4args(b"x"))]) == NFS4ERR_NOFILEHANDLE
        # REMOVE: a file, a non-empty dir, a missing name, an empty dir
        await fs.run([(OP_PUTFH, PUTFH4args(d)), (OP_REMOVE, REMOVE4args(b"f2"))])
        assert (await fs.getattr(f, FATTR4_NUMLINKS))[FATTR4_NUMLINKS] == 1
        await fs.mkdir(d, "inner")
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(b"d"))]) == NFS4ERR_NOTEMPTY
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)), (OP_REMOVE, REMOVE4args(b"zz"))]) == NFS4ERR_NOENT
        await fs.run([(OP_PUTFH, PUTFH4args(d)), (OP_REMOVE, REMOVE4args(b"inner"))])
        assert await fs.status([(OP_PUTFH, PUTFH4args(d)), (OP_LOOKUP, LOOKUP4args(b"inner"))]) == NFS4ERR_NOENT
    run(main())


def rename(src, old, dst, new):
    return [(OP_PUTFH, PUTFH4args(src)), (OP_SAVEFH, None), (OP_PUTFH, PUTFH4args(dst)),
            (OP_RENAME, RENAME4args(old, new))]


def test_rename_file_over_existing_and_across_dirs(fs):
    async def main():
        exp = await fs.root_fh()
        a = await fs.mkdir(exp, "a")
        b = await fs.mkdir(exp, "b")
        f1, s1, _ = await fs.open(a, "tmp")
        await fs.write(f1, s1, 0, b"new data", FILE_SYNC4)
        await fs.close(f1, s1)
        f2, s2, _ = await fs.open(b, "ckpt")
        await fs.write(f2, s2, 0, b"old", FILE_SYNC4)
        await fs.close(f2, s2)
        ca = (await fs.getattr(a, FATTR4_CHANGE))[FATTR4_CHANGE]
        cb = (await fs.getattr(b, FATTR4_CHANGE))[FATTR4_CHANGE]
        res = await fs.run(rename(a, b"tmp", b, b"ckpt"))
        ok = res[3].value
        assert ok.source_cinfo.atomic and ok.target_cinfo.atomic
        assert ok.source_cinfo.before == ca and ok.source_cinfo.after > ca
        assert ok.target_cinfo.before == cb and ok.target_cinfo.after > cb
        assert await fs.fh(b, "ckpt") == f1
        assert await fs.status([(OP_PUTFH, PUTFH4args(f2))]) == NFS4ERR_STALE
        assert await fs.status([(OP_PUTFH, PUTFH4args(a)), (OP_LOOKUP, LOOKUP4args(b"tmp"))]) == NFS4ERR_NOENT
        assert await fs.status(rename(a, b"missing", b, b"x")) == NFS4ERR_NOENT
        # same name in the same directory: a no-op that succeeds
        await fs.run(rename(b, b"ckpt", b, b"ckpt"))
        assert await fs.fh(b, "ckpt") == f1
    run(main())


def test_rename_non_empty_directory(fs):
    async def main():
        exp = await fs.root_fh()
        src = await fs.mkdir(exp, "step-100.tmp")
        for i in range(5):
            f, s, _ = await fs.open(src, f"shard{i}")
            await fs.close(f, s)
        dst_parent = await fs.mkdir(exp, "done")
        await fs.run(rename(exp, b"step-100.tmp", dst_parent, b"step-100"))
        moved = await fs.fh(dst_parent, "step-100")
        assert moved == src
        assert await fs.fh(dst_parent, "step-100", "shard3")
        res = await fs.run([(OP_PUTFH, PUTFH4args(moved)), (OP_LOOKUPP, None), (OP_GETFH, None)])
        assert res[2].value.object == dst_parent
        # dir over non-empty dir, dir over file, file over dir, dir into itself
        other = await fs.mkdir(exp, "other")
        f, s, _ = await fs.open(other, "x")
        await fs.close(f, s)
        assert await fs.status(rename(dst_parent, b"step-100", exp, b"other")) in (NFS4ERR_EXIST, NFS4ERR_NOTEMPTY)
        assert await fs.status(rename(dst_parent, b"step-100", other, b"x")) == NFS4ERR_NOTDIR
        assert await fs.status(rename(other, b"x", exp, b"done")) == NFS4ERR_ISDIR
        assert await fs.status(rename(exp, b"done", moved, b"loop")) == NFS4ERR_INVAL
        # directory over an empty directory works
        await fs.mkdir(exp, "empty")
        await fs.run(rename(dst_parent, b"step-100", exp, b"empty"))
        assert await fs.fh(exp, "empty", "shard0")
    run(main())


def test_rename_needs_saved_fh_and_same_export(fs):
    async def main():
        exp = await fs.root_fh()
        assert await fs.status([(OP_PUTFH, PUTFH4args(exp)),
                                (OP_RENAME, RENAME4args(b"a", b"b"))]) == NFS4ERR_NOFILEHANDLE
        root = (await fs.run([(OP_PUTROOTFH, None), (OP_GETFH, None)]))[1].value.object
        assert await fs.status(rename(root, b"checkpoints", exp, b"x")) == NFS4ERR_XDEV
        assert await fs.status(rename(root, b"checkpoints", root, b"x")) == NFS4ERR_ROFS
    run(main())
