"""Fixtures for the uploader tests: one moto server per session, a fault proxy per test."""
from __future__ import annotations

import os
import sys

import pytest

# tests/ is not a package on sys.path by default; make `tests.support` importable.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support.faultproxy import ThreadedFaultProxy  # noqa: E402
from tests.support.motoserver import MotoServer  # noqa: E402

SMALL_PART = 256 * 1024   # moto's minimum part size is lowered to this for tests


@pytest.fixture(scope="session")
def moto():
    server = MotoServer(min_part_size=SMALL_PART)
    yield server
    server.stop()


@pytest.fixture
def proxy(moto):
    p = ThreadedFaultProxy(moto.port, seed=1234)
    yield p
    p.stop()
