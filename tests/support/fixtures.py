"""pytest fixtures any room can use: `from tests.support.fixtures import moto_server, fault_proxy`
in a conftest.py (tests/ must be importable: put the repo root on sys.path first)."""
from __future__ import annotations

import pytest

from testkit.faultproxy import ThreadedFaultProxy
from testkit.motoserver import MotoServer


@pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server subprocess on loopback for the whole session (part minimum 5 MiB)."""
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def fault_proxy(moto_server):
    """A fault-injecting proxy in front of moto_server; `.endpoint` for boto3, `.faults` to break it."""
    proxy = ThreadedFaultProxy(moto_server.port)
    yield proxy
    proxy.stop()
