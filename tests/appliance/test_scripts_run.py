"""`bash scripts/run` as the README shows it: extra arguments keep the try-out export (loopback,
writable by the local user at once); an --export of the user's replaces it."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


def readme_run_call() -> list[str]:
    """The `bash scripts/run --listen HOST:PORT ...` call the README suggests, as argv."""
    calls = re.findall(r"`(bash scripts/run --listen [^`]+)`", (REPO / "README.md").read_text())
    assert calls, "README.md shows no `bash scripts/run --listen ...` call"
    return shlex.split(calls[0])


def venv_for_run(tmp_path: Path) -> Path:
    """A CKPTGW_VENV for scripts/bootstrap.sh that is this venv, marked installed with the tryout
    extra (the test extra has it), so running scripts/run installs nothing."""
    ckptgw = Path(sys.executable).parent / "ckptgw"
    assert ckptgw.exists(), f"{ckptgw} is missing: the venv has no ckptgw entry point"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "bin" / "ckptgw").symlink_to(ckptgw)
    stamp = venv / ".ckptgw-installed[tryout]"
    stamp.touch()
    future = time.time() + 86400        # newer than any build input edited while the test runs
    os.utime(stamp, (future, future))
    return venv


class ScriptsRun:
    def __init__(self, tmp_path: Path, argv: list[str]):
        self.log_path = tmp_path / "run.log"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(tmp_path / "notify.sock"))
        env = {k: v for k, v in os.environ.items() if k not in ("CKPTGW_CONFIG",)}
        env.update(CKPTGW_VENV=str(venv_for_run(tmp_path)), NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
        self.log = open(self.log_path, "ab")
        # argv[1] is scripts/run, relative to the checkout; the cwd is a scratch directory
        # (./ckptgw-data is created there)
        self.proc = subprocess.Popen([argv[0], str(REPO / argv[1]), *argv[2:]], cwd=tmp_path, env=env,
                                     stdout=self.log, stderr=self.log)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"scripts/run exited with {self.proc.returncode}:\n{self.read_log()}"
            self.notify.settimeout(min(1.0, max(deadline - time.monotonic(), 0.01)))
            try:
                if "READY=1" in self.notify.recv(4096).decode().split("\n"):
                    return
            except socket.timeout:
                pass
        raise AssertionError(f"no READY=1 within {START_TIMEOUT} s:\n{self.read_log()}")

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[str]:
        out = []
        for line in self.read_log().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line).get("event"))
                except ValueError:
                    pass
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)        # bash exec'd ckptgw: this is the daemon
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.notify.close()


@pytest.fixture
def run(tmp_path):
    started = []

    def start(argv: list[str]) -> ScriptsRun:
        started.append(ScriptsRun(tmp_path, argv))
        started[-1].wait_ready()
        return started[-1]
    yield start
    for r in started:
        r.close()


def with_port(argv: list[str], port: int) -> list[str]:
    i = argv.index("--listen")
    host = argv[i + 1].rsplit(":", 1)[0]
    return [*argv[:i + 1], f"{host}:{port}", *argv[i + 2:]]


def test_the_readme_call_keeps_the_writable_tryout_export(run):
    import nfs_rs
    port = free_port()
    gw = run(with_port(readme_run_call(), port))
    events = gw.events()
    assert "nfsd_listening" in events and "nfs_listening" not in events, events
    assert "export_root_not_writable" not in events, gw.read_log()
    client = nfs_rs.Client.connect(f"nfs://127.0.0.1:{port}/checkpoints?version=4.1&noresvport=true")
    client.mkdir("run")
    with client.open("run/step_1.pt", "wb") as f:
        f.write(b"weights" * 1000)
    with client.open("run/step_1.pt", "rb") as f:
        assert f.read() == b"weights" * 1000


def test_an_export_of_the_users_replaces_the_tryout_export(run):
    port = free_port()
    gw = run(["bash", "scripts/run", "--listen", f"127.0.0.1:{port}", "--export", "/checkpoints"])
    # the user's export, with its defaults (root squashed): the fresh root is not writable, and
    # the daemon says so
    assert "export_root_not_writable" in gw.events(), gw.read_log()
