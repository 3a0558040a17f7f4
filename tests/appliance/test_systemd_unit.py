"""packaging/systemd/ckptgw.service: the directives the daemon relies on, systemd's own check, and
the daemon's side of them (exit 78 on what a restart cannot fix, $STATE_DIRECTORY, the watchdog).
The unit booted under a real systemd: tests/ansible/test_deploy.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "systemd" / "ckptgw.service"


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
    from appliance import daemon
    from appliance.cli import EX_CONFIG
    from appliance.config import SERVICE_ADMIN_SOCKET
    assert EX_CONFIG == daemon.EX_CONFIG == 78 and SERVICE_ADMIN_SOCKET == "/run/ckptgw/admin.sock"


def test_a_bad_config_cannot_restart_loop():
    """RestartPreventExitStatus= is matched against the main process's status only (systemd's
    service_shall_restart): a failing ExecStartPre= would be restarted. The main process checks."""
    svc = directives()["Service"]
    assert "ExecStartPre" not in svc and "ExecCondition" not in svc
    assert svc["RestartPreventExitStatus"] == ["78"]


def test_hardening_watchdog_and_state_directory():
    svc = directives()["Service"]
    assert svc["SystemCallFilter"] == ["@system-service"]
    assert svc["ProtectSystem"] == ["strict"] and svc["StateDirectory"] == ["ckptgw"]
    assert "CacheDirectory" not in svc          # dirty data is state: nothing may wipe it
    watchdog = int(svc["WatchdogSec"][0].removesuffix("s"))
    from appliance.daemon import RATE_SAMPLE_SECONDS
    assert watchdog >= 4 * RATE_SAMPLE_SECONDS  # pinged every heartbeat tick, well inside half of it


def test_documents_the_unit_points_to_exist():
    named = re.findall(r"docs/[\w./-]+\.md", UNIT.read_text())
    assert named and all((REPO / path).is_file() for path in named), named


def run_cli(*args, env=None, cwd=None, block_moto=False, timeout=120):
    """`python -c <cli>` ARGS; with block_moto, as if the tryout extra were not installed."""
    prelude = ("import sys\n"
               "class NoMoto:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'moto' or name.startswith('moto.'):\n"
               "            raise ImportError('No module named ' + repr(name))\n"
               "sys.meta_path.insert(0, NoMoto())\n") if block_moto else ""
    code = prelude + "from appliance.cli import main\nmain()\n"
    environ = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "STATE_DIRECTORY")}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=environ, cwd=cwd or REPO, timeout=timeout)


def test_tryout_without_the_extra_exits_78_naming_it(tmp_path):
    r = run_cli("serve", "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "c"),
                "--admin-socket", str(tmp_path / "a.sock"), "--log-format", "json", block_moto=True)
    assert r.returncode == 78, r.stderr[-3000:]
    assert "'tryout' extra" in r.stderr and "ckptgw[tryout]" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_bad_config_exits_78(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nhigh_watermark = 7\n")
    r = run_cli("--config", str(bad), "serve")
    assert r.returncode == 78 and "high_watermark" in r.stderr, r.stderr


def test_an_unwritable_cache_dir_is_one_sentence_not_a_traceback(tmp_path):
    r = run_cli("serve", "--listen", "127.0.0.1:0", "--cache-dir", "/proc/ckptgw-cache",
                "--admin-socket", str(tmp_path / "a.sock"), "--log-format", "json")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "cannot create the cache directory /proc/ckptgw-cache" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_store_of_another_format_exits_78_not_a_restart_loop(tmp_path):
    import lmdb
    from cache.store import Store
    Store.open(str(tmp_path / "c"), capacity=1 << 30).close()
    env = lmdb.open(str(tmp_path / "c" / "index"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"ckptgw-store/999", db=env.open_db(b"meta", txn=txn))
    env.close()
    r = run_cli("serve", "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "c"),
                "--admin-socket", str(tmp_path / "a.sock"), "--log-format", "json")
    assert r.returncode == 78, r.stderr[-3000:]
    assert "ckptgw-store/999" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_cache_dir_defaults_to_the_state_directory_under_systemd(tmp_path):
    code = "from appliance import config; print(config.load(None).server.cache_dir)"
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    env["PYTHONPATH"] = str(REPO)
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert plain.stdout.strip() == "./ckptgw-data"
    env["STATE_DIRECTORY"] = f"{tmp_path}/state:{tmp_path}/other"      # systemd: colon-separated
    unit = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert unit.stdout.strip() == f"{tmp_path}/state/cache"


def test_watchdog_pings_only_when_systemd_asks_for_them(monkeypatch, tmp_path):
    import socket
    from appliance import sdnotify
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        assert not sdnotify.watchdog()                       # no WatchdogSec=
        monkeypatch.setenv("WATCHDOG_USEC", "30000000")
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
        assert not sdnotify.watchdog()                       # meant for another process
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        assert sdnotify.watchdog()
        assert listener.recv(100) == b"WATCHDOG=1"


def test_the_running_daemon_feeds_the_watchdog(live_daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)      # systemd sets it to the main pid
    d = live_daemon()
    d.wait_notify("WATCHDOG=1", 10)
    d.wait_notify("WATCHDOG=1", 10)                         # again: a heartbeat, not a one-off


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
