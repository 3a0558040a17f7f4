"""Symbolic links are mirrored as s3fs stores them (body = target, mode S_IFLNK), follow renames
and deletes like files, and come back from the bucket on import."""
import asyncio
import stat

from tests.uploader.conftest import (fill_bucket_from_another_gateway, import_and_flush, make_uploader, objects,
                                     remove, rename)
from testkit.storefiles import mkdirs, write_file
from uploader.keys import INO_META
from uploader.objectclient import checksum_b64


def symlink(store, path: str, target: bytes) -> int:
    head, _, name = path.rpartition("/")
    attr, _ = store.symlink(mkdirs(store, head), name.encode(), target, 0o777, 1000, 1000)
    store.sync()
    return attr.ino


def link_object(client, key: str) -> tuple[bytes, dict]:
    info = client.head_object(key)
    assert info is not None, f"no object {key}"
    return client.get_range(key, 0, info.size), info.metadata


def test_symlink_is_put_then_follows_renames_and_deletes(moto, bucket, store):
    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            write_file(store, "run/step_100.ckpt", b"weights")
            ino = symlink(store, "run/last.ckpt", b"step_100.ckpt")
            assert await up.flush(timeout=60)
            first = objects(up.client, "gw/"), link_object(up.client, "gw/run/last.ckpt")
            rename(store, "run/last.ckpt", "run/latest")
            assert await up.flush(timeout=60)
            after_rename = objects(up.client, "gw/")
            rename(store, "run", "run2")                       # the directory moves with the link in it
            assert await up.flush(timeout=60)
            after_dir_rename = objects(up.client, "gw/"), link_object(up.client, "gw/run2/latest")
            remove(store, "run2/latest")
            assert await up.flush(timeout=60)
            return ino, first, after_rename, after_dir_rename, objects(up.client, "gw/")
        finally:
            await up.stop()

    ino, (keys, (body, meta)), after_rename, (keys3, (body3, _)), final = asyncio.run(main())
    assert keys == {"gw/run/": 0, "gw/run/step_100.ckpt": 7, "gw/run/last.ckpt": len(b"step_100.ckpt")}
    assert body == b"step_100.ckpt"
    assert stat.S_ISLNK(int(meta["mode"])) and stat.S_IMODE(int(meta["mode"])) == 0o777
    assert meta["uid"] == "1000" and meta[INO_META] == str(ino)
    assert set(after_rename) == {"gw/run/", "gw/run/step_100.ckpt", "gw/run/latest"}
    assert set(keys3) == {"gw/run2/", "gw/run2/step_100.ckpt", "gw/run2/latest"} and body3 == b"step_100.ckpt"
    assert set(final) == {"gw/run2/", "gw/run2/step_100.ckpt"}


def test_symlink_made_and_renamed_before_its_put_ends_under_the_last_name(moto, bucket, store):
    symlink(store, "ck/tmp-link", b"../elsewhere")
    rename(store, "ck/tmp-link", "ck/link")
    symlink(store, "ck/gone", b"x")
    remove(store, "ck/gone")

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            assert await up.flush(timeout=60)
            return objects(up.client, "gw/"), link_object(up.client, "gw/ck/link")[0]
        finally:
            await up.stop()

    keys, body = asyncio.run(main())
    assert keys == {"gw/ck/": 0, "gw/ck/link": len(b"../elsewhere")} and body == b"../elsewhere"


def test_import_restores_symlinks_without_uploading_them_again_and_local_names_win(moto, proxy, bucket, store,
                                                                                    tmp_path):
    from cache.api import FileType

    def fill(other):
        write_file(other, "run/step_200.ckpt", b"w" * 100)
        symlink(other, "run/last.ckpt", b"step_200.ckpt")
        symlink(other, "run/best.ckpt", b"step_100.ckpt")
    fill_bucket_from_another_gateway(tmp_path / "other", moto.endpoint, bucket, fill)

    write_file(store, "run/best.ckpt", b"a local file")       # the local name wins over the link
    report = import_and_flush(store, proxy.endpoint, bucket)
    assert report.symlinks == 1 and report.skipped_existing == 1
    run = store.lookup(1, b"run")
    last = store.lookup(run.ino, b"last.ckpt")
    assert last.type == FileType.LNK and store.readlink(last.ino) == b"step_200.ckpt"
    assert last.mode & 0o7777 == 0o777 and last.uid == 1000
    assert store.lookup(run.ino, b"best.ckpt").type == FileType.REG
    # the imported link is read (GET), never sent back; the local file is uploaded
    sent = [r.path for r in proxy.requests(outcome=None) if r.method in ("PUT", "POST")]
    assert any(p.endswith("/run/best.ckpt") for p in sent), sent
    assert not [p for p in sent if "last.ckpt" in p], sent


def test_imported_symlinks_move_with_their_directory_and_alone_and_a_foreign_object_stays(moto, bucket, store,
                                                                                          tmp_path):
    """An imported link owns the object it came from (as an imported file does): `mv imp a`
    takes it to a/ with the gateway's own link and the imported file, and renaming it alone
    moves its object. An object somebody puts into imp/ after the rename, not imported, is
    no file of the namespace: the queued move leaves it (found by the integrity model)."""
    def fill(other):
        write_file(other, "imp/x.pt", b"x" * 100)
        symlink(other, "imp/last", b"x.pt")
    fill_bucket_from_another_gateway(tmp_path / "other", moto.endpoint, bucket, fill)

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            report = await up.import_bucket()
            symlink(store, "imp/mine", b"x.pt")
            assert await up.flush(timeout=60)
        finally:
            await up.stop()
        rename(store, "imp", "a")                      # queued while the uploader is stopped
        up.client.put_object("gw/imp/theirs.bin", b"t" * 10, metadata={},
                             checksum=checksum_b64(up.client.checksum_algorithm, b"t" * 10))
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            assert await up.flush(timeout=60)
            moved = objects(up.client, "gw/")
            rename(store, "a/last", "a/latest")
            assert await up.flush(timeout=60)
            return report, moved, objects(up.client, "gw/")
        finally:
            await up.stop()

    report, moved, renamed = asyncio.run(main())
    assert report.symlinks == 1 and report.imported == 2
    assert moved == {"gw/a/": 0, "gw/a/x.pt": 100, "gw/a/last": 4, "gw/a/mine": 4, "gw/imp/theirs.bin": 10}
    assert renamed == {"gw/a/": 0, "gw/a/x.pt": 100, "gw/a/latest": 4, "gw/a/mine": 4, "gw/imp/theirs.bin": 10}
    body, meta = link_object(make_uploader(store, moto.endpoint, bucket).client, "gw/a/latest")
    assert body == b"x.pt" and stat.S_ISLNK(int(meta["mode"]))
