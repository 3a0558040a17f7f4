"""Facts about the host a report was measured on: cores, memory, kernel, load, versions."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY_PACKAGES = ("lmdb", "boto3", "moto", "structlog", "nfs-rs", "matplotlib")
DEB_PACKAGES = ("nfs-ganesha", "nfs-ganesha-vfs", "qemu-system-x86")


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def _mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _py_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _deb_version(name: str) -> str:
    return _run(["dpkg-query", "-W", "-f", "${Version}", name]) or "not installed"


def facts() -> dict[str, str]:
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    # the report's own output (bench/results, rewritten as the run goes) is not a change
    # of the code under test
    dirty = " (with uncommitted changes)" if _run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"]) else ""
    out = {
        "cpus (usable / online)": f"{len(os.sched_getaffinity(0))} / {os.cpu_count()}",
        "cpu model": _cpu_model(),
        "memory": f"{_mem_total() / (1 << 30):.1f} GiB",
        "kernel": platform.release(),
        "os": _run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) or platform.platform(),
        "python": platform.python_version(),
        "ckptgw commit": f"{commit}{dirty}" if commit else "unknown",
    }
    out.update({f"python: {p}": _py_version(p) for p in PY_PACKAGES})
    out.update({f"debian: {p}": _deb_version(p) for p in DEB_PACKAGES})
    return out
