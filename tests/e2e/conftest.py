"""Fixtures for the end-to-end tests: ckptgw's server as a subprocess (or, to check the scenarios
themselves, NFS-Ganesha with CKPTGW_E2E_SERVER=ganesha) on a free loopback port.

The server command line is `server_command()`, the one place to change when `ckptgw serve`
replaces `python -m nfsd`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `from tests.kclient import ...` under any pytest import mode
    sys.path.insert(0, str(REPO))

from tests.kclient.childserver import ChildServer  # noqa: E402
from tests.kclient.ganesha import GaneshaServer  # noqa: E402

EXPORT = "/checkpoints"


def server_command(port: int, cache_dir: Path, export: str = EXPORT) -> list[str]:
    """The gateway's NFS server, listening on 127.0.0.1:port with its store in cache_dir."""
    return [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir", str(cache_dir),
            "--export", export]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class CkptgwServer(ChildServer):
    """server_command() as a child process; restart() keeps the port and the cache dir."""

    def __init__(self, root: Path, port: int, export: str = EXPORT):
        self.root, self.port, self.export = root, port, export
        self.cache_dir = root / "cache"
        self.log_path = root / "server.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 30) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"===== start #{self.starts}: {' '.join(server_command(self.port, self.cache_dir))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(server_command(self.port, self.cache_dir, self.export), cwd=REPO,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before listening:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not listening on 127.0.0.1:{self.port} after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)



def make_server(root: Path) -> CkptgwServer | GaneshaServer:
    kind = os.environ.get("CKPTGW_E2E_SERVER", "ckptgw")
    root.mkdir(parents=True, exist_ok=True)
    if kind == "ckptgw":
        return CkptgwServer(root, free_port())
    if kind == "ganesha":
        return GaneshaServer(root, free_port(), pseudo=EXPORT)
    raise pytest.UsageError(f"CKPTGW_E2E_SERVER must be ckptgw or ganesha, not {kind!r}")


def full_mode() -> bool:
    return os.environ.get("CKPTGW_KCLIENT_FULL") == "1"


@pytest.fixture(scope="session")
def kclient_ready() -> None:
    """Skip (or, under CI=true, fail) when the VM harness cannot be installed here."""
    from tests.kclient import require

    require()


@pytest.fixture(scope="module")
def nfs_server(tmp_path_factory, kclient_ready):
    """One server for the module's VM boots."""
    server = make_server(tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_nfs_server(tmp_path, kclient_ready):
    """A server of its own, for tests that restart it."""
    server = make_server(tmp_path / "server")
    server.start()
    yield server
    server.stop()
