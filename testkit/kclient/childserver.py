"""What every test NFS server run as a child process shares: stop (SIGTERM, then SIGKILL),
restart, and the tail of its log for failure messages. Subclasses provide `start()` and set
`proc` (subprocess.Popen or None) and `log_path`."""
from __future__ import annotations

import signal
import subprocess


class ChildServer:
    STOP_WAIT = 20.0      # seconds SIGTERM gets before SIGKILL
    LOG_TAIL_LINES = 60
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.STOP_WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-(lines or self.LOG_TAIL_LINES):])
