"""NFSv4.2's store primitives: punch hole (deallocate), allocate, seek / content runs,
server-side copy (reflink or copy_file_range). Each keeps the index/extent-file invariants
(check() at teardown), moves the data sequence of the file whose bytes change, and leaves
a state recovery agrees with after a crash at the risky points."""
from __future__ import annotations

import errno
import os

import pytest

from cache.api import ROOT_INO, CopySource, DataState, RemoteInfo, StoreError
from cache.store import Store

from tests.cache.storehelp import crash

MiB = 1 << 20


def new_file(store, name: bytes, data: bytes = b"") -> int:
    ino = store.create(ROOT_INO, name, 0o644, 0, 0)[0].ino
    if data:
        store.write(ino, 0, data)
        store.commit(ino)
    return ino


def upload(store, ino) -> None:
    a = store.getattr(ino)
    assert store.mark_uploaded(ino, RemoteInfo(key="k", etag="e", size=a.size,
                                               uploaded_change=a.change))


def test_punch_hole_reads_zeros_keeps_size_and_dirties(store):
    data = bytes(range(256)) * 4096          # 1 MiB
    ino = new_file(store, b"f", data)
    upload(store, ino)
    assert store.getattr(ino).data_state == DataState.CLEAN
    seq = store.getattr(ino).data_seq
    used = store.usage()["used"]
    store.deallocate(ino, 4096, 65536)
    a = store.getattr(ino)
    assert a.size == len(data)
    assert a.data_seq != seq and a.data_state == DataState.DIRTY
    got, _ = store.read(ino, 0, len(data))
    assert got == data[:4096] + bytes(65536) + data[4096 + 65536:]
    assert store.usage()["used"] == used - 65536          # local bytes no longer counted
    assert store.seek(ino, 0, data=False) == 4096
    assert store.seek(ino, 4096, data=True) == 4096 + 65536
    # past the end: nothing happens; a range crossing the end stops at it
    store.deallocate(ino, len(data) + 10, 100)
    store.deallocate(ino, len(data) - 10, 100)
    assert store.getattr(ino).size == len(data)
    assert store.read(ino, len(data) - 20, 20)[0] == data[-20:-10] + bytes(10)
    store.commit(ino)


def test_punch_hole_survives_a_crash_before_and_after_the_index(store_dir):
    data = b"a" * (3 * 65536)
    for point in ("punch.punched", "never: crash after the index update"):
        s = Store.open(store_dir)
        ino = new_file(s, b"f" + point.encode(), data)
        seq = s.getattr(ino).data_seq

        def hook(p, i, point=point):
            if p == point:
                raise KeyboardInterrupt      # the process dies here
        s.race_hook = hook
        try:
            s.deallocate(ino, 65536, 65536)
        except KeyboardInterrupt:
            pass
        s.race_hook = None
        crash(s)
        s = Store.open(store_dir)
        assert s.check() == []
        a = s.getattr(ino)
        assert a.size == len(data) and a.data_state == DataState.DIRTY
        assert a.data_seq != seq                        # the uploader sends what is there
        got, _ = s.read(ino, 0, len(data))
        assert got[:65536] == data[:65536] and got[-65536:] == data[-65536:]
        assert got[65536:131072] == bytes(65536)        # the punch had reached the file
        s.close()


def test_seek_and_content_runs(store):
    ino = new_file(store, b"f")
    store.write(ino, 0, b"x" * 8192)
    store.write(ino, 1 * MiB, b"y" * 8192)
    from cache.api import SetAttr
    store.setattr(ino, SetAttr(size=3 * MiB))          # a hole up to the end
    assert store.content_runs(ino, 0, 1 << 62) == [
        (0, 8192, True), (8192, MiB - 8192, False), (MiB, 8192, True),
        (MiB + 8192, 2 * MiB - 8192, False)]
    assert store.content_runs(ino, 4096, MiB + 4096) == [
        (4096, 4096, True), (8192, MiB - 8192, False), (MiB, 4096, True)]
    assert store.seek(ino, 0, data=True) == 0
    assert store.seek(ino, 100, data=False) == 8192
    assert store.seek(ino, 8192, data=True) == MiB
    assert store.seek(ino, MiB + 8192, data=True) is None     # no data follows
    assert store.seek(ino, MiB + 8192, data=False) == MiB + 8192
    with pytest.raises(StoreError) as e:
        store.seek(ino, 3 * MiB, data=False)
    assert e.value.errno == errno.ENXIO
    store.commit(ino)


def test_evicted_ranges_count_as_data(store):
    ino = new_file(store, b"f", b"z" * 65536)
    upload(store, ino)
    assert store.evict(ino) > 0
    assert store.content_runs(ino, 0, 65536) == [(0, 65536, True)]
    assert store.seek(ino, 0, data=False) == 65536
    # a punch in an evicted file leaves zeros there and ABSENT around it
    store.deallocate(ino, 4096, 4096)
    assert store.content_runs(ino, 0, 65536) == [(0, 4096, True), (4096, 4096, False),
                                                 (8192, 65536 - 8192, True)]
    store.commit(ino)


def test_allocate_extends_size_like_a_truncate_up(store):
    ino = new_file(store, b"f", b"q" * 100)
    seq = store.getattr(ino).data_seq
    a = store.allocate(ino, 0, 50)                     # inside: nothing visible changes
    assert a.size == 100 and store.getattr(ino).data_seq == seq
    a = store.allocate(ino, 4096, 65536)
    assert a.size == 4096 + 65536 and store.getattr(ino).data_seq != seq
    assert store.read(ino, 0, a.size)[0] == b"q" * 100 + bytes(a.size - 100)
    with pytest.raises(StoreError) as e:
        store.allocate(ino, 0, store.usage()["capacity"] * 2)
    assert e.value.errno == errno.ENOSPC
    store.commit(ino)


def test_copy_range_moves_the_destination_sequence_not_the_source(store):
    data = bytes(range(256)) * 1024                    # 256 KiB
    src = new_file(store, b"src", data)
    dst = new_file(store, b"dst", b"d" * 1000)
    upload(store, src)
    upload(store, dst)
    sseq, dseq = store.getattr(src).data_seq, store.getattr(dst).data_seq
    a, _reflinked = store.copy_range(src, dst, 65536, 4096, 131072)
    assert a.size == 4096 + 131072 and a.data_state == DataState.DIRTY
    assert a.data_seq != dseq
    s = store.getattr(src)
    assert s.data_seq == sseq and s.data_state == DataState.CLEAN
    got, _ = store.read(dst, 0, a.size)
    assert got == b"d" * 1000 + bytes(3096) + data[65536:65536 + 131072]
    store.commit(dst)


def test_copy_range_errors_and_source_holes(store):
    src = new_file(store, b"src", b"s" * 8192)
    from cache.api import SetAttr
    store.setattr(src, SetAttr(size=65536))             # the source's tail is a hole
    dst = new_file(store, b"dst", b"o" * 65536)         # old bytes that must become zeros
    store.copy_range(src, dst, 0, 0, 65536)
    assert store.read(dst, 0, 65536)[0] == b"s" * 8192 + bytes(65536 - 8192)
    for args in ((src, dst, 1, 0, 65536), (src, src, 0, 100, 200), (src, dst, -1, 0, 1)):
        with pytest.raises(StoreError) as e:
            store.copy_range(*args)
        assert e.value.errno == errno.EINVAL
    store.commit(dst)


def test_copy_from_an_evicted_source_asks_for_read_through(store):
    src = new_file(store, b"src", b"e" * 65536)
    upload(store, src)
    store.evict(src)
    dst = new_file(store, b"dst")
    with pytest.raises(StoreError) as e:
        store.copy_range(src, dst, 0, 0, 65536)
    assert e.value.errno == errno.EAGAIN and e.value.missing == [(0, 65536)]
    store.fill(src, 0, b"e" * 65536)
    store.copy_range(src, dst, 0, 0, 65536)
    assert store.read(dst, 0, 65536)[0] == b"e" * 65536
    store.commit(dst)


def test_copy_crash_after_the_bytes_before_the_index(store_dir):
    s = Store.open(store_dir)
    src = new_file(s, b"src", b"n" * 65536)
    dst = new_file(s, b"dst", b"o" * 4096)
    seq = s.getattr(dst).data_seq

    def hook(p, i):
        if p == "copy.copied":
            raise KeyboardInterrupt
    s.race_hook = hook
    with pytest.raises(KeyboardInterrupt):
        s.copy_range(src, dst, 0, 0, 65536)
    crash(s)
    s = Store.open(store_dir)
    assert s.check() == []
    a = s.getattr(dst)
    # the copy was never committed: recovery cuts back to the committed size and, since the
    # bytes below it may have changed, moves the data sequence so the uploader resends
    assert a.size == 4096 and a.data_state == DataState.DIRTY and a.data_seq != seq
    s.close()


def test_data_copy_range_zeros_what_lies_past_the_source_file(store):
    """An extent file may be shorter than its inode (a hole at the end reads as zeros): the
    copy must leave zeros there in the destination, not the destination's old bytes."""
    src = new_file(store, b"src", b"s" * 8192)
    dst = new_file(store, b"dst", b"o" * 65536)
    assert store.data.length(src) == 8192
    store.data.copy_range(src, dst, 0, 0, 65536)
    assert store.data.pread(dst, 0, 65536) == b"s" * 8192 + bytes(65536 - 8192)
    store.data.copy_range(src + 1000, dst, 0, 0, 4096)      # no source file at all
    assert store.data.pread(dst, 0, 65536) == bytes(4096) + b"s" * 4096 + bytes(65536 - 8192)


def test_allocate_and_deallocate_in_an_evicted_file_keep_the_store_consistent(store):
    ino = new_file(store, b"f", b"v" * 65536)
    upload(store, ino)
    store.evict(ino)
    store.allocate(ino, 0, 65536)                      # blocks reserved, bytes still in S3
    assert store.getattr(ino).data_state == DataState.ABSENT
    with pytest.raises(StoreError) as e:
        store.read(ino, 0, 10)
    assert e.value.errno == errno.EAGAIN
    store.fill(ino, 0, b"v" * 65536)
    assert store.read(ino, 0, 65536)[0] == b"v" * 65536
    assert store.check() == []


def test_reflink_branch_passes_the_kernel_its_file_clone_range(store, monkeypatch):
    """This machine's ext4 cannot reflink (the copy_file_range fallback runs above). Here a
    stand-in for the ioctl decodes struct file_clone_range {s64 src_fd; u64 src_offset,
    src_length, dest_offset} and does what FICLONERANGE would, so the request is checked."""
    from cache import data as data_mod
    calls = []

    def fake_ioctl(fd, request, arg):
        assert request == 0x4020940D                    # _IOW(0x94, 13, 32 bytes)
        src_fd, src_off, length, dst_off = data_mod._CLONE_RANGE.unpack(arg)
        calls.append((src_off, length, dst_off))
        os.pwrite(fd, os.pread(src_fd, length, src_off), dst_off)
        return 0
    monkeypatch.setattr(data_mod.fcntl, "ioctl", fake_ioctl)
    src = new_file(store, b"src", bytes(range(256)) * 64)
    dst = new_file(store, b"dst")
    _, reflinked = store.copy_range(src, dst, 4096, 8192, 8192)
    assert reflinked and calls == [(4096, 8192, 8192)]
    assert store.read(dst, 8192, 8192)[0] == (bytes(range(256)) * 64)[4096:12288]
    store.commit(dst)


def test_whole_copy_is_recorded_for_the_uploader_and_a_later_write_invalidates_it(store):
    """The destination's object record says which source data sequence its bytes are a
    copy of (CopySource); chunks of one copy extend it; a write moves the destination's
    data sequence away from the recorded one (nothing else needs to clear it)."""
    src = new_file(store, b"src", b"s" * 65536)
    whole = new_file(store, b"whole")
    a, _ = store.copy_range(src, whole, 0, 0, 65536)
    assert store.remote_info(whole).copied_from == CopySource(src, store.getattr(src).data_seq, 65536,
                                                              a.data_seq)
    store.commit(whole)
    chunked = new_file(store, b"chunked")
    store.copy_range(src, chunked, 0, 0, 16384)
    a, _ = store.copy_range(src, chunked, 16384, 16384, 65536 - 16384)
    assert store.remote_info(chunked).copied_from == CopySource(src, store.getattr(src).data_seq, 65536,
                                                                a.data_seq)
    store.commit(chunked)
    store.write(whole, 10, b"w")
    assert store.getattr(whole).data_seq != store.remote_info(whole).copied_from.dst_seq
    store.commit(whole)


def test_no_copy_record_for_a_shifted_copy_or_an_uncommitted_source(store):
    src = new_file(store, b"src", b"s" * 65536)
    dst = new_file(store, b"dst")
    store.copy_range(src, dst, 4096, 4096, 8192)          # not from the start: no record
    store.copy_range(src, dst, 0, 4096, 8192)             # shifted
    assert store.remote_info(dst).copied_from is None
    store.write(src, 0, b"u")                             # the source's bytes not committed
    store.copy_range(src, dst, 0, 0, 65536)
    assert store.remote_info(dst).copied_from is None
    store.commit(src)
    store.commit(dst)


def test_copy_record_does_not_survive_a_crash_before_commit(store_dir):
    """The record is in the index transaction of the copy; an uncommitted copy's bytes may
    be cut by recovery, which moves the data sequence: the record no longer matches."""
    s = Store.open(store_dir)
    src = new_file(s, b"src", b"n" * 65536)
    dst = new_file(s, b"dst")
    s.copy_range(src, dst, 0, 0, 65536)
    assert s.remote_info(dst).copied_from is not None
    crash(s)
    s = Store.open(store_dir)
    assert s.check() == []
    assert s.getattr(dst).data_seq != s.remote_info(dst).copied_from.dst_seq
    s.close()


def test_no_copy_record_when_a_write_lands_while_the_bytes_move(store):
    """A write to the destination between the copy's bytes and its index update (its
    sequence bump before the copy's own) leaves bytes the source never had: no record."""
    src = new_file(store, b"src", b"s" * 65536)
    dst = new_file(store, b"dst")

    def hook(p, i):
        if p == "copy.copied":
            store.race_hook = None
            store.write(dst, 100, b"raced")
    store.race_hook = hook
    store.copy_range(src, dst, 0, 0, 65536)
    assert store.read(dst, 100, 5)[0] == b"raced"
    assert store.remote_info(dst).copied_from is None
    store.commit(dst)
