"""Fixtures for the end-to-end tests: ckptgw's server as a subprocess (or, to check the scenarios
themselves, NFS-Ganesha with CKPTGW_E2E_SERVER=ganesha) on a free loopback port.

The server (`CkptgwServer`, its command line `server_command()`) is in testkit/ckptgw_server.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `from testkit.kclient import ...` under any pytest import mode
    sys.path.insert(0, str(REPO))

from testkit.ckptgw_server import EXPORT, CkptgwServer  # noqa: E402
from testkit.kclient.ganesha import GaneshaServer  # noqa: E402
from testkit.loopback import free_port  # noqa: E402


def make_server(root: Path) -> CkptgwServer | GaneshaServer:
    kind = os.environ.get("CKPTGW_E2E_SERVER", "ckptgw")
    root.mkdir(parents=True, exist_ok=True)
    if kind == "ckptgw":
        return CkptgwServer(root, free_port())
    if kind == "ganesha":
        return GaneshaServer(root, free_port(), pseudo=EXPORT)
    raise pytest.UsageError(f"CKPTGW_E2E_SERVER must be ckptgw or ganesha, not {kind!r}")


def full_mode() -> bool:
    return os.environ.get("CKPTGW_KCLIENT_FULL") == "1"


@pytest.fixture(scope="session")
def kclient_ready() -> None:
    """Skip (or, under CI=true, fail) when the VM harness cannot be installed here."""
    from testkit.kclient import require

    require()


@pytest.fixture(scope="module")
def nfs_server(tmp_path_factory, kclient_ready):
    """One server for the module's VM boots."""
    server = make_server(tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_nfs_server(tmp_path, kclient_ready):
    """A server of its own, for tests that restart it."""
    server = make_server(tmp_path / "server")
    server.start()
    yield server
    server.stop()
