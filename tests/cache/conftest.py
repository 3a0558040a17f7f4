"""Fixtures for store tests: a fresh store per test, and an check() on teardown."""
from __future__ import annotations

import pytest

from cache.store import Store


@pytest.fixture
def store_dir(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(store_dir):
    s = Store.open(store_dir)
    yield s
    if not s._closed:
        assert s.check() == []
        s.close()
