"""packaging/systemd/ckptgw.service: the directives the daemon relies on, and systemd's own check."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "ckptgw.service"


def directives() -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key, []).append(value)
    return out


def test_unit_has_what_the_daemon_relies_on():
    d = directives()
    svc = d["Service"]
    assert svc["Type"] == ["notify"]                        # READY/RELOADING/STOPPING via sd_notify
    assert svc["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["78"]        # appliance.cli.EX_CONFIG
    assert svc["LimitNOFILE"] == ["65536"]
    assert svc["User"] == ["ckptgw"]
    assert svc["AmbientCapabilities"] == ["CAP_NET_BIND_SERVICE"]
    assert svc["RuntimeDirectory"] == ["ckptgw"]            # /run/ckptgw/admin.sock (config.SERVICE_ADMIN_SOCKET)
    assert any(" serve" in v for v in svc["ExecStart"])
    assert d["Install"]["WantedBy"] == ["multi-user.target"]
    from appliance.cli import EX_CONFIG
    from appliance.config import SERVICE_ADMIN_SOCKET
    assert EX_CONFIG == 78 and SERVICE_ADMIN_SOCKET == "/run/ckptgw/admin.sock"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_accepts_the_unit(tmp_path):
    # point the commands at an executable that exists here, so only the unit itself is judged
    fake = tmp_path / "ckptgw"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    unit = tmp_path / "ckptgw.service"
    unit.write_text(UNIT.read_text().replace("/opt/ckptgw/venv/bin/ckptgw", str(fake)))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "ckptgw.service" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
