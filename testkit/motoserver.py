"""moto in server mode as a subprocess on loopback (`moto_server -H 127.0.0.1 -p PORT`)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """A moto S3 server; all state lives in its memory and dies with it.

    `min_part_size` lowers moto's 5 MiB minimum multipart part size (S3_UPLOAD_PART_MIN_SIZE)
    so tests can use small objects with several parts. `spill_dir`: where moto writes the
    values it does not keep in its memory (its TMPDIR: every part and object over about
    5 MiB goes to a temporary file); None: the system's temporary directory."""

    def __init__(self, *, min_part_size: int | None = None, spill_dir: str | None = None):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        if min_part_size is not None:
            env["S3_UPLOAD_PART_MIN_SIZE"] = str(min_part_size)
        if spill_dir is not None:
            env["TMPDIR"] = spill_dir
        exe = shutil.which("moto_server")
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        self.proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(self.port)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not answer within 30 s")

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        req = urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
