"""Space: dirty data over capacity gives EAGAIN; a full disk gives ENOSPC; both recover."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest

from cache.api import RemoteInfo, ROOT_INO, StoreError
from cache.store import Store

MiB = 1 << 20


def mkfile(s, name):
    return s.create(ROOT_INO, name, 0o644, 0, 0)[0].ino


def test_dirty_over_capacity_is_eagain_then_resumes(store_dir):
    s = Store.open(store_dir, capacity=4 * MiB)
    chunk = os.urandom(256 * 1024)
    files, code = [], None
    for i in range(40):
        f = mkfile(s, b"f%d" % i)
        try:
            s.write(f, 0, chunk)
        except StoreError as e:
            code = e.errno
            break
        s.commit(f)
        files.append(f)
    assert code == errno.EAGAIN and len(files) == 16
    assert s.usage()["dirty"] == 4 * MiB
    for f in files:                                     # nothing stored was damaged
        assert s.read(f, 0, len(chunk))[0] == chunk
    with pytest.raises(StoreError) as e:                # overwrites inside still work,
        s.write(files[0], len(chunk), b"x")             # growth does not
    assert e.value.errno == errno.EAGAIN
    s.write(files[0], 0, b"overwrite ok")
    assert s.check() == []
    # the uploader drains: the file becomes clean; then new writes evict it to make room
    for f in files[:4]:
        s.commit(f)
        assert s.mark_uploaded(f, RemoteInfo(uploaded_change=s.getattr(f).change))
    g = mkfile(s, b"after")
    s.write(g, 0, chunk * 2)
    assert s.usage()["used"] <= 4 * MiB
    assert sum(s.getattr(f).space_used == 0 for f in files[:4]) >= 2   # evicted LRU first
    assert s.check() == []
    s.close()


def test_dirty_over_capacity_without_eviction(store_dir):
    s = Store.open(store_dir, capacity=MiB, evict=False)
    f = mkfile(s, b"a")
    s.write(f, 0, b"x" * MiB)
    s.commit(f)
    s.mark_uploaded(f, RemoteInfo(uploaded_change=s.getattr(f).change))
    g = mkfile(s, b"b")
    with pytest.raises(StoreError) as e:                # clean data is not evicted
        s.write(g, 0, b"y")
    assert e.value.errno == errno.EAGAIN
    assert s.evict(f) == MiB
    s.write(g, 0, b"y")
    s.close()


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 16 MiB tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_enospc_and_recovers(small_fs):
    ballast = os.path.join(small_fs, "ballast")
    with open(ballast, "wb") as fh:                     # someone else's data on the disk
        fh.write(b"\0" * (4 * MiB))
    path = os.path.join(small_fs, "store")
    s = Store.open(path, capacity=1 << 30)              # capacity above the disk: ENOSPC
    chunk = os.urandom(128 * 1024)
    written, codes = {}, set()
    for i in range(200):
        try:
            f = mkfile(s, b"f%d" % i)
            s.write(f, 0, chunk)
            s.write(f, len(chunk), chunk)
            s.commit(f)
            written[f] = chunk * 2
        except StoreError as e:
            codes.add(e.errno)
            if len(codes) and i > 5 and len(written) < i - 3:
                break
    assert codes == {errno.ENOSPC}, codes
    assert written, "nothing fit before the disk was full"
    for f, data in written.items():                     # nothing stored was damaged
        assert s.read(f, 0, len(data) + 10) == (data, True)
    assert s.check() == []
    os.unlink(ballast)                                  # space comes back
    f = mkfile(s, b"later")
    s.write(f, 0, chunk)
    s.commit(f)
    s.rename(ROOT_INO, b"later", ROOT_INO, b"later2")
    s.sync()
    assert s.check() == []
    s.close()
    s = Store.open(path, capacity=1 << 30)
    for ino, data in written.items():
        assert s.read(ino, 0, len(data) + 10) == (data, True)
    assert s.read(s.lookup(ROOT_INO, b"later2").ino, 0, len(chunk)) == (chunk, True)
    assert s.check() == []
    s.close()


def test_eviction_started_above_high_continues_to_low_as_files_become_clean(store_dir):
    """Above the high watermark with too little clean data, a round frees what it can; once the
    other files are uploaded, later rounds carry on down to the low watermark, although usage is
    below the high watermark by then."""
    s = Store.open(store_dir, capacity=8 * MiB, high_watermark=0.5, low_watermark=0.25)
    files = []
    for i in range(5):                                  # 5 MiB used: above high (4 MiB)
        f = mkfile(s, b"f%d" % i)
        s.write(f, 0, os.urandom(MiB))
        s.commit(f)
        files.append(f)
    s.mark_uploaded(files[0], RemoteInfo(uploaded_change=s.getattr(files[0]).change))
    assert s.maybe_evict() == MiB                       # only one file is clean
    assert s.usage()["used"] == 4 * MiB                 # at the high watermark, above the low one
    for f in files[1:]:
        assert s.mark_uploaded(f, RemoteInfo(uploaded_change=s.getattr(f).change))
    assert s.maybe_evict() == 2 * MiB
    assert s.usage()["used"] == 2 * MiB                 # the low watermark
    assert s.maybe_evict() == 0                         # done: nothing more until above high again
    g = mkfile(s, b"g")
    s.write(g, 0, os.urandom(MiB))
    s.commit(g)
    assert s.maybe_evict() == 0 and s.usage()["used"] == 3 * MiB
    assert s.check() == []
    s.close()
