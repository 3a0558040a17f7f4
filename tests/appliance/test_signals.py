"""Signals and systemd: SIGTERM drains and loses nothing acknowledged; SIGHUP reloads without
dropping clients; READY/RELOADING/STOPPING reach $NOTIFY_SOCKET."""
from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest

from testkit.appliance_live import nfs_client
from cache.api import ROOT_INO
from cache.store import Store

pytestmark = pytest.mark.timeout(300)


def read_whole(store, ino: int, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        data, eof = store.read(ino, len(out), size - len(out))
        out += data
        if eof or not data:
            break
    return bytes(out)


def test_sigterm_with_writes_in_flight_loses_nothing_acknowledged(live_daemon, tmp_path):
    d = live_daemon()
    acknowledged: dict[str, bytes] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(n: int) -> None:
        try:
            client = nfs_client(d)
        except Exception:            # noqa: BLE001 - the daemon may already be going away
            return
        i = 0
        while not stop.is_set():
            path, data = f"w{n}-{i}.bin", os.urandom(96 * 1024 + i)
            try:
                f = client.open(path, "wb")
                f.write(data)             # returns once the bytes are durable (WRITE + COMMIT)
            except Exception:        # noqa: BLE001 - refused once the server stops: never acknowledged
                return
            with lock:
                acknowledged[path] = data
            try:
                f.close()
            except Exception:        # noqa: BLE001
                return
            i += 1

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acknowledged) >= 6, d.read_log()[-3000:]

    d.signal(signal.SIGTERM)                     # writers are still going
    d.wait_notify("STOPPING=1", 30)
    assert d.proc.wait(90) == 0
    stop.set()          # writers blocked in a client retrying a gone server are daemon threads: leave them
    give_up = time.monotonic() + 3
    for t in threads:
        t.join(max(give_up - time.monotonic(), 0))
    events = [e["event"] for e in d.log_events()]
    assert "stopping" in events and events[-1] == "stopped"

    with lock:
        acked = dict(acknowledged)
    store = Store.open(str(d.cache_dir), evict=False)
    try:
        for path, data in acked.items():
            attr = store.lookup(ROOT_INO, path.encode())
            assert attr.size == len(data), path
            assert read_whole(store, attr.ino, attr.size) == data, path
        assert store.check() == []
    finally:
        store.close()


def test_restart_in_tryout_mode_uploads_again(live_daemon, tmp_path):
    d = live_daemon()
    client = nfs_client(d)
    with client.open("kept.bin", "wb") as f:
        f.write(b"k" * 50_000)
    client.close()
    assert d.cli("flush", "--wait", "--timeout", "120").exit_code == 0
    assert d.cli_json("verify")["ok"] == 1
    assert d.stop() == 0
    # the in-memory S3 went with the process: the next start must put the object back
    again = live_daemon(workdir=tmp_path / "second", cache_dir=d.cache_dir)
    assert any(e.get("event") == "tryout_reupload" and e.get("files") == 1 for e in again.log_events())
    assert again.cli("flush", "--wait", "--timeout", "120").exit_code == 0
    res = again.cli_json("verify")
    assert res["ok"] == 1 and res["mismatches"] == []
    assert again.stop() == 0


CONFIG = """
[log]
format = "json"

[[exports]]
path = "/checkpoints"
networks = [{networks}]
squash = "none"
secure = false
anon_uid = {anon}
{extra}
"""


RULES = """
[[retention.series]]
name = "run"
pattern = "run/step-{step}/**"
keep_last = 2
"""


def write_config(path, networks='"127.0.0.0/8"', anon=65534, extra=""):
    path.write_text(textwrap.dedent(CONFIG).format(networks=networks, anon=anon, extra=extra))


def test_sighup_reloads_exports_and_rules_without_dropping_clients(live_daemon, tmp_path):
    cfg = tmp_path / "config.toml"
    write_config(cfg)
    d = live_daemon(config=cfg)
    client = nfs_client(d)
    client.mkdir("run")
    with client.open("run/a.bin", "wb") as f:
        f.write(b"a" * 10_000)

    write_config(cfg, networks='"127.0.0.0/8", "10.1.0.0/16"', anon=1000, extra=RULES)
    d.signal(signal.SIGHUP)
    d.wait_notify("RELOADING=1", 30)
    d.wait_notify("READY=1", 30)
    [exp] = d.cli_json("exports")["exports"]
    assert exp["networks"] == ["127.0.0.0/8", "10.1.0.0/16"] and exp["anon_uid"] == 1000
    reloaded = [e for e in d.log_events() if e.get("event") == "reloaded"]
    assert reloaded and reloaded[-1]["applied"] == ["retention.series", "exports"]
    # the client connected before the reload carries on
    assert client.listdir("run") == ["a.bin"]
    with client.open("run/b.bin", "wb") as f:
        f.write(b"b" * 10_000)
    assert sorted(client.listdir("run")) == ["a.bin", "b.bin"]

    # the heartbeat keeps systemd's STATUS= current
    status = d.wait_notify_prefix("STATUS=", 30)
    assert "client(s)" in status and "dirty" in status

    # a broken file: the daemon keeps running on the old configuration and says where it is wrong
    cfg.write_text(cfg.read_text() + '\n[server]\nlease_time = "forever"\n')
    d.signal(signal.SIGHUP)
    d.wait_notify("READY=1", 30)
    failed = [e for e in d.log_events() if e.get("event") == "reload_failed"]
    assert failed and f"{cfg}:" in failed[-1]["error"] and "server.lease_time" in failed[-1]["error"]
    r = d.cli("reload")
    assert r.exit_code == 2 and "configuration unchanged" in r.stderr and "server.lease_time" in r.stderr
    assert d.proc.poll() is None and client.listdir("run")

    # settings that need a restart are reported, not half-applied
    write_config(cfg, networks='"127.0.0.0/8", "10.1.0.0/16"', anon=1000,
                 extra=RULES + '[server]\nlease_time = "45s"\n')
    res = d.cli_json("reload")
    assert res == {"applied": [], "needs_restart": ["server.lease_time"]}
    client.close()
    assert d.stop() == 0
