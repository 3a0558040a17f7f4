"""Fixtures for the gateway-pair tests (issue 38): the HA node image and a timing report."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))                       # pairvm, drbd
sys.path.insert(0, str(HERE.parent / "ansible"))    # guestimage, guestvm: the one image builder

from guestimage import ensure_ha_image  # noqa: E402
from pairvm import Pair  # noqa: E402
from playbook import REPORT as PLAYBOOK_REPORT  # noqa: E402
from playbook import ansible_bin  # noqa: E402,F401 (a fixture)
from deploy import S3_BUCKET  # noqa: E402
from testkit.motoserver import MotoServer  # noqa: E402

REPORT: list[str] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "ha: gateway pair tests (two qemu VMs, DRBD, the cluster stack)")


TIMELINES: list[dict[str, float]] = []


def pytest_terminal_summary(terminalreporter):
    if len(TIMELINES) > 1:
        steps = [k for k in TIMELINES[0] if all(k in t for t in TIMELINES)]
        REPORT.append(f"failover timeline over {len(TIMELINES)} runs, median / max s after the kill: " + ", ".join(
            f"{k} {statistics.median(t[k] for t in TIMELINES):.1f} / {max(t[k] for t in TIMELINES):.1f}"
            for k in steps))
    if REPORT or PLAYBOOK_REPORT:
        terminalreporter.section("gateway pair report")
        for line in PLAYBOOK_REPORT + REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def ha_image():
    t0 = time.monotonic()
    image, built = ensure_ha_image(log=lambda msg: None)
    REPORT.append(f"HA image {image.root.name}: {'built' if built else 'cached'}, {time.monotonic() - t0:.0f}s")
    return image



@pytest.fixture(scope="session")
def ckptgw_wheel(tmp_path_factory) -> Path:
    """ckptgw's wheel of this checkout (packaging/build-dist.sh, ~70 s), which the role installs;
    CKPTGW_HA_DIST=DIR takes an already built one from DIR instead."""
    given = os.environ.get("CKPTGW_HA_DIST")
    out = Path(given) if given else tmp_path_factory.mktemp("dist")
    if not given:
        t0 = time.monotonic()
        proc = subprocess.run(["bash", str(HERE.parents[1] / "packaging" / "build-dist.sh"), str(out)],
                              env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"packaging/build-dist.sh failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        REPORT.append(f"packaging/build-dist.sh: {time.monotonic() - t0:.0f}s")
    wheels = list(out.glob("ckptgw-*-cp311-cp311-linux_x86_64.whl"))
    if len(wheels) != 1:
        pytest.fail(f"no single CPython 3.11 x86-64 wheel of ckptgw (the guests' Python) in {out}: "
                    f"{sorted(p.name for p in out.iterdir())}")
    return wheels[0]


@pytest.fixture
def s3():
    """The pair's S3, outside both nodes: moto in server mode on the host's loopback, which each
    node reaches through its guestfwd (pairvm.S3_ADDRESS), with the gateway's bucket made and
    versioned, so a test can count how many times each key was written."""
    server = MotoServer()
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=S3_BUCKET)
    client.put_bucket_versioning(Bucket=S3_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    server.client = client
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pair(ha_image, s3):
    """Two gateway VMs of the HA image (not started), reaching the `s3` fixture's server; killed
    after the test, their files removed unless CKPTGW_HA_KEEP_VM=1."""
    p = Pair(ha_image, s3_port=s3.port)
    try:
        yield p
    finally:
        p.stop(keep=os.environ.get("CKPTGW_HA_KEEP_VM") == "1")


@pytest.fixture
def timelines():
    """Each failover's timeline (step -> seconds after the kill), summed up at the end of the run."""
    return TIMELINES


@pytest.fixture
def report():
    """report(line): a line for the run's closing "gateway pair report"."""
    return REPORT.append
