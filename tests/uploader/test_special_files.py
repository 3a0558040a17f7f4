"""Devices, sockets and FIFOs are mirrored as s3fs's mknod records them (an empty object,
mode with S_IFBLK/S_IFCHR/S_IFSOCK/S_IFIFO, devices with x-amz-meta-rdev), follow renames
and deletes like symlinks, and come back from the bucket on import."""
import asyncio
import os
import stat

import pytest

from cache.api import FileType
from tests.uploader.conftest import (fill_bucket_from_another_gateway, flush_uploads, import_and_flush,
                                     make_uploader, objects, remove, rename)
from testkit.storefiles import mkdirs, write_file
from uploader.keys import INO_META

KINDS = [(FileType.BLK, (8, 17), stat.S_IFBLK), (FileType.CHR, (4, 300), stat.S_IFCHR),
         (FileType.SOCK, (0, 0), stat.S_IFSOCK), (FileType.FIFO, (0, 0), stat.S_IFIFO)]


def mknod(store, path: str, typ, rdev=(0, 0), mode=0o640) -> int:
    head, _, name = path.rpartition("/")
    attr, _ = store.mknod(mkdirs(store, head), name.encode(), typ, mode, 1000, 1000, rdev)
    store.sync()
    return attr.ino


def node_object(client, key: str) -> tuple[int, dict]:
    info = client.head_object(key)
    assert info is not None, f"no object {key}"
    return info.size, info.metadata


@pytest.mark.parametrize("typ,rdev,fmt", KINDS, ids=["blk", "chr", "sock", "fifo"])
def test_special_file_is_put_then_follows_renames_and_deletes(moto, bucket, store, typ, rdev, fmt):
    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            ino = mknod(store, "run/node", typ, rdev)
            assert await up.flush(timeout=60)
            first = objects(up.client, "gw/"), node_object(up.client, "gw/run/node")
            rename(store, "run/node", "run/moved")
            assert await up.flush(timeout=60)
            after_rename = objects(up.client, "gw/")
            rename(store, "run", "run2")                       # the directory moves with it
            assert await up.flush(timeout=60)
            after_dir_rename = objects(up.client, "gw/")
            remove(store, "run2/moved")
            assert await up.flush(timeout=60)
            return ino, first, after_rename, after_dir_rename, objects(up.client, "gw/")
        finally:
            await up.stop()

    ino, (keys, (size, meta)), after_rename, after_dir_rename, final = asyncio.run(main())
    assert keys == {"gw/run/": 0, "gw/run/node": 0} and size == 0
    mode = int(meta["mode"])
    assert stat.S_IFMT(mode) == fmt and stat.S_IMODE(mode) == 0o640
    assert meta["uid"] == "1000" and meta[INO_META] == str(ino)
    if typ in (FileType.BLK, FileType.CHR):
        assert int(meta["rdev"]) == os.makedev(*rdev)
    else:
        assert "rdev" not in meta
    assert set(after_rename) == {"gw/run/", "gw/run/moved"}
    assert set(after_dir_rename) == {"gw/run2/", "gw/run2/moved"}
    assert set(final) == {"gw/run2/"}


def test_import_restores_special_files_without_uploading_them_again(moto, proxy, bucket, store, tmp_path):
    def fill(other):
        write_file(other, "run/step.ckpt", b"w" * 10)
        for typ, rdev, _ in KINDS:
            mknod(other, f"run/{typ.name.lower()}", typ, rdev, 0o620)
    fill_bucket_from_another_gateway(tmp_path / "other", moto.endpoint, bucket, fill)

    mknod(store, "run/fifo", FileType.SOCK)                # the local name wins
    # Our own uploads first: the uploader the import starts would otherwise race it, putting
    # our `run/` marker (and the socket) in the bucket before or after the listing, so the
    # count of names found ours varied with the host's load (1 or 2; seen in a full run).
    flush_uploads(store, moto.endpoint, bucket)
    report = import_and_flush(store, proxy.endpoint, bucket)
    # ours already: the run/ marker and run/fifo; new: the other three special files
    assert report.special == 3 and report.skipped_existing == 2 and report.directories == 0
    run = store.lookup(1, b"run")
    for typ, rdev, _ in KINDS[:3]:
        a = store.lookup(run.ino, typ.name.lower().encode())
        assert (a.type, a.rdev, a.mode, a.uid, a.size) == (typ, rdev, 0o620, 1000, 0)
    assert store.lookup(run.ino, b"fifo").type == FileType.SOCK
    assert store.check() == []
    # imported nodes are only read (HEAD), never sent back
    sent = [r.path for r in proxy.requests(outcome=None) if r.method in ("PUT", "POST")]
    assert not [p for p in sent if p.rsplit("/", 1)[-1] in ("blk", "chr", "sock")], sent
