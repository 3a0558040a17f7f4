"""Start-up failures are one clear sentence and a non-zero exit; small daemon helpers."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from appliance.daemon import RateMeter, export_id

pytestmark = pytest.mark.timeout(120)


def serve(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "appliance.cli", "serve", "--cache-dir", str(tmp_path / "c"),
                           "--admin-socket", str(tmp_path / "a.sock"), "--log-format", "json", *args],
                          capture_output=True, text=True, timeout=100, cwd=tmp_path)


def events(stderr: str) -> list[str]:
    return [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]


def taken_port(sock: socket.socket) -> int:
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock.getsockname()[1]


@pytest.mark.parametrize("flag, what", [("--listen", "NFS"), ("--admin-listen", "the admin API"),
                                        ("--metrics-listen", "metrics")])
def test_port_in_use_is_a_clear_error_before_the_store_and_the_embedded_s3(tmp_path, flag, what):
    with socket.socket() as taken:
        port = taken_port(taken)
        args = [] if flag == "--listen" else ["--listen", "127.0.0.1:0"]
        if flag == "--admin-listen":
            args += ["--admin-token", "t0ken"]
        r = serve(tmp_path, *args, flag, f"127.0.0.1:{port}")
    assert r.returncode == 1, r.stderr
    assert (f"ckptgw: cannot listen for {what} on 127.0.0.1:{port}: Address already in use "
            "(another process listens there: ss -ltnp shows which)") in r.stderr
    # nothing was started: no cache directory, no store, no in-memory S3, no admin socket
    assert not (tmp_path / "c").exists()
    started = {"embedded_s3_tryout_mode", "store_open", "uploader_started", "admin_listening"}
    assert not started & set(events(r.stderr)), r.stderr
    assert "startup_failed" in events(r.stderr)
    assert not (tmp_path / "a.sock").exists()


def test_two_listeners_on_one_port_are_refused_at_once(tmp_path):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    r = serve(tmp_path, "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{port}")
    assert r.returncode == 1, r.stderr
    assert (f"ckptgw: cannot listen for metrics on 127.0.0.1:{port}: Address already in use "
            f"(NFS is configured on port {port} too)") in r.stderr
    assert not (tmp_path / "c").exists()


def test_an_address_not_on_this_host_is_a_clear_error(tmp_path):
    r = serve(tmp_path, "--listen", "192.0.2.1:0", "--metrics-listen", "192.0.2.1:9464")    # TEST-NET-1
    assert r.returncode == 1, r.stderr
    assert "ckptgw: cannot listen for metrics on 192.0.2.1:9464: Cannot assign requested address" in r.stderr
    assert not (tmp_path / "c").exists()


def test_second_daemon_on_the_same_cache_is_refused(tmp_path):
    from cache.store import Store
    store = Store.open(str(tmp_path / "c"), evict=False)
    try:
        r = serve(tmp_path, "--listen", "127.0.0.1:0")
    finally:
        store.close()
    assert r.returncode == 1
    assert "ckptgw: cannot open the cache in" in r.stderr and "another process" in r.stderr


def test_rate_meter():
    m = RateMeter(window=10)
    assert m.rate() is None
    m.sample(0, now=100.0)
    m.sample(1000, now=102.0)
    assert m.rate() == 500.0
    for t in range(103, 130):
        m.sample(1000 + (t - 102) * 10, now=float(t))
    assert m.rate() == pytest.approx(10.0)


def test_export_ids_are_stable_and_in_range():
    assert export_id("/checkpoints") == export_id("/checkpoints")
    assert export_id("/a") != export_id("/b")
    assert all(1 <= export_id(f"/e{i}") <= 0xFFFF for i in range(1000))


def test_tryout_defaults_cache_dir_and_warning_and_a_json_only_log(tmp_path):
    """No config, no flags but a free port: ./ckptgw-data, embedded S3, a loud warning. The log
    (stderr to a file, no controlling terminal) is JSON lines only: the banner is for a terminal,
    and no start-up event is logged twice or under two names."""
    import json
    import os
    import signal
    import time
    from appliance.admin import AdminClient
    err = open(tmp_path / "err.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--listen", "127.0.0.1:0",
                             "--log-format", "json"], stdout=err, stderr=err, cwd=tmp_path,
                            start_new_session=True,         # no /dev/tty: the banner has nowhere to go
                            env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
    sock = tmp_path / "ckptgw-data" / "admin.sock"
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with AdminClient(socket_path=str(sock), timeout=10) as client:
                    status = client.call("status")
                break
            except OSError:
                time.sleep(0.2)
        assert status is not None, (tmp_path / "err.log").read_text()
        assert status["tryout"] and status["s3"]["endpoint"].startswith("http://127.0.0.1:")
        assert status["cache"]["dir"] == str(tmp_path / "ckptgw-data") and not status["cache"]["evicts"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        err.close()
    text = (tmp_path / "err.log").read_text()
    assert "TRY-OUT MODE" not in text, text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]     # every line is JSON
    warnings = [r for r in records if r["event"] == "embedded_s3_tryout_mode"]
    assert warnings and warnings[0]["level"] == "warning"
    names = [r["event"] for r in records]
    for once in ("embedded_s3_tryout_mode", "store_open", "uploader_started", "nfsd_listening", "ready"):
        assert names.count(once) == 1, (once, names)
    assert "nfs_listening" not in names
    ready = next(r for r in records if r["event"] == "ready")
    assert ready["exports"] == ["/checkpoints"] and ready["bucket"]


def test_the_tryout_banner_goes_to_the_terminal_only(tmp_path, monkeypatch):
    import builtins
    import os
    import pty
    from appliance.embedded_s3 import banner, show_banner
    text = banner("http://127.0.0.1:1")
    assert "TRY-OUT MODE" in text and "LOST when ckptgw stops" in text
    primary, secondary = pty.openpty()
    try:
        with open(secondary, "w", closefd=False) as tty:        # stderr is a terminal: there
            assert show_banner(text, tty)
        assert "TRY-OUT MODE" in os.read(primary, 4096).decode()
    finally:
        os.close(primary)
        os.close(secondary)
    real_open = builtins.open

    def no_tty(path, *a, **kw):
        if path == "/dev/tty":
            raise OSError(6, "No such device or address")
        return real_open(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", no_tty)
    with real_open(tmp_path / "log", "w") as log_file:         # a file (or pipe, or journal): not there
        assert not show_banner(text, log_file)
    assert (tmp_path / "log").read_text() == ""


def test_cli_finds_the_socket_through_the_config(tmp_path):
    from click.testing import CliRunner
    from appliance.cli import main
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[admin]\nsocket = "{tmp_path}/x.sock"\n')
    r = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert r.exit_code == 7 and f"no daemon is listening on {tmp_path}/x.sock" in r.stderr
    cfg.write_text(f'[server]\ncache_dir = "{tmp_path}/cache"\n')
    r = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert r.exit_code == 7 and f"{tmp_path}/cache/admin.sock" in r.stderr
    cfg.write_text('[server]\ncache_dir = 5\n')
    r = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert r.exit_code == 2 and "server.cache_dir" in r.stderr


def test_group_options_work_after_the_command(tmp_path):
    """`ckptgw status --socket S`, `ckptgw serve --config X`: where people type them; there they
    win over the same option before the command."""
    from click.testing import CliRunner
    from appliance.cli import main
    r = CliRunner().invoke(main, ["status", "--socket", f"{tmp_path}/x.sock"])
    assert r.exit_code == 7 and f"no daemon is listening on {tmp_path}/x.sock" in r.stderr
    r = CliRunner().invoke(main, ["--socket", f"{tmp_path}/a.sock", "retention", "plan", "--socket",
                                  f"{tmp_path}/b.sock", "--json"])
    assert r.exit_code == 7 and f"{tmp_path}/b.sock" in r.stderr and "a.sock" not in r.stderr
    assert json.loads(r.stdout)["code"] == "no_daemon"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[admin]\nsocket = "{tmp_path}/y.sock"\n')
    r = CliRunner().invoke(main, ["flush", "--config", str(cfg)])
    assert r.exit_code == 7 and f"{tmp_path}/y.sock" in r.stderr
    cfg.write_text('[upload]\nsettle = "later"\n')
    r = CliRunner().invoke(main, ["serve", "--config", str(cfg)])
    assert r.exit_code == 78 and f"{cfg}:2: upload.settle: expected a duration" in r.stderr
    r = CliRunner().invoke(main, ["status", "--admin-timeout", "0"])
    assert r.exit_code == 2 and "--admin-timeout" in r.stderr


def test_several_exports_are_cache_directories(tmp_path):
    from appliance import config as c
    from appliance.daemon import build_exports
    from cache.api import ROOT_INO
    from cache.store import Store
    cfg = c.load(None, {("exports",): ("--export", [c.parse_export_flag("/checkpoints:10.0.0.0/8:rw:root"),
                                                      c.parse_export_flag("/datasets/imagenet::ro:all")])})
    store = Store.open(str(tmp_path / "cache"), evict=False)
    try:
        exports = build_exports(cfg, store)
        by_path = {e.path: e for e in exports.exports.values()}
        ck, ds = by_path["/checkpoints"], by_path["/datasets/imagenet"]
        assert ck.root_ino == store.lookup(ROOT_INO, b"checkpoints").ino
        parent = store.lookup(ROOT_INO, b"datasets")
        assert ds.root_ino == store.lookup(parent.ino, b"imagenet").ino
        assert ck.rw and ck.root_squash and not ck.all_squash and ck.networks == ("10.0.0.0/8",)
        assert not ds.rw and ds.all_squash
        assert build_exports(cfg, store).exports.keys() == exports.exports.keys()   # stable ids, same dirs
        single = build_exports(c.load(None), store)
        [only] = single.exports.values()
        assert only.root_ino == ROOT_INO
    finally:
        store.close()


def test_unreachable_s3_is_reported_not_fatal(live_daemon, tmp_path):
    with socket.socket() as closed:          # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    d = live_daemon("--s3-endpoint", f"http://127.0.0.1:{port}", "--s3-bucket", "nowhere",
                    "--s3-connect-timeout", "1", "--s3-read-timeout", "1")
    assert d.status["tryout"] is False and d.status["nfs"]["running"]
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = [e for e in d.log_events() if e.get("event") == "s3_unreachable"]
        if events:
            break
        time.sleep(0.2)
    assert events and events[0]["level"] == "warning" and events[0]["bucket"] == "nowhere"
    assert d.stop() == 0


def test_export_root_owner_and_mode(tmp_path, capsys):
    import io
    import json
    from appliance import config as c
    from appliance import logs
    from appliance.daemon import build_exports
    from cache.api import ROOT_INO
    from cache.store import Store
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    store = Store.open(str(tmp_path / "cache"), evict=False)
    try:
        build_exports(c.load(None), store)                      # fresh root: 0755 root, root squashed
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [e["event"] for e in events if e["event"].startswith("export_root")] == ["export_root_not_writable"]
        cfg_file = tmp_path / "c.toml"
        cfg_file.write_text('[[exports]]\npath = "/checkpoints"\nowner = "1000:1001"\nmode = "1777"\n')
        cfg = c.load(str(cfg_file))
        assert cfg.exports[0].owner == (1000, 1001) and cfg.exports[0].mode == 0o1777
        build_exports(cfg, store)
        attr = store.getattr(ROOT_INO)
        assert (attr.uid, attr.gid, attr.mode & 0o7777) == (1000, 1001, 0o1777)
        stream.truncate(0)
        stream.seek(0)
        build_exports(cfg, store)                               # already so: nothing to do, no warning
        assert "export_root" not in stream.getvalue()
    finally:
        store.close()
        logs.configure("json", "info", stream=io.StringIO())
    cfg_file.write_text('[[exports]]\nowner = "alice"\n')
    with pytest.raises(c.ConfigError, match='UID:GID'):
        c.load(str(cfg_file))


def test_owner_domain_maps_owners_to_names(tmp_path):
    from appliance import config as c
    from appliance.daemon import build_exports
    from cache.store import Store
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text('[server]\nowner_domain = "Example.ORG"\n')
    store = Store.open(str(tmp_path / "cache"), evict=False)
    try:
        named = build_exports(c.load(str(cfg_file)), store).idmap
        assert named.owner(0) == b"root@example.org" and named.group(0) == b"root@example.org"
        assert named.uid_of(b"root@example.org") == 0 and named.uid_of(b"0") == 0
        numeric = build_exports(c.load(None), store).idmap
        assert numeric.owner(0) == b"0"
    finally:
        store.close()
