"""Human output of `ckptgw` from given replies (no daemon): tables, units, progress percentages."""
from __future__ import annotations

import os
from unittest import mock

from click.testing import CliRunner

import appliance.cli as cli

STATUS = {"tryout": False, "s3": {"endpoint": "https://s3.example", "bucket": "ckpt", "prefix": "gw/"},
          "listen": "0.0.0.0:2049", "exports": ["/checkpoints"], "uptime_s": 4000,
          "nfs": {"clients": 3, "ops_total": 120, "errors_total": 4},
          "cache": {"used": 3 << 30, "capacity": 100 << 30, "dirty_bytes": 512 << 20},
          "upload": {"running": True, "queue_depth": 2, "oldest_dirty_age_seconds": 75.0, "rate_bytes_per_s": 200 << 20,
                     "bytes_uploaded": 5 << 30, "retries": 7, "throttles": 2,
                     "uploading": [{"path": "run1/b.bin", "size": 4 << 20, "bytes_done": 1 << 20}],
                     "last_errors": ["SlowDown on UploadPart"]}}


def run(args, reply):
    with mock.patch.object(cli, "call", return_value=reply):
        return CliRunner().invoke(cli.main, args)


def test_status_table():
    out = run(["status"], STATUS).output.splitlines()
    rows = {line[:14].strip(): line[14:] for line in out if line and not line.startswith(" ")}
    assert rows["mode"] == "S3"
    assert rows["cache used"] == "3.0 GiB of 100.0 GiB"
    assert rows["dirty"] == "512.0 MiB"
    assert rows["oldest dirty"] == "1m15s"
    assert rows["upload rate"] == "200.0 MiB/s"
    assert rows["uploaded"] == "5.0 GiB"
    assert rows["retries"] == "7" and rows["throttles"] == "2"
    assert "  run1/b.bin   25%  4.0 MiB" in out
    assert out[-1] == "  SlowDown on UploadPart"


def test_status_shows_the_admin_tokens_by_name_and_scope():
    reply = {**STATUS, "admin_tcp": "10.0.0.5:7000",
             "admin_tokens": [{"name": "admin.token", "scope": "admin", "secret_from": "config"},
                              {"name": "jobs", "scope": "flush", "secret_from": "env JOBS_TOKEN"},
                              {"name": "grafana", "scope": "read", "secret_from": "file /etc/ckptgw/r.token"}]}
    rows = {line[:14].strip(): line[14:] for line in run(["status"], reply).output.splitlines()
            if line and not line.startswith(" ")}
    assert rows["admin tcp"] == "10.0.0.5:7000"
    assert rows["admin tokens"] == ("admin.token (admin), jobs (flush, env JOBS_TOKEN), "
                                    "grafana (read, file /etc/ckptgw/r.token)")
    # no TCP API, no tokens: nothing to say, no rows
    rows = run(["status"], {**STATUS, "admin_tcp": None, "admin_tokens": []}).output
    assert "admin tcp" not in rows and "admin tokens" not in rows


def test_ls_shows_progress_and_pins():
    reply = {"path": "run1", "entries": [
        {"path": "run1/a.bin", "type": "reg", "size": 1536, "state": "clean", "pinned": True, "pin_reason": "best",
         "progress": None},
        {"path": "run1/b.bin", "type": "reg", "size": 4 << 20, "state": "uploading", "pinned": False,
         "progress": 0.426},
        {"path": "run1/sub", "type": "dir", "size": 4096, "state": "clean", "pinned": False, "progress": None}]}
    out = run(["ls", "run1"], reply).output.splitlines()
    assert out[0].split() == ["PATH", "TYPE", "SIZE", "STATE", "PIN"]
    assert out[1].split() == ["run1/a.bin", "reg", "1.5", "KiB", "clean", "pinned", "(best)"]
    assert out[2].split() == ["run1/b.bin", "reg", "4.0", "MiB", "uploading", "42%"]
    assert out[3].split() == ["run1/sub/", "dir", "-", "-"]
    # SIZE is right-aligned
    assert out[1].index("KiB") == out[2].index("MiB")


def _help_of(command: str) -> dict[str, str]:
    """`ckptgw COMMAND --help` at a width that keeps each option's first line whole:
    flag -> its placeholder and help text (continuation lines joined)."""
    out = CliRunner().invoke(cli.main, [command, "--help"], terminal_width=400).output
    opts: dict[str, str] = {}
    last = None
    for line in out.splitlines():
        if line.startswith("  -"):
            flag, _, rest = line.strip().partition(" ")
            last = flag.rstrip(",")
            opts[last] = rest.strip()
        elif last and line.startswith("      "):
            opts[last] += " " + line.strip()
    return opts


def test_serve_help_shows_placeholders_defaults_and_choices():
    opts = _help_of("serve")
    assert opts["--listen"].startswith("HOST:PORT ")
    assert opts["--cache-dir"].startswith("PATH ")
    assert opts["--upload-part-size"].startswith("SIZE ") and "[default: 8MiB]" in opts["--upload-part-size"]
    assert opts["--lease-time"].startswith("DURATION ") and "[default: 90s]" in opts["--lease-time"]
    assert opts["--upload-max-concurrency"].startswith("INTEGER ")
    assert "[default: 0600]" in opts["--admin-socket-mode"]
    assert opts["--log-level"].startswith("[debug|info|warning|error] ") and "[default: info]" in opts["--log-level"]
    assert opts["--s3-checksum-algorithm"].startswith("[CRC32|SHA256] ")
    assert opts["--capacity"].startswith("auto|SIZE ")
    assert opts["--export"].startswith("PATH[:NETS[:rw|ro[:SQUASH[:secure|insecure]]]] ")
    assert not [f for f, text in opts.items() if text.startswith("VALUE")]


def test_serve_refuses_a_value_outside_the_choices():
    res = CliRunner().invoke(cli.main, ["serve", "--log-level", "verbose"])
    assert res.exit_code == 2
    assert "'verbose' is not one of 'debug', 'info', 'warning', 'error'" in res.output


def test_exports_table_shows_secure():
    base = {"networks": ["127.0.0.0/8"], "access": "rw", "squash": "root", "anon_uid": 65534, "anon_gid": 65534,
            "owner": None, "mode": None}
    reply = {"exports": [dict(base, path="/a", secure=True), dict(base, path="/b", secure=False)]}
    out = run(["exports"], reply).output.splitlines()
    assert out[0].split() == ["PATH", "NETWORKS", "ACCESS", "SQUASH", "ANON", "SECURE"]
    assert out[1].split()[-1] == "secure" and out[2].split()[-1] == "insecure"


def test_serve_export_error_names_the_fifth_field():
    res = CliRunner().invoke(cli.main, ["serve", "--export", "/ck:127.0.0.0/8:rw:root:unsafe"])
    assert res.exit_code == cli.EX_CONFIG
    assert "fifth field" in res.output and "'unsafe'" in res.output


def test_exit_7_names_the_sockets_tried_and_what_a_relative_path_is_relative_to(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in ("CKPTGW_ADMIN_SOCKET", "CKPTGW_CONFIG", "CKPTGW_ADMIN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli.configmod, "SERVICE_ADMIN_SOCKET", str(tmp_path / "run" / "admin.sock"))
    monkeypatch.setattr(cli.configmod, "default_config_path", lambda: None)
    r = CliRunner().invoke(cli.main, ["status"])
    default = os.path.join(cli.configmod.ServerSettings().cache_dir, "admin.sock")
    assert r.exit_code == 7
    assert f"no daemon is listening on {default} (<cache_dir>/admin.sock of the built-in defaults" in r.stderr
    assert f"also tried {tmp_path}/run/admin.sock (the systemd service's: absent)" in r.stderr
    (tmp_path / "c.toml").write_text('[server]\ncache_dir = "data"\n')
    r = CliRunner().invoke(cli.main, ["status", "--config", "c.toml"])
    assert r.exit_code == 7
    assert "no daemon is listening on data/admin.sock (<cache_dir>/admin.sock of the config file c.toml" in r.stderr
    assert f"relative to the current directory {tmp_path}" in r.stderr
    r = CliRunner().invoke(cli.main, ["status", "--socket", "gw.sock", "--json"])
    assert r.exit_code == 7 and "gw.sock (from --socket" in r.stderr
    assert f"relative to the current directory {tmp_path}" in r.stderr
    r = CliRunner().invoke(cli.main, ["status", "--socket", str(tmp_path / "gw.sock")])
    assert r.exit_code == 7 and "relative" not in r.stderr


class _RecordingClient:
    """Stands in for AdminClient: records the token it was given and answers every call with {}."""
    tokens: list = []

    def __init__(self, tcp=None, socket_path=None, token=None, timeout=None):
        _RecordingClient.tokens.append(token)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def call(self, cmd, args=None, on_progress=None, prepares=()):
        return {}


def test_admin_token_from_a_file_or_the_environment(tmp_path, monkeypatch):
    for var in ("CKPTGW_ADMIN_TOKEN", "CKPTGW_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli, "AdminClient", _RecordingClient)
    _RecordingClient.tokens = []
    secret = tmp_path / "token"
    secret.write_text("s3cr3t\nignored\n")
    assert CliRunner().invoke(cli.main, ["--admin", "127.0.0.1:1", "--token-file", str(secret),
                                         "status", "--json"]).exit_code == 0
    assert CliRunner().invoke(cli.main, ["status", "--json", "--admin", "127.0.0.1:1",
                                         "--token-file", str(secret)]).exit_code == 0
    assert CliRunner().invoke(cli.main, ["--admin", "127.0.0.1:1", "status", "--json"],
                              env={"CKPTGW_ADMIN_TOKEN_FILE": str(secret)}).exit_code == 0
    assert CliRunner().invoke(cli.main, ["--admin", "127.0.0.1:1", "status", "--json"],
                              env={"CKPTGW_ADMIN_TOKEN": "from-env"}).exit_code == 0
    assert _RecordingClient.tokens == ["s3cr3t", "s3cr3t", "s3cr3t", "from-env"]
    r = CliRunner().invoke(cli.main, ["--admin", "127.0.0.1:1", "--token", "x", "--token-file", str(secret),
                                      "status"])
    assert r.exit_code == 2 and "not both" in r.stderr
    r = CliRunner().invoke(cli.main, ["--admin", "127.0.0.1:1", "--token-file", str(tmp_path / "none"), "status"])
    assert r.exit_code == 2 and "cannot read the token file" in r.stderr


def test_help_says_a_token_flag_is_visible_in_ps():
    top = CliRunner().invoke(cli.main, ["--help"], terminal_width=400).output
    token_help = next(line for line in top.splitlines() if line.strip().startswith("--token TOKEN"))
    assert "`ps`" in token_help and "$CKPTGW_ADMIN_TOKEN" in token_help and "--token-file" in token_help
    opts = _help_of("serve")
    assert "`ps`" in opts["--admin-token"] and "$CKPTGW_ADMIN_TOKEN" in opts["--admin-token"]
    assert "`ps`" in opts["--s3-secret-key"] and "`ps`" in opts["--s3-session-token"]


_REAL_LOAD = cli.configmod.load


def _serve_config(args, env, monkeypatch):
    """The Config `ckptgw serve ARGS` would run with (stopped before anything starts)."""
    got = {}

    def load(path, overrides=None):
        got["cfg"] = _REAL_LOAD(path, overrides)
        raise SystemExit(0)
    monkeypatch.setattr(cli.configmod, "load", load)
    r = CliRunner().invoke(cli.main, ["serve", *args], env=env)
    assert r.exit_code == 0, r.output
    return got["cfg"]


def test_serve_takes_the_admin_token_from_the_environment(tmp_path, monkeypatch):
    for var in ("CKPTGW_ADMIN_TOKEN", "CKPTGW_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    conf = tmp_path / "c.toml"
    conf.write_text(f'[admin]\nlisten = "127.0.0.1:0"\ntoken_file = "{secret}"\n')
    cfg = _serve_config(["--config", str(conf)], {}, monkeypatch)
    assert cfg.admin_token() == "from-file"
    # the environment's token replaces the file's token_file (no "give either" error)
    cfg = _serve_config(["--config", str(conf)], {"CKPTGW_ADMIN_TOKEN": "from-env"}, monkeypatch)
    assert cfg.admin_token() == "from-env" and cfg.admin.token_file is None
    other = tmp_path / "other"
    other.write_text("from-other-file\n")
    cfg = _serve_config(["--config", str(conf)], {"CKPTGW_ADMIN_TOKEN_FILE": str(other)}, monkeypatch)
    assert cfg.admin_token() == "from-other-file"
    cfg = _serve_config(["--config", str(conf), "--admin-token-file", str(other)], {}, monkeypatch)
    assert cfg.admin_token() == "from-other-file"
