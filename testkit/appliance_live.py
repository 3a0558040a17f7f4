"""A live `ckptgw serve` (embedded S3) as a subprocess, and helpers to drive it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from appliance.cli import main as cli_main
from testkit.logjson import json_lines

START_TIMEOUT = 60.0


class LiveDaemon:
    """`python -m appliance.cli serve` with its own notify socket, cache dir and log file."""

    def __init__(self, workdir: Path, *extra: str, config: Path | None = None, cache_dir: Path | None = None,
                 bare: bool = False, env: dict[str, str] | None = None):
        """bare: only `--config FILE serve` (the file must set listen, admin socket, cache...),
        so every option comes from the file and a reload can change each of them. env: added
        to the daemon's environment (e.g. AWS_CA_BUNDLE for a test S3 over TLS)."""
        self.bare = bare
        self.env = env or {}
        self.workdir = workdir
        self.cache_dir = cache_dir or workdir / "cache"
        self.socket = workdir / "admin.sock"
        self.log_path = workdir / "daemon.log"
        self.notify_path = workdir / "notify.sock"
        self.extra = extra
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.status: dict = {}

    def start(self) -> "LiveDaemon":
        args = [sys.executable, "-m", "appliance.cli"]
        if self.config:
            args += ["--config", str(self.config)]
        args += ["serve"]
        if not self.bare:
            args += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                     "--cache-dir", str(self.cache_dir), "--admin-socket", str(self.socket),
                     "--log-format", "json", "--upload-settle", "0.2"]
        args += [*self.extra]
        if not self.config and "--export" not in self.extra:
            args += ["--export", "/checkpoints:127.0.0.0/8:rw:none:insecure"]   # nfs-rs: noresvport
        env = dict(os.environ, **self.env, NOTIFY_SOCKET=str(self.notify_path))
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, cwd=self.workdir, env=env)
        self.wait_notify("READY=1", START_TIMEOUT)
        self.status = self.cli_json("status")
        return self

    def messages(self, timeout: float) -> list[str]:
        self.notify.settimeout(timeout)
        try:
            return self.notify.recv(4096).decode().split("\n")
        except socket.timeout:
            return []

    def wait_notify(self, field: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}; log:\n{self.read_log()[-4000:]}")
            msg = self.messages(min(1.0, max(deadline - time.monotonic(), 0.01)))
            seen.append(msg)
            if field in msg:
                return msg
        raise AssertionError(f"no {field} from the daemon within {timeout} s (got {seen}); "
                             f"log:\n{self.read_log()[-4000:]}")

    def wait_notify_prefix(self, prefix: str, timeout: float) -> str:
        """The first field starting with `prefix` in the next notifications."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for field in self.messages(min(1.0, max(deadline - time.monotonic(), 0.01))):
                if field.startswith(prefix):
                    return field
        raise AssertionError(f"no {prefix}... notification within {timeout} s")

    @property
    def nfs_port(self) -> int:
        return int(self.status["listen"].rsplit(":", 1)[1])

    def nfs_url(self, export: str = "/checkpoints") -> str:
        return f"nfs://127.0.0.1:{self.nfs_port}{export}?version=4.1&noresvport=true"

    def cli(self, *args: str):
        """Run a `ckptgw` command in-process; returns the click Result (exit_code, stdout, stderr)."""
        return CliRunner().invoke(cli_main, ["--socket", str(self.socket), *args], catch_exceptions=False)

    def cli_json(self, *args: str):
        r = self.cli(*args, "--json")
        assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
        return json.loads(r.stdout)

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self) -> list[dict]:
        return json_lines(self.read_log())

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        return self.proc.returncode if self.proc else 0

    def close(self) -> None:
        self.stop()
        self.notify.close()


def nfs_client(daemon: LiveDaemon, export: str = "/checkpoints"):
    import nfs_rs
    return nfs_rs.Client.connect(daemon.nfs_url(export))
