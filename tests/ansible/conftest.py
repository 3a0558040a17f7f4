"""Fixtures for the Ansible role tests: controller tools, the ckptgw (platform) wheel, the guest image.

Everything slow is cached outside the repository: the controller venv with ansible-core and
ansible-lint (from requirements.txt) in /var/cache/ckptgw-ansible-tools/<hash>, the guest image
in /var/cache/ckptgw-ansible-image/<hash> (see guestimage.py). Timings and PLAY RECAP lines are
collected in playbook.REPORT and printed at the end of the run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))          # guestimage, guestvm, playbook

from guestimage import REPO, ensure_image  # noqa: E402
from playbook import REPORT, ansible_bin, report  # noqa: E402,F401 (ansible_bin: a fixture)

# The wheel tags the guest's python3 installs (Debian 12: CPython 3.11.2, x86-64, glibc 2.36).
GUEST_WHEEL_TAGS = "-cp311-cp311-linux_x86_64.whl"


def pytest_configure(config):
    config.addinivalue_line("markers", "ansible: Ansible role tests (lint, rendering, deployment to a qemu VM)")


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("ansible deployment report")
        for line in REPORT:
            terminalreporter.write_line(line)



@pytest.fixture(scope="session")
def ckptgw_dist(tmp_path_factory) -> Path:
    """packaging/build-dist.sh's output for this checkout (wheel, sdist, constraints): the role's
    ckptgw_dist_dir, as an operator's controller has it."""
    out = tmp_path_factory.mktemp("dist")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "packaging" / "build-dist.sh"), str(out)],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"packaging/build-dist.sh failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    wheels = list(out.glob("ckptgw-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    # A platform wheel (compiled nfsd/native): the guest's python3 (Debian 12) is CPython 3.11 on x86-64.
    if not wheels[0].name.endswith(GUEST_WHEEL_TAGS):
        pytest.fail(f"packaging/build-dist.sh built {wheels[0].name} with {sys.executable}: the guest's Debian 12 "
                    f"python3 (3.11, x86-64) installs only a ...{GUEST_WHEEL_TAGS} wheel of ckptgw; run the tests "
                    "with a CPython 3.11")
    report(f"packaging/build-dist.sh: {time.monotonic() - t0:.0f}s")
    return out


@pytest.fixture(scope="session")
def guest_image():
    t0 = time.monotonic()
    image, built = ensure_image(log=lambda msg: None)
    report(f"guest image {image.root.name}: {'built (uncached)' if built else 'cached'}, "
           f"{time.monotonic() - t0:.0f}s")
    return image
