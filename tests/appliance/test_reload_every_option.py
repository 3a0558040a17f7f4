"""Every option, changed in the file and reloaded on a live daemon, is either applied or reported
as needing a restart, as its declaration says (appliance.config.reload_policy). The table must
name every declared option: a new option fails this test until it is given a changed value."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest

from appliance import config as c

UP_DEFAULT_ABORT = {f.name: f.default for f in fields(c.UploadConfig)}["abort_orphan_uploads"]

# dotted key -> {section: {key: changed value}} (several keys where rules tie them together)
CHANGES = {
    "server.listen": {"server": {"listen": "127.0.0.1:1"}},
    "server.cache_dir": {"server": {"cache_dir": "/nonexistent/elsewhere"}},
    "server.capacity": {"server": {"capacity": "3GiB"}},
    "server.reserve": {"server": {"reserve": "2GiB"}},
    "server.high_watermark": {"server": {"high_watermark": 0.95}},
    "server.low_watermark": {"server": {"low_watermark": 0.5}},
    "server.evict_interval": {"server": {"evict_interval": "7s"}},
    "server.lease_time": {"server": {"lease_time": "45s"}},
    "server.grace_time": {"server": {"grace_time": "20s"}},
    "server.owner_domain": {"server": {"owner_domain": "example.org"}},
    "server.shutdown_timeout": {"server": {"shutdown_timeout": "40s"}},
    "admin.socket": {"admin": {"socket": "/nonexistent/other.sock"}},
    "admin.socket_mode": {"admin": {"socket_mode": "0640"}},
    "admin.group": {"admin": {"group": "0"}},
    "admin.listen": {"admin": {"listen": "127.0.0.1:1", "token": "t0ken"}},
    "admin.token": {"admin": {"token": "t0ken"}},
    "admin.token_file": {"admin": {"token_file": "/nonexistent/token"}},
    "admin.tokens": {"admin.tokens": [{"name": "jobs", "scope": "flush", "token": "t0ken-jobs"}]},
    "metrics.listen": {"metrics": {"listen": "127.0.0.1:1"}},
    "log.format": {"log": {"format": "console"}},
    "log.level": {"log": {"level": "warning"}},
    "s3.endpoint": {"s3": {"endpoint": "http://127.0.0.1:1"}},
    "s3.bucket": {"s3": {"bucket": "another-bucket"}},
    "s3.prefix": {"s3": {"prefix": "gw/"}},
    "s3.region": {"s3": {"region": "eu-west-1"}},
    "s3.addressing_style": {"s3": {"addressing_style": "path"}},
    "s3.access_key": {"s3": {"access_key": "AK", "secret_key": "SK"}},
    "s3.secret_key": {"s3": {"access_key": "AK", "secret_key": "SK"}},
    "s3.session_token": {"s3": {"session_token": "ST"}},
    "s3.checksum_algorithm": {"s3": {"checksum_algorithm": "SHA256"}},
    "s3.connect_timeout": {"s3": {"connect_timeout": "5s"}},
    "s3.read_timeout": {"s3": {"read_timeout": "30s"}},
    "upload.settle": {"upload": {"settle": "3s"}},
    "upload.part_size": {"upload": {"part_size": "16MiB"}},
    "upload.multipart_threshold": {"upload": {"multipart_threshold": "256MiB"}},
    "upload.max_concurrency": {"upload": {"max_concurrency": 9}},
    "upload.min_concurrency": {"upload": {"min_concurrency": 2}},
    "upload.foreground_concurrency": {"upload": {"foreground_concurrency": 3}},
    "upload.requests_per_second": {"upload": {"requests_per_second": 100}},
    "upload.bytes_per_second": {"upload": {"bytes_per_second": "100MB"}},
    "upload.burst": {"upload": {"burst": "3s"}},
    "upload.backoff_base": {"upload": {"backoff_base": "2s"}},
    "upload.backoff_max": {"upload": {"backoff_max": "120s"}},
    "upload.poll_interval": {"upload": {"poll_interval": "3s"}},
    "upload.readahead_chunk": {"upload": {"readahead_chunk": "16MiB"}},
    "upload.readahead_chunks": {"upload": {"readahead_chunks": 5}},
    "upload.abort_orphan_uploads": {"upload": {"abort_orphan_uploads": not UP_DEFAULT_ABORT}},
    "retention.pin_lock": {"retention": {"pin_lock": "off"}},
    "retention.pin_lock_days": {"retention": {"pin_lock_days": 5}},
    "retention.schedule": {"retention": {"schedule": "1h"}},
    "retention.abort_incomplete_multipart_days": {"retention": {"abort_incomplete_multipart_days": 3}},
    "retention.series": {"retention.series": [{"name": "run", "pattern": "run/step-{step}"}]},
    "exports": {"exports": [{"path": "/checkpoints", "networks": ["127.0.0.0/8", "10.9.0.0/16"],
                             "squash": "none"}]},
    "pair.drbd_device": {"pair": {"drbd_device": "/dev/drbd3"}},
}


def _toml(v) -> str:
    if isinstance(v, (bool, int, float, str)):
        return json.dumps(v)
    return "[" + ", ".join(_toml(x) for x in v) + "]"


def render(tables: dict) -> str:
    out = []
    for name, body in tables.items():
        if isinstance(body, list):                       # an array of tables
            for item in body:
                out += [f"[[{name}]]"] + [f"{k} = {_toml(v)}" for k, v in item.items()] + [""]
        else:
            out += [f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in body.items()] + [""]
    return "\n".join(out)


def base(tmp_path) -> dict:
    return {"server": {"listen": "127.0.0.1:0", "cache_dir": str(tmp_path / "cache"), "capacity": "2GiB"},
            "admin": {"socket": str(tmp_path / "admin.sock")},
            "metrics": {"listen": "127.0.0.1:0"},
            "log": {"format": "json"},
            "upload": {"settle": "0.2s"},
            "exports": [{"path": "/checkpoints", "networks": ["127.0.0.0/8"], "squash": "none"}]}


def changed(tmp_path, case: dict) -> dict:
    tables = base(tmp_path)
    for name, body in case.items():
        if isinstance(body, list):
            tables[name] = body
        else:
            tables[name] = {**tables.get(name, {}), **body}
    return tables


def reload(d) -> dict:
    r = d.cli("reload", "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_the_table_names_every_declared_option():
    assert set(CHANGES) == set(c.reload_policy()), "give each new option a changed value in CHANGES"


def test_every_option_is_applied_on_reload_or_reported_as_needing_a_restart(live_daemon, tmp_path):
    policy = c.reload_policy()
    cfg = tmp_path / "config.toml"
    cfg.write_text(render(base(tmp_path)))
    d = live_daemon(config=cfg, bare=True)
    capacity = d.status["cache"]["capacity"]
    for key, case in CHANGES.items():
        tables = changed(tmp_path, case)
        cfg.write_text(render(tables))
        c.load(str(cfg))                                  # the case itself is a valid file
        res = reload(d)
        keys = {f"{s}.{k}" if not isinstance(b, list) else s for s, b in case.items()
                for k in (b if isinstance(b, dict) else [None])}
        applied = {k for k in keys if "restart" not in policy[k]}
        assert key in keys
        assert set(res["applied"]) == applied, (key, res)
        assert set(res["needs_restart"]) == keys - applied, (key, res)
        st = d.cli_json("status")
        # the applied ones took effect in the running parts, not only in the config object
        if key == "server.high_watermark":
            assert st["cache"]["high_watermark"] == int(capacity * 0.95)
        if key == "server.low_watermark":
            assert st["cache"]["low_watermark"] == int(capacity * 0.5)
        if key == "server.evict_interval":
            assert st["cache"]["evict_interval_s"] == 7.0
        if key == "server.owner_domain":
            assert st["nfs"]["owner_domain"] == "example.org"
        if key == "exports":
            assert d.cli_json("exports")["exports"][0]["networks"] == ["127.0.0.0/8", "10.9.0.0/16"]
        if key == "retention.series":
            assert d.cli_json("retention", "plan")["summary"] is not None
        if key == "pair.drbd_device":
            assert st["pair"]["device"] == "/dev/drbd3"
        # back to the base file: the applied ones revert, the restart-only ones were never taken
        cfg.write_text(render(base(tmp_path)))
        res = reload(d)
        assert set(res["applied"]) == applied and res["needs_restart"] == [], (key, res)
    st = d.cli_json("status")
    assert st["cache"]["high_watermark"] == int(capacity * 0.9) and st["nfs"]["owner_domain"] is None
    assert d.proc.poll() is None and d.stop() == 0
