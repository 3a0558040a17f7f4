"""Loopback helpers for tests that run NFS servers as processes or talk raw TCP to them."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, timeout: float = 1.0) -> bool:
    """Whether 127.0.0.1:port accepts a connection now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0, why=lambda: "") -> None:
    """Until 127.0.0.1:port accepts; fails if proc exits or the timeout passes (why(): context)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, why()
            time.sleep(0.1)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True when the server ends the connection (EOF or reset) within timeout; what it
    sends meanwhile is read and dropped."""
    try:
        while await asyncio.wait_for(reader.read(65536), timeout):
            pass
        return True
    except (ConnectionError, OSError):
        return True
    except asyncio.TimeoutError:
        return False
