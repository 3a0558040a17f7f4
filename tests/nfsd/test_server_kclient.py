"""Session-layer behaviour with the real Linux NFSv4 client (a QEMU VM, testkit/kclient):
several connections per mount (nconnect), and a server restart under an open file
(new boot epoch: BADSESSION, STALE_CLIENTID, a fresh EXCHANGE_ID, reclaim refused
with NO_GRACE, the client carries on), and every connection dropped mid-write (the
session carries on over the new one). Slow (a VM boot each): marked `kclient`."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.kclient import KernelClient, require

pytestmark = [pytest.mark.kclient, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
EXPORT = "/checkpoints"


@pytest.fixture(scope="module")
def kclient_ready():
    require()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m nfsd` on a fixed port and cache dir, restartable."""

    def __init__(self, root: Path):
        self.port = _free_port()
        self.cache = root / "cache"
        self.log = open(root / "server.log", "a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{self.port}", "--cache-dir",
             str(self.cache), "--export", EXPORT], stdout=self.log, stderr=self.log, cwd=REPO)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start; see {self.log.name}")
                time.sleep(0.1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def restart(self) -> None:
        assert self.stop() == 0
        self.start()


@pytest.fixture
def server(tmp_path, kclient_ready):
    s = ServerProcess(tmp_path)
    s.start()
    yield s
    if s.proc.poll() is None:
        s.stop()
    s.log.close()


def test_nconnect_spreads_one_session_over_connections(server):
    cmd = r'''set -e
cd /mnt
for i in 1 2 3 4; do head -c 4194304 /dev/urandom > /tmp/s$i; done
for i in 1 2 3 4; do dd if=/tmp/s$i of=f$i bs=1M conv=fsync 2>/dev/null & done
wait
sync; echo 3 > /proc/sys/vm/drop_caches
for i in 1 2 3 4; do cmp /tmp/s$i f$i; done
echo CMP_OK'''
    res = KernelClient(server.port, export=EXPORT, vers="4.2", opts="nconnect=4").run(cmd, timeout=600)
    res.check()
    assert "CMP_OK" in res.stdout


def test_server_restart_under_an_open_file(server):
    cmd = r'''set -e
python3 - <<'PY'
import os, subprocess
fd = os.open("/mnt/across-restart", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b"A" * 100000)
os.fsync(fd)
subprocess.run(["sh", "-c", '. "$KCLIENT_GUEST_LIB"; kc_host_call restart'], check=True)
os.write(fd, b"B" * 100000)
os.fsync(fd)
os.close(fd)
PY
echo 3 > /proc/sys/vm/drop_caches
python3 -c 'd = open("/mnt/across-restart", "rb").read()
assert d == b"A" * 100000 + b"B" * 100000, len(d)
print("DATA_OK")'
echo more > /mnt/after && cat /mnt/after'''
    res = KernelClient(server.port, export=EXPORT, vers="4.1").run(
        cmd, timeout=600, host_calls={"restart": server.restart})
    res.check()
    assert "DATA_OK" in res.stdout and "more" in res.stdout
    log = Path(server.log.name).read_text()
    assert "NFS4ERR_STALE_CLIENTID" in log          # the old clientid was refused ...
    assert log.count("session_created") >= 2       # ... and the client set up anew


def test_connection_drop_mid_write_is_survived(tmp_path, kclient_ready):
    """The server aborts every TCP connection while a file is being written: the client
    reconnects, reuses its session on the new connection and nothing is lost."""
    from cache.store import Store
    from nfsd.exports import Exports
    from nfsd.server import NfsServer
    from tests.nfsd.conftest import ServerThread

    store = Store.open(str(tmp_path / "cache"))
    st = ServerThread(lambda: NfsServer(store, Exports.single(EXPORT, root_squash=False, secure=False))).start()
    dropped, created = [], []
    mgr = st.server.sessions
    real_new_session = mgr.new_session

    def counting_new_session(*args, **kw):
        created.append(1)
        return real_new_session(*args, **kw)
    st.call(setattr, mgr, "new_session", counting_new_session)

    def drop_connections():
        def abort_all():
            dropped.append(len(st.server.connections))
            for conn in list(st.server.connections):
                conn.transport.abort()
        st.call(abort_all)
    cmd = r'''set -e
python3 - <<'PY'
import os, subprocess
fd = os.open("/mnt/across-drop", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b"A" * 300000)
os.fsync(fd)
subprocess.run(["sh", "-c", '. "$KCLIENT_GUEST_LIB"; kc_host_call drop'], check=True)
os.write(fd, b"B" * 300000)
os.fsync(fd)
os.close(fd)
PY
echo 3 > /proc/sys/vm/drop_caches
python3 -c 'd = open("/mnt/across-drop", "rb").read()
assert d == b"A" * 300000 + b"B" * 300000, len(d)
print("DATA_OK")'
'''
    try:
        res = KernelClient(st.port, export=EXPORT, vers="4.1").run(
            cmd, timeout=600, host_calls={"drop": drop_connections})
        res.check()
        assert "DATA_OK" in res.stdout and dropped and dropped[0] >= 1
        assert len(created) == 1             # the session outlived its connection
    finally:
        st.stop()
        store.close()
