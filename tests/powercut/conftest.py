"""Fixtures for the power-cut test: the guest image and the ckptgw wheel of tests/ansible.

The lines of `report()` are printed at the end of the run ("power-cut report"), so a long run's
figures (cuts, boots, acknowledged files checked, lost, torn) can be quoted as they are.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ansible"))   # guestimage, guestvm

import pytest  # noqa: E402

from tests.ansible.conftest import ckptgw_dist, guest_image  # noqa: E402,F401  (shared fixtures)

REPORT: list[str] = []


def report(line: str) -> None:
    REPORT.append(line)
    print(line, flush=True)


@pytest.fixture(scope="session")
def ckptgw_wheel(ckptgw_dist) -> Path:
    """The ckptgw wheel of this checkout, from tests/ansible's packaging/build-dist.sh run."""
    wheels = list(ckptgw_dist.glob("ckptgw-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def pytest_configure(config):
    config.addinivalue_line("markers", "powercut: power-cut test of the gateway in a qemu VM (slow, root)")
    config.addinivalue_line("markers", "ansible: tests that boot the Debian guest image of tests/ansible")


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("power-cut report")
        for line in REPORT:
            terminalreporter.write_line(line)
