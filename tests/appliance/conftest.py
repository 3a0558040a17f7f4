"""Fixtures of the appliance tests (helpers live in appliance_live.py)."""
from __future__ import annotations

import pytest

from testkit.appliance_live import LiveDaemon


@pytest.fixture
def live_daemon(tmp_path):
    daemons = []

    def make(*extra, config=None, workdir=None, cache_dir=None, bare=False) -> LiveDaemon:
        if workdir is not None:
            workdir.mkdir(exist_ok=True)
        d = LiveDaemon(workdir or tmp_path, *extra, config=config, cache_dir=cache_dir, bare=bare)
        daemons.append(d)
        return d.start()
    yield make
    for d in daemons:
        d.close()
