"""Fixtures for the retention tests: one moto server per session (tests/support), a store per test."""
from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for p in (_ROOT, _HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from testkit.faultproxy import ThreadedFaultProxy  # noqa: E402
from testkit.motoserver import MotoServer  # noqa: E402

from tests.retention import rhelp  # noqa: E402


@pytest.fixture(scope="session")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(moto):
    p = ThreadedFaultProxy(moto.port, seed=7)
    yield p
    p.stop()


@pytest.fixture
def bucket(moto):
    return rhelp.new_bucket(moto.endpoint)


@pytest.fixture
def locked_bucket(moto):
    return rhelp.new_bucket(moto.endpoint, object_lock=True)


@pytest.fixture
def store(tmp_path):
    from cache.store import Store
    s = Store.open(str(tmp_path / "store"), capacity=1 << 30)
    yield s
    s.close()
