"""Run ansible-playbook against the repository's playbook and read its PLAY RECAP."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from guestimage import REPO

ANSIBLE_DIR = REPO / "ansible"
TOOLS_CACHE = Path(os.environ.get("CKPTGW_ANSIBLE_TOOLS_CACHE", "/var/cache/ckptgw-ansible-tools"))
# Lines for the end-of-run summary (conftest prints them): timings and PLAY RECAP lines.
REPORT: list[str] = []


def report(line: str) -> None:
    REPORT.append(line)


_RECAP = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$")


@dataclass
class PlaybookRun:
    returncode: int
    output: str
    seconds: float

    @property
    def recap_lines(self) -> list[str]:
        lines = self.output.splitlines()
        try:
            start = max(i for i, line in enumerate(lines) if line.startswith("PLAY RECAP"))
        except ValueError:
            return []
        return [line.strip() for line in lines[start + 1:] if _RECAP.match(line.strip())]

    def recap(self, host: str) -> dict[str, int]:
        for line in self.recap_lines:
            m = _RECAP.match(line)
            if m.group(1) == host:
                return {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
        raise AssertionError(f"no PLAY RECAP line for {host}:\n{self.output[-3000:]}")

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


def ansible_env(ansible_bin: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "PATH": f"{ansible_bin}:{env.get('PATH', '')}",
    })
    return env


def run_playbook(ansible_bin: Path, inventory: Path, *args: str, playbook: Path | None = None,
                 timeout: float = 1800) -> PlaybookRun:
    cmd = [str(ansible_bin / "ansible-playbook"), "-i", str(inventory), str(playbook or ANSIBLE_DIR / "site.yml"),
           *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=ansible_env(ansible_bin), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return PlaybookRun(proc.returncode, proc.stdout, time.monotonic() - t0)


class ToolsError(RuntimeError):
    pass


def ensure_tools() -> Path:
    """bin/ of a venv holding requirements.txt (ansible-core, ansible-lint), made when missing
    (cached in TOOLS_CACHE under the file's hash); tests/ansible and tests/ha both drive the role with it."""
    reqs = Path(__file__).resolve().parent / "requirements.txt"
    venv = TOOLS_CACHE / hashlib.sha256(reqs.read_bytes()).hexdigest()[:16]
    done = venv / ".complete"
    if not done.exists():
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "-r", str(reqs)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolsError(f"pip install -r {reqs} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        done.write_text("ok\n")
        report(f"controller tools installed into {venv} in {time.monotonic() - t0:.0f}s")
    return venv / "bin"



@pytest.fixture(scope="session")
def ansible_bin() -> Path:
    """bin/ of the controller tools (ansible-core, ansible-lint: ensure_tools' cached venv),
    for tests/ansible and tests/ha alike (each conftest imports this fixture)."""
    try:
        return ensure_tools()
    except ToolsError as e:
        pytest.fail(str(e))