"""ckptgw's kernel-client test harness: the real Linux NFSv4 client in a throw-away QEMU VM.

    from testkit.kclient import KernelClient
    kc = KernelClient(port, export="/checkpoints", vers="4.1")
    res = kc.run("dd if=/dev/zero of=/mnt/f bs=1M count=16 conv=fsync", timeout=300)
    res.check()            # AssertionError with stdout/stderr/dmesg unless rc == 0

See README.md beside this file.
"""

from __future__ import annotations

import os

from .image import KclientError, KclientUnavailable, default_cache_dir
from .vm import EXIT_HARNESS, EXIT_TIMEOUT, KclientResult, KernelClient, ensure_ready


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(cache_dir: str | os.PathLike | None = None) -> None:
    """pytest guard: make the VM available (installing packages if needed) or stop the test.

    Skips with the reason only when qemu & co. cannot be installed here; under CI (CI=true) that
    is a failure instead, so a CI machine without the harness cannot pass silently."""
    import pytest

    try:
        ensure_ready(cache_dir)
    except KclientUnavailable as e:
        if in_ci():
            pytest.fail(f"kernel-client harness unavailable in CI: {e}", pytrace=False)
        pytest.skip(f"kernel-client harness unavailable: {e}")


__all__ = ["KernelClient", "KclientResult", "KclientError", "KclientUnavailable", "require", "in_ci",
           "ensure_ready", "default_cache_dir", "EXIT_HARNESS", "EXIT_TIMEOUT"]
