"""Interoperability with nfs-rs, an NFSv4.1 client we did not write (its own XDR, sessions,
open state and COMMIT logic), against `python -m nfsd` as a process.

Only NfsRetryableError is retried (bounded); any other nfs-rs error fails the test.
Findings go to /work/notes/nfsrs_findings.md.
"""
from __future__ import annotations

import hashlib
import random
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import nfs_rs  # noqa: E402 (a [test] dependency: missing fails, it does not skip)

from testkit.crash_server import ServerProcess, store_check  # noqa: E402
from testkit.nfsrs_support import (  # noqa: E402
    RETRIES, connect, read_file, retrying, url, write_file)

MiB = 1 << 20
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("nfsrs")
    srv = ServerProcess(root / "cache", root / "server.log")
    srv.start()
    yield srv
    status = srv.stop()
    assert status == 0, srv.log_tail()
    assert store_check(srv.cache_dir) == []
    faults = [ln for ln in srv.log_errors() if "Traceback" in ln or "SERVERFAULT" in ln]
    assert not faults, "\n".join(faults[:10])
    if RETRIES.retries:
        print(f"\nnfs-rs retryable errors retried: {len(RETRIES.retries)}: {RETRIES.retries[:5]}")


@pytest.fixture
def client(server):
    c = connect(server.port)
    yield c
    c.close()


def test_mkdir_write_read_rename_unlink_exists(client):
    retrying(client.mkdir, "basic")
    assert client.exists("basic") and not client.exists("basic/nothing")
    with pytest.raises(FileExistsError):
        client.mkdir("basic")
    write_file(client, "basic/a", b"hello, nfs-rs")
    assert read_file(client, "basic/a") == b"hello, nfs-rs"
    assert client.stat("basic/a").size == 13
    write_file(client, "basic/b", b"old target")
    retrying(client.rename, "basic/a", "basic/b")          # over an existing file
    assert not client.exists("basic/a")
    assert read_file(client, "basic/b") == b"hello, nfs-rs"
    assert sorted(client.listdir("basic")) == ["b"]
    retrying(client.remove, "basic/b")
    assert not client.exists("basic/b")
    with pytest.raises(FileNotFoundError):
        client.open("basic/b", "rb")
    retrying(client.rmdir, "basic")
    assert not client.exists("basic")


def test_overwrite_truncates(client):
    retrying(client.mkdir, "trunc")
    write_file(client, "trunc/f", b"x" * 100_000)
    write_file(client, "trunc/f", b"short")
    assert read_file(client, "trunc/f") == b"short"
    assert client.stat("trunc/f").size == 5


def test_1mib_chunks_and_64mib_file_sha256(client):
    retrying(client.mkdir, "big")
    rng = random.Random(64)
    block = rng.randbytes(MiB)
    # 64 distinct MiB-chunks (cheap to make: a rotated block each) so misplaced chunks show
    chunks = [block[i * 4099 % MiB:] + block[:i * 4099 % MiB] for i in range(64)]
    want = hashlib.sha256(b"".join(chunks)).hexdigest()

    def write_once():
        with client.open("big/64m", "wb") as f:
            for ch in chunks:
                assert f.write(ch) == MiB
    retrying(write_once)
    assert client.stat("big/64m").size == 64 * MiB

    def read_once():
        h = hashlib.sha256()
        with client.open("big/64m", "rb") as f:
            while piece := f.read(MiB):
                h.update(piece)
        return h.hexdigest()
    assert retrying(read_once) == want
    # a read at an odd offset across a chunk boundary
    with client.open("big/64m", "rb") as f:
        assert retrying(f.read_at, 5 * MiB - 10, 20) == chunks[4][-10:] + chunks[5][:10]


def test_listdir_of_1000_entries(server, client):
    retrying(client.mkdir, "many")
    names = [f"entry-{i:04d}" for i in range(1000)]
    errors = []

    def fill(part: list[str]) -> None:
        # 4 clients at once into one directory; touch (OPEN create + CLOSE) keeps this quick
        try:
            c = connect(server.port)
            try:
                for name in part:
                    if name.endswith("00"):
                        write_file(c, f"many/{name}", name.encode())
                    else:
                        retrying(c.touch, f"many/{name}")
            finally:
                c.close()
        except BaseException as e:          # reported by the main thread
            errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=fill, args=(names[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert sorted(retrying(client.listdir, "many")) == names
    assert sorted(e.name for e in client.scandir("many")) == names
    assert client.exists("many/entry-0999")
    assert read_file(client, "many/entry-0500") == b"entry-0500"


def test_checkpoint_pattern_from_8_clients_survives_kill9(tmp_path):
    """8 clients at once save checkpoints as training jobs do: write a tmp file (each write()
    returns only when durable), close, rename over the final name. Every reply received means
    durable: after a kill -9 and restart each final name holds its last saved version."""
    srv = ServerProcess(tmp_path / "cache", tmp_path / "server.log")
    srv.start()
    setup = connect(srv.port)
    retrying(setup.mkdir, "ckpt")
    setup.close()
    rounds, errors = 4, []
    last: dict[int, str] = {}

    def rank(i: int) -> None:
        rng = random.Random(i)
        try:
            c = connect(srv.port)
            try:
                for r in range(rounds):
                    data = rng.randbytes(rng.choice([1, 4096, MiB + 7, 3 * MiB]))
                    tmp = f"ckpt/.rank{i}.pt.tmp{r}"
                    write_file(c, tmp, data)
                    retrying(c.rename, tmp, f"ckpt/rank{i}.pt")
                    last[i] = hashlib.sha256(data).hexdigest()
            finally:
                c.close()
        except BaseException as e:          # reported by the main thread
            errors.append(f"rank {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, "\n".join(errors)
        srv.kill9()
        srv.start(same_port=True)
        # a new Client: an nfs-rs Client does not outlive its server's restart (seen with
        # NFS-Ganesha too: NfsOperationOutcomeError DefiniteFailure, recovery=Retry)
        c = connect(srv.port)
        try:
            assert sorted(c.listdir("ckpt")) == sorted(f"rank{i}.pt" for i in range(8))
            for i in range(8):
                assert hashlib.sha256(read_file(c, f"ckpt/rank{i}.pt")).hexdigest() == last[i]
        finally:
            c.close()
    finally:
        srv.stop()
    assert store_check(srv.cache_dir) == []


def test_modes_attributes_and_links(client):
    retrying(client.mkdir, "misc")
    write_file(client, "misc/a", b"123")
    with client.open("misc/a", "ab") as f:
        f.write(b"456")
    with client.open("misc/a", "r+b") as f:
        f.seek(2)
        f.write(b"ZZ")
    assert read_file(client, "misc/a") == b"12ZZ56"
    with client.open("misc/sparse", "wb") as f:
        f.write_at(b"end", 100_000)
    assert read_file(client, "misc/sparse") == bytes(100_000) + b"end"
    with client.open("misc/a", "rb") as f:
        assert f.read_at(1000, 10) == b""                   # past EOF
    retrying(client.truncate, "misc/a", 2)
    retrying(client.truncate, "misc/a", 6)
    assert read_file(client, "misc/a") == b"12\0\0\0\0"
    retrying(client.chmod, "misc/a", 0o600)
    retrying(client.chown, "misc/a", 1000, 1000)
    retrying(client.utime, "misc/a", ns=(1_000_000_000, 2_000_000_000))
    st = client.stat("misc/a")
    assert (st.mode & 0o7777, st.uid, st.gid, st.atime, st.mtime) == \
        (0o600, 1000, 1000, 1_000_000_000, 2_000_000_000)
    retrying(client.symlink, "a", "misc/l")
    assert client.readlink("misc/l") == "a"
    retrying(client.link, "misc/a", "misc/h")
    assert client.stat("misc/a").nlink == 2
    retrying(client.rename, "misc/a", "misc/h")             # same file: a no-op (RFC 8881 18.26.4)
    assert sorted(client.listdir("misc")) == ["a", "h", "l", "sparse"]


def test_errors_map_to_the_posix_exceptions(client):
    retrying(client.mkdir, "errs")
    retrying(client.mkdir, "errs/d")
    write_file(client, "errs/d/f", b"x")
    write_file(client, "errs/f", b"x")
    with pytest.raises(NotADirectoryError):
        client.mkdir("errs/f/sub")
    with pytest.raises(NotADirectoryError):
        client.open("errs/f/sub", "wb")
    with pytest.raises(IsADirectoryError):
        client.rename("errs/f", "errs/d")
    with pytest.raises(NotADirectoryError):
        client.rename("errs/d", "errs/f")
    with pytest.raises(IsADirectoryError):
        client.open("errs/d", "rb")
    with pytest.raises(OSError, match="not empty"):
        client.rmdir("errs/d")
    with pytest.raises(FileNotFoundError):
        client.rename("errs/nothing", "errs/z")
    with pytest.raises(OSError, match="too long"):
        client.open("errs/" + "n" * 256, "wb")
    write_file(client, "errs/" + "n" * 255, b"")            # NAME_MAX itself is fine
    with pytest.raises(nfs_rs.NfsError):
        client.rename("errs", "errs/d/inside")              # a dir into its own subtree
    assert sorted(client.listdir("errs")) == sorted(["d", "f", "n" * 255])
    assert client.listdir("errs/d") == ["f"]


class _Generation:
    """Counts server (re)starts, so a rank can tell an error caused by our kill -9 (the
    generation moved or the server is down) from a real one."""

    def __init__(self):
        self.value = 0
        self.down = False
        self.lock = threading.Lock()

    def snapshot(self) -> int:
        with self.lock:
            return -1 if self.down else self.value

    def moved_since(self, seen: int) -> bool:
        with self.lock:
            return self.down or seen != self.value


def test_checkpoint_pattern_with_kill9_midway(tmp_path):
    """Ranks save checkpoints through nfs-rs while the server is kill -9'd and restarted
    (on the same port). A rename that returned is durable: afterwards each final name holds
    the last version whose rename returned, or the version whose rename was in flight."""
    srv = ServerProcess(tmp_path / "cache", tmp_path / "server.log")
    srv.start()
    setup = connect(srv.port)
    retrying(setup.mkdir, "ckpt")
    setup.close()
    gen, stop = _Generation(), threading.Event()
    acked: dict[int, str] = {}                  # rank -> sha256 of its last acknowledged save
    inflight: dict[int, str | None] = {}
    errors: list[str] = []
    saves = [0]

    def rank(i: int) -> None:
        rng = random.Random(100 + i)
        c, c_gen, r = None, -1, 0
        while not stop.is_set():
            seen = gen.snapshot()
            if seen < 0:
                time.sleep(0.05)
                continue
            try:
                if c is None:
                    c, c_gen = nfs_rs.Client.connect(url(srv.port)), seen
                data = rng.randbytes(rng.choice([4096, MiB + 3, 2 * MiB]))
                tmp = f"ckpt/.rank{i}.tmp{r}"
                r += 1
                write_file(c, tmp, data)
                inflight[i] = hashlib.sha256(data).hexdigest()
                c.rename(tmp, f"ckpt/rank{i}.pt")
                acked[i], inflight[i] = inflight[i], None
                saves[0] += 1
            except Exception as e:              # noqa: BLE001 - sorted out just below
                # Ours to explain unless the server restarted under this client: during this
                # save, or between saves. An nfs-rs Client does not outlive its server's restart
                # (DefiniteFailure, recovery=Retry on its next use; the same against NFS-Ganesha,
                # see test_checkpoint_pattern_from_8_clients_survives_kill9).
                if not gen.moved_since(seen if c is None else c_gen):
                    errors.append(f"rank {i}: {type(e).__name__}: {e} (code {getattr(e, 'code_name', None)}, "
                                  f"op {getattr(e, 'operation', None)}, path {getattr(e, 'filename', None)})")
                    return
                if c is not None:
                    try:
                        c.close()
                    except Exception:           # noqa: BLE001 - the old connection is dead
                        pass
                c = None
        if c is not None:
            c.close()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    kills = 3
    try:
        for t in threads:
            t.start()
        for _ in range(kills):
            # let the ranks (which reconnect on their own schedule) save again first, so
            # each kill interrupts real work
            before, deadline = saves[0], time.monotonic() + 60
            while saves[0] == before and time.monotonic() < deadline and not errors:
                time.sleep(0.05)
            time.sleep(random.uniform(0.0, 1.0))
            with gen.lock:
                gen.down = True
            srv.kill9()
            srv.start(same_port=True)
            with gen.lock:
                gen.down, gen.value = False, gen.value + 1
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(120)
        assert not errors, "\n".join(errors)
        srv.kill9()
        srv.start(same_port=True)
        c = connect(srv.port)
        try:
            for i in range(4):
                if i not in acked and not c.exists(f"ckpt/rank{i}.pt"):
                    continue
                got = hashlib.sha256(read_file(c, f"ckpt/rank{i}.pt")).hexdigest()
                assert got in {acked.get(i), inflight.get(i)}, f"rank {i}: not a saved version"
        finally:
            c.close()
    finally:
        stop.set()
        srv.stop()
    print(f"\nnfs-rs ranks across {kills + 1} kill -9s: {saves[0]} acknowledged saves, "
          "each rank's last one verified")
    assert saves[0] > 0
    assert store_check(srv.cache_dir) == []
