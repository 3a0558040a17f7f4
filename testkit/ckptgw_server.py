"""`python -m nfsd` as a child process on a port the caller picked (the kernel-client tests and
bench/kclient_compare.py): restart() keeps the port and the cache dir, so a mount in a VM sees
the same server come back. (testkit/crash_server.py is the variant that lets the server pick
its port.)

The server command line is `server_command()`, the one place to change when `ckptgw serve`
replaces `python -m nfsd`.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from testkit.crash_server import EXPORT
from testkit.kclient.childserver import ChildServer
from testkit.loopback import listening

REPO = Path(__file__).resolve().parents[1]

__all__ = ["EXPORT", "CkptgwServer", "server_command"]


def server_command(port: int, cache_dir: Path, export: str = EXPORT) -> list[str]:
    """The gateway's NFS server, listening on 127.0.0.1:port with its store in cache_dir."""
    return [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir", str(cache_dir),
            "--export", export]


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
        while not listening(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before listening:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not listening on 127.0.0.1:{self.port} after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)
