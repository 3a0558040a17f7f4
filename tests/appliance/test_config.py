"""appliance.config: TOML -> typed settings; every error names file, line, key and expectation."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from appliance import config as c
from appliance import config_example

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "config.example.toml"


def write(tmp_path, text: str) -> str:
    p = tmp_path / "config.toml"
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(p)


def error_of(tmp_path, text: str) -> c.ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(c.ConfigError) as info:
        c.load(path)
    return info.value


# ---- good files ------------------------------------------------------------------------------

def test_defaults_without_a_file():
    cfg = c.load(None)
    assert cfg.embedded_s3 and cfg.s3.bucket == "ckptgw"
    assert cfg.server.cache_dir == "./ckptgw-data"
    assert [e.path for e in cfg.exports] == ["/checkpoints"]
    assert cfg.exports[0].networks == ("127.0.0.0/8", "::1/128")
    host, port = cfg.listen_address()
    assert host == "127.0.0.1" and port == (2049 if os.geteuid() == 0 else 12049)


def test_full_file_is_typed(tmp_path):
    cfg = c.load(write(tmp_path, """
        [server]
        listen = "0.0.0.0:2049"
        cache_dir = "/var/lib/ckptgw/cache"
        capacity = "500GiB"
        lease_time = "2m"

        [s3]
        endpoint = "https://s3.example.com"
        bucket = "ckpts"
        prefix = "gw/"

        [upload]
        settle = "500ms"
        bytes_per_second = "200MB"

        [[exports]]
        path = "/checkpoints"
        networks = ["10.0.0.0/8", "192.168.1.7"]
        squash = "all"

        [[exports]]
        path = "/datasets"
        access = "ro"

        [[retention.series]]
        name = "llama"
        pattern = "runs/llama/step-{step}"
        keep_last = 5
        expire_after = "30d"
        transitions = [{after = "7d", storage_class = "GLACIER_IR"}]
    """))
    assert cfg.server.listen == ("0.0.0.0", 2049)
    assert cfg.server.capacity == 500 << 30
    assert cfg.server.lease_time == 120.0
    assert not cfg.embedded_s3 and cfg.s3.prefix == "gw/"
    assert cfg.upload.settle == 0.5 and cfg.upload.bytes_per_second == 200_000_000
    assert cfg.exports[0].networks == ("10.0.0.0/8", "192.168.1.7/32")
    assert cfg.exports[1].access == "ro" and cfg.exports[1].squash == "root"
    rule = cfg.retention.series[0]
    assert (rule.name, rule.keep_last, rule.expire_after) == ("llama", 5, 30 * 86400.0)
    assert rule.transitions == (c.Transition(after=7 * 86400.0, storage_class="GLACIER_IR"),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.server.listen = None
    # the uploader's settings come out of the same values
    s3 = cfg.s3_settings()
    assert (s3.bucket, s3.endpoint_url, s3.prefix) == ("ckpts", "https://s3.example.com", "gw/")
    assert cfg.upload_settings().settle_seconds == 0.5


def test_example_file_is_current_and_loads_to_the_defaults():
    assert EXAMPLE.read_text() == config_example.render(), \
        "docs/config.example.toml is stale: python -m appliance.config_example > docs/config.example.toml"
    cfg = c.load(str(EXAMPLE))
    assert dataclasses.replace(cfg, source=None) == c.Config()


def test_every_option_is_documented_in_the_example():
    text = EXAMPLE.read_text()
    for section, cls in list(c.SECTIONS.items()) + [("exports", c.ExportSettings), ("admin.tokens", c.AdminToken),
                                                    ("retention", c.RetentionSettings),
                                                    ("retention.series", c.SeriesRule),
                                                    ("transitions", c.Transition)]:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{section}.{f.name} has no doc"
            if "table_array" not in f.metadata:
                assert f"{f.name} = " in text, f"{section}.{f.name} missing from the example"


def test_every_uploader_setting_is_configurable():
    from uploader.settings import S3Settings, UploadSettings
    cfg = c.load(None)
    up = cfg.upload_settings()
    tests_only = {"allow_small_parts"}
    defaults = UploadSettings()
    for f in dataclasses.fields(UploadSettings):
        if f.name not in tests_only:
            assert getattr(up, f.name) == getattr(defaults, f.name), f"[upload] default drifts: {f.name}"
    s3 = cfg.s3_settings(endpoint="http://127.0.0.1:1")
    for f in dataclasses.fields(S3Settings):
        assert hasattr(s3, f.name)


# ---- errors: key, line, expectation ------------------------------------------------------------

def test_wrong_type_names_key_line_and_expectation(tmp_path):
    e = error_of(tmp_path, """
        # comment
        [server]
        cache_dir = "/x"
        capacity = true
    """)
    assert e.where.endswith("config.toml:4")
    assert e.key == "server.capacity"
    assert "expected" in e.expected and "size" in e.expected and "boolean" in e.expected
    assert str(e).startswith(str(tmp_path / "config.toml") + ":4: server.capacity: expected")


def test_unknown_key_suggests_the_right_one(tmp_path):
    e = error_of(tmp_path, """
        [s3]
        bucket = "abc"
        endpiont = "http://x"
    """)
    assert e.where.endswith(":3") and e.key == "s3.endpiont"
    assert "did you mean 'endpoint'" in e.expected


def test_unknown_table(tmp_path):
    e = error_of(tmp_path, """
        [server]
        listen = "127.0.0.1:2049"

        [sever]
        x = 1
    """)
    assert e.where.endswith(":4") and e.key == "sever" and "did you mean 'server'" in e.expected


def test_error_in_second_array_table_gets_its_own_line(tmp_path):
    e = error_of(tmp_path, """
        [[exports]]
        path = "/a"
        access = "rw"

        [[exports]]
        path = "/b"
        access = "rx"
    """)
    assert e.where.endswith(":7") and e.key == "exports[1].access"
    assert "'rw', 'ro'" in e.expected


def test_nested_array_tables_and_inline_tables(tmp_path):
    e = error_of(tmp_path, """
        [[retention.series]]
        name = "a"
        pattern = "a/*"

        [[retention.series]]
        name = "b"
        pattern = "b/*"

        [[retention.series.transitions]]
        after = "30d"
        storage_class = "COLD"
    """)
    assert e.where.endswith(":11") and e.key == "retention.series[1].transitions[0].storage_class"
    e = error_of(tmp_path, """
        [[retention.series]]
        name = "a"
        pattern = "a/*"
        transitions = [{after = "soon", storage_class = "GLACIER"}]
    """)
    assert e.where.endswith(":4") and "duration" in e.expected


def test_missing_required_key(tmp_path):
    e = error_of(tmp_path, """
        [[retention.series]]
        name = "a"
        keep_last = 2
    """)
    assert e.key == "retention.series[0].pattern" and e.where.endswith(":1")
    assert "required" in e.expected


def test_dotted_keys_and_multiline_strings_do_not_confuse_lines(tmp_path):
    e = error_of(tmp_path, '''
        s3.bucket = "good"
        [server]
        cache_dir = """
        listen = not a key
        """
        listen = "nowhere"
    ''')
    assert e.where.endswith(":6") and e.key == "server.listen" and "HOST:PORT" in e.expected


def test_toml_syntax_error_has_a_line(tmp_path):
    e = error_of(tmp_path, """
        [server]
        listen = "127.0.0.1:2049
    """)
    assert e.where.endswith(":2") and "not valid TOML" in e.expected


def test_cross_key_rules(tmp_path):
    e = error_of(tmp_path, """
        [server]
        high_watermark = 0.5
        low_watermark = 0.7
    """)
    assert e.key == "server.low_watermark" and e.where.endswith(":3") and "below high_watermark" in e.expected
    e = error_of(tmp_path, """
        [admin]
        listen = "0.0.0.0:7000"
    """)
    assert e.key == "admin.listen" and "token" in e.expected
    e = error_of(tmp_path, """
        [[exports]]
        path = "/a"
        [[exports]]
        path = "/a/b"
    """)
    assert e.key == "exports[1].path" and e.where.endswith(":4") and "nested" in e.expected


def test_values_out_of_range(tmp_path):
    assert "3-63" in error_of(tmp_path, '[s3]\nbucket = "AB"\n').expected
    assert "CIDR" in error_of(tmp_path, '[[exports]]\nnetworks = ["10.0.0.300/8"]\n').expected
    assert "absolute" in error_of(tmp_path, '[[exports]]\npath = "checkpoints"\n').expected
    assert "5MiB" in error_of(tmp_path, '[upload]\npart_size = "1MiB"\n').expected
    assert "[0.0, 1.0]" in error_of(tmp_path, "[server]\nhigh_watermark = 1.5\n").expected


def test_unreadable_file(tmp_path):
    with pytest.raises(c.ConfigError) as info:
        c.load(str(tmp_path / "missing.toml"))
    assert "cannot be read" in str(info.value)


# ---- flags -------------------------------------------------------------------------------------

def test_flags_override_the_file_and_errors_name_the_flag(tmp_path):
    path = write(tmp_path, '[server]\nlisten = "127.0.0.1:2049"\n')
    cfg = c.load(path, {("server", "listen"): ("--listen", "0.0.0.0:3049"),
                        ("exports",): ("--export", [c.parse_export_flag("/ck:10.0.0.0/8,127.0.0.1:ro:all")])})
    assert cfg.server.listen == ("0.0.0.0", 3049)
    assert cfg.exports[0].path == "/ck" and cfg.exports[0].access == "ro" and cfg.exports[0].squash == "all"
    assert cfg.exports[0].networks == ("10.0.0.0/8", "127.0.0.1/32")
    with pytest.raises(c.ConfigError) as info:
        c.load(path, {("s3", "bucket"): ("--s3-bucket", "x")})
    assert info.value.where is None and "--s3-bucket" in info.value.key


def test_every_option_has_a_flag():
    flags = {flag for flag, _, _ in c.flag_options()}
    for name in ("--listen", "--cache-dir", "--capacity", "--s3-endpoint", "--s3-bucket", "--s3-prefix",
                 "--metrics-listen", "--admin-socket", "--upload-settle", "--log-format"):
        assert name in flags
    # every scalar option; an array of tables ([[admin.tokens]]) is the file's only
    assert len(flags) == sum(1 for cls in c.SECTIONS.values() for f in dataclasses.fields(cls)
                             if "table_array" not in f.metadata)


# ---- the commands ------------------------------------------------------------------------------

def ckptgw(*args, **kw):
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True,
                          cwd=kw.get("cwd"), timeout=60)


def test_check_config_command(tmp_path):
    good = ckptgw("check-config", str(EXAMPLE))
    assert good.returncode == 0, good.stderr
    assert "OK" in good.stdout
    bad = write(tmp_path, '[server]\nlisten = 2049\n')
    r = ckptgw("check-config", bad)
    assert r.returncode == 1
    assert r.stderr.strip() == f"ckptgw: {bad}:2: server.listen: expected a string, got an integer (2049)"


def test_serve_refuses_a_bad_config(tmp_path):
    bad = write(tmp_path, '[upload]\nsettle = "later"\n')
    r = ckptgw("--config", bad, "serve", cwd=tmp_path)
    assert r.returncode == 78
    assert f"{bad}:2: upload.settle: expected a duration" in r.stderr
    assert not (tmp_path / "ckptgw-data").exists()        # did not start anything


def test_default_port_depends_on_privilege(monkeypatch):
    cfg = c.load(None)
    monkeypatch.setattr(c, "_may_bind_low_ports", lambda: False)
    assert cfg.listen_address() == ("127.0.0.1", 12049)
    monkeypatch.setattr(c, "_may_bind_low_ports", lambda: True)
    assert cfg.listen_address() == ("127.0.0.1", 2049)
    assert c.load(None, {("server", "listen"): ("--listen", "0.0.0.0:3049")}).listen_address() == ("0.0.0.0", 3049)


def test_admin_socket_default_follows_the_service(monkeypatch):
    cfg = c.load(None, {("server", "cache_dir"): ("--cache-dir", "/srv/cache")})
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert cfg.admin_socket_path() == "/srv/cache/admin.sock"
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("INVOCATION_ID", "abc")
    assert cfg.admin_socket_path() == "/run/ckptgw/admin.sock"


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    e = error_of(tmp_path, """
        [server]
        lease_time = "forever"
        high_watermark = 2

        [s3]
        bucket = "AB"
        colour = "blue"
    """)
    assert [(err.key, err.where.rsplit(":", 1)[1]) for err in e.errors] == [
        ("server.lease_time", "2"), ("server.high_watermark", "3"), ("s3.bucket", "6"), ("s3.colour", "7")]
    assert str(e).startswith("4 problems:\n") and "s3.bucket: expected an S3 bucket name" in str(e)
    assert (e.key, e.where) == ("server.lease_time", e.errors[0].where)     # the first, as before


def test_low_watermark_zero_is_refused_before_the_store_refuses_it(tmp_path):
    e = error_of(tmp_path, "[server]\nlow_watermark = 0\n")
    assert e.key == "server.low_watermark" and "above 0" in e.expected


def test_exports_are_secure_unless_they_say_insecure(tmp_path):
    assert c.ExportSettings().secure is True                       # knfsd's default
    assert c.parse_export_flag("/ck:127.0.0.0/8:rw:none:insecure")["secure"] is False
    assert c.parse_export_flag("/ck:127.0.0.0/8:rw:none:secure")["secure"] is True
    assert "secure" not in c.parse_export_flag("/ck:127.0.0.0/8:rw:none")
    f = tmp_path / "c.toml"
    f.write_text('[[exports]]\npath = "/ck"\nsecure = false\n')
    assert c.load(str(f)).exports[0].secure is False


def test_export_flag_errors_name_the_fifth_field():
    with pytest.raises(c.ConfigError) as info:
        c.parse_export_flag("/ck:127.0.0.0/8:rw:none:insecur")
    assert "fifth field" in str(info.value) and "secure or insecure" in str(info.value)
    assert "'insecur'" in str(info.value)
    with pytest.raises(c.ConfigError) as info:
        c.parse_export_flag("/ck:127.0.0.0/8:rw:none:insecure:extra")
    assert "at most 5 fields" in str(info.value) and "secure|insecure" in str(info.value)


def test_rules_across_keys_are_checked_in_the_same_pass_as_each_key(tmp_path):
    """A file with bad values and broken rules across keys names them all in one run (README: "every
    problem at once"), each with file, line and key; a rule whose own key is already wrong stays quiet
    rather than judging the default that stands in for it."""
    path = write(tmp_path, """
        [server]
        lease_time = "forever"
        low_watermark = "high"

        [s3]
        bucket = "AB"

        [upload]
        part_size = "1MiB"
        min_concurrency = 9
        max_concurrency = 4
        settle = "soon"

        [[retention.series]]
        name = "run"
        pattern = "runs/step_{step}"
        expire_after = "7d"
        transitions = [{after = "30d", storage_class = "GLACIER_IR"}]

        [[retention.series]]
        name = "other"
        pattern = "other/step_{step}"
        expire_after = "often"
        transitions = [{after = "30d", storage_class = "GLACIER_IR"}]
    """)
    with pytest.raises(c.ConfigError) as info:
        c.load(path)
    got = [(e.key, e.where) for e in info.value.errors]
    assert got == [
        ("server.lease_time", f"{path}:2"),
        ("server.low_watermark", f"{path}:3"),
        ("s3.bucket", f"{path}:6"),
        ("upload.part_size", f"{path}:9"),
        ("upload.min_concurrency", f"{path}:10"),
        ("upload.settle", f"{path}:12"),
        ("retention.series[0].transitions[0].after", f"{path}:18"),
        ("retention.series[1].expire_after", f"{path}:23"),
    ], got
    by_key = {e.key: e.expected for e in info.value.errors}
    assert "at least 5MiB" in by_key["upload.part_size"]
    assert "less than expire_after" in by_key["retention.series[0].transitions[0].after"]
    assert str(info.value).startswith("8 problems:\n")
    # check-config lists the same problems, every one located
    from click.testing import CliRunner
    from appliance.cli import main
    r = CliRunner().invoke(main, ["check-config", "--json", path])
    assert r.exit_code == 1
    import json
    problems = json.loads(r.stdout)["problems"]
    assert [(p["key"], p["where"]) for p in problems] == got
