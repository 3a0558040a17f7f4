"""`python -m nfsd` as a child process that tests and benchmarks can kill -9 and restart.

The server listens on 127.0.0.1:0 and the port is read from its own `nfsd_listening` log line,
so there is no window in which another process could take a port we picked (the shared
machine runs other helpers' servers). Each start may get a different port; callers reconnect
to `server.port` after `restart()`.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPORT = "/checkpoints"
_LISTENING = re.compile(rb"nfsd_listening\b.*\bport=(\d+)")


class ServerProcess:
    """One store directory, served by successive `python -m nfsd` processes."""

    def __init__(self, cache_dir: Path, log_path: Path, *, export: str = EXPORT):
        self.cache_dir = Path(cache_dir)
        self.log_path = Path(log_path)
        self.export = export
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.kills = 0
        self._killed = False

    def command(self, port: int = 0) -> list[str]:
        return [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir",
                str(self.cache_dir), "--export", self.export,
                # No grace period after a restart: the workload's clients start afresh
                # rather than reclaim (tests/nfsd/test_grace.py covers reclaim).
                "--grace-time", "0",
                "--log-level", "info"]          # info: the port line

    def start(self, timeout: float = 60, *, same_port: bool = False, wait: bool = True) -> int:
        """Start a server process and return its port once it listens. same_port: listen
        where the previous process did (for clients that reconnect on their own).
        wait=False: return at once (to kill it during start-up and crash recovery)."""
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        self.starts += 1
        self._killed = False
        with open(self.log_path, "ab") as log:
            log.write(f"===== start #{self.starts}\n".encode())
            offset = log.tell()
            self.proc = subprocess.Popen(self.command(self.port if same_port else 0), cwd=REPO,
                                         stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        if not wait:
            return 0
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                m = _LISTENING.search(log.read())
            if m:
                self.port = int(m.group(1))
                return self.port
            if self.proc.poll() is not None:
                raise RuntimeError(f"nfsd exited with {self.proc.returncode} before listening:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"nfsd not listening after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def send_kill(self) -> None:
        """SIGKILL the server process (a crash: no cleanup runs); does not wait (an event
        loop may call it)."""
        if self.proc is not None and self.proc.poll() is None and not self._killed:
            os.kill(self.proc.pid, signal.SIGKILL)
            self._killed = True
            self.kills += 1

    def kill9(self) -> None:
        """SIGKILL the server process if it still runs, and reap it."""
        self.send_kill()
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (a clean stop that closes the store); returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode

    def restart_after_crash(self) -> int:
        self.kill9()
        return self.start()

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_bytes().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def log_errors(self) -> list[str]:
        """Lines of the server log that report a fault (tracebacks, SERVERFAULT)."""
        try:
            text = self.log_path.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return []
        return [ln for ln in text.splitlines()
                if "Traceback" in ln or "SERVERFAULT" in ln or "[error" in ln]


def store_check(cache_dir: Path) -> list[str]:
    """Open the store in a fresh process (crash recovery runs); return Store.check()'s problems."""
    code = ("import json, sys; from cache.store import Store\n"
            "s = Store.open(sys.argv[1])\n"
            "try:\n    problems = s.check()\nfinally:\n    s.close()\n"
            "print('STORE_CHECK ' + json.dumps(problems))\n")
    out = subprocess.run([sys.executable, "-c", code, str(cache_dir)], cwd=REPO, check=True,
                         capture_output=True, timeout=120)
    lines = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("STORE_CHECK ")]
    return json.loads(lines[-1].split(" ", 1)[1])
