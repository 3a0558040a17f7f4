"""Scoped TCP admin tokens (issue 39): every command x every scope over a real AdminServer, the
denial's reply, exit code and log event, the Unix socket's full access, the config that declares
tokens, and the CLI with a scoped token."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from appliance import admin as admin_module, commands, config as c, scopes
from appliance.admin import AdminClient, AdminError, AdminServer
from appliance.cli import EXIT, main as cli_main
from tests.appliance.test_admin import LoopThread, loop_thread, sockdir  # noqa: F401 - fixtures

# The policy, stated here on its own: a new command fails test_every_command_has_a_scope until
# appliance.scopes gives it one, and the matrix below until this table says what it should be.
EXPECTED = {
    "status": "read", "ls": "read", "clients": "read", "exports": "read", "check": "read",
    "verify": "read", "retention_plan": "read", "retention_log": "read", "lifecycle_plan": "read",
    "flush": "flush", "warmup": "flush",
    "reload": "admin", "evict": "admin", "pin": "admin", "unpin": "admin", "import": "admin",
    "retention_apply": "admin", "lifecycle_sync": "admin",
}
SECRETS = {"read": "r-secret", "flush": "f-secret", "admin": "a-secret"}
TOKENS = tuple(scopes.Token(f"{scope}-tok", scope, secret) for scope, secret in SECRETS.items())


async def echo(cmd, args, progress):
    return {"ran": cmd}


class RecordedLog:
    """Stands in for appliance.admin's logger: structlog's own capture misses a logger that an
    earlier test's logs.configure() cached."""

    def __init__(self):
        self.events: list[dict] = []

    def __getattr__(self, level):
        def record(event, **kw):
            self.events.append({"event": event, "log_level": level, **kw})
        return record


@pytest.fixture
def recorded_log(monkeypatch):
    rec = RecordedLog()
    monkeypatch.setattr(admin_module, "log", rec)
    return rec


def test_every_command_has_a_scope():
    declared = set(commands.schemas())
    assert declared == set(scopes.COMMAND_SCOPE), \
        "give each admin command its scope in appliance.scopes.COMMAND_SCOPE (and nothing else)"
    assert set(scopes.COMMAND_SCOPE.values()) <= set(scopes.SCOPES)


def test_an_unmapped_command_needs_admin():
    assert scopes.needed("some_new_command") == "admin"
    assert not scopes.allows("flush", "some_new_command") and scopes.allows("admin", "some_new_command")
    assert scopes.needed("retention-apply") == "admin"        # the dashed spelling dispatch accepts


@pytest.fixture
def tcp_server(loop_thread, sockdir):
    server = AdminServer(echo, os.path.join(sockdir, "admin.sock"), tcp=("127.0.0.1", 0), tokens=TOKENS)
    loop_thread.run(server.start())
    loop_thread.servers.append(server)
    return server


@pytest.mark.parametrize("cmd", sorted(commands.schemas()))
def test_every_command_with_every_scope(tcp_server, cmd):
    assert cmd in EXPECTED, f"say in EXPECTED which scope {cmd!r} should need"
    for scope in scopes.SCOPES:
        with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS[scope], timeout=10) as client:
            if scopes.SCOPES.index(scope) >= scopes.SCOPES.index(EXPECTED[cmd]):
                assert client.call(cmd) == {"ran": cmd}, (cmd, scope)
            else:
                with pytest.raises(AdminError) as info:
                    client.call(cmd)
                assert info.value.code == "forbidden", (cmd, scope)
                assert f"scope {scope!r}" in info.value.message and f"needs {EXPECTED[cmd]!r}" in info.value.message


def test_a_flush_token_cannot_delete_evict_or_reload(tcp_server):
    with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS["flush"], timeout=10) as client:
        assert client.call("flush", {"path": "run1"}) == {"ran": "flush"}
        for cmd in ("retention_apply", "evict", "reload", "unpin", "lifecycle_sync"):
            with pytest.raises(AdminError) as info:
                client.call(cmd)
            assert info.value.code == "forbidden"


def test_the_denial_is_logged_once_with_client_and_op(tcp_server, recorded_log):
    with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS["read"], timeout=10) as client:
        with pytest.raises(AdminError):
            client.call("evict", {"path": "run1"})
        client.call("status")
    logs = recorded_log.events
    denied = [e for e in logs if e["event"] == "admin_scope_denied"]
    assert len(denied) == 1 and denied[0]["log_level"] == "warning"
    assert denied[0]["op"] == "evict" and denied[0]["client"].startswith("127.0.0.1:")
    assert denied[0]["caller"] == "read-tok" and denied[0]["scope"] == "read" and denied[0]["needs"] == "admin"
    assert not any("r-secret" in json.dumps(e, default=str) for e in logs)
    served = [e for e in logs if e["event"] == "admin_request"]
    assert [e["cmd"] for e in served] == ["status"] and served[0]["caller"] == "read-tok"


def test_a_plan_that_prepares_an_apply_needs_the_scope_of_the_apply(tcp_server, recorded_log):
    """The interactive `retention apply` / `lifecycle sync` show a plan and ask; the plan request
    names what it prepares, so a token that may not apply is refused before the question (issue 39)."""
    for plan, apply in (("retention_plan", "retention_apply"), ("lifecycle_plan", "lifecycle_sync")):
        for scope in ("read", "flush"):
            with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS[scope], timeout=10) as client:
                assert client.call(plan) == {"ran": plan}                 # the plan alone: a read
                with pytest.raises(AdminError) as info:
                    client.call(plan, prepares=(apply,))
                assert info.value.code == "forbidden"
                assert info.value.message == (f"the admin token '{scope}-tok' has scope {scope!r}; "
                                              f"{apply} needs 'admin'")
        with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS["admin"], timeout=10) as client:
            assert client.call(plan, prepares=(apply,)) == {"ran": plan}
        with AdminClient(socket_path=tcp_server.socket_path, timeout=10) as client:   # not scoped
            assert client.call(plan, prepares=(apply,)) == {"ran": plan}
    denied = [e for e in recorded_log.events if e["event"] == "admin_scope_denied"]
    assert [(e["op"], e["asked"]) for e in denied] == [
        ("retention_apply", "retention_plan")] * 2 + [("lifecycle_sync", "lifecycle_plan")] * 2
    with AdminClient(tcp=tcp_server.tcp_address, token=SECRETS["admin"], timeout=10) as client:
        for bad in ("retention_apply", [1], {"x": 1}):
            client.file.write(json.dumps({"cmd": "status", "token": SECRETS["admin"],
                                          "prepares": bad}).encode() + b"\n")
            client.file.flush()
            reply = json.loads(client.file.readline())
            assert reply["ok"] is False and reply["code"] == "bad_request", reply


def test_a_wrong_or_missing_token_is_denied_not_forbidden(tcp_server):
    for token in ("r-secre", "r-secret ", None, "x" * 5000):
        with AdminClient(tcp=tcp_server.tcp_address, token=token, timeout=10) as client:
            with pytest.raises(AdminError) as info:
                client.call("status")
            assert info.value.code == "denied"


def test_the_unix_socket_may_run_everything(tcp_server):
    with AdminClient(socket_path=tcp_server.socket_path, timeout=10) as client:
        for cmd in EXPECTED:
            assert client.call(cmd) == {"ran": cmd}


def test_the_single_token_of_old_configs_is_an_admin_token(loop_thread, sockdir):
    server = AdminServer(echo, os.path.join(sockdir, "admin.sock"), tcp=("127.0.0.1", 0), token="old")
    loop_thread.run(server.start())
    loop_thread.servers.append(server)
    with AdminClient(tcp=server.tcp_address, token="old", timeout=10) as client:
        assert client.call("retention_apply") == {"ran": "retention_apply"}


def test_match_compares_every_token_and_takes_only_strings():
    assert scopes.match(TOKENS, "f-secret").name == "flush-tok"
    assert scopes.match(TOKENS, "f-secret-longer") is None
    assert scopes.match(TOKENS, None) is None and scopes.match(TOKENS, ["f-secret"]) is None
    assert scopes.match((), "anything") is None
    with pytest.raises(ValueError):
        scopes.Token("x", "root", "s")
    with pytest.raises(ValueError):
        scopes.Token("x", "read", "")


# ---- the config -------------------------------------------------------------------------------

def _load(tmp_path, text: str) -> c.Config:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return c.load(str(p))


def test_tokens_from_a_file_a_variable_or_inline(tmp_path, monkeypatch):
    (tmp_path / "flush.token").write_text("from-file\nignored\n")
    monkeypatch.setenv("CKPTGW_TEST_READ_TOKEN", "from-env")
    cfg = _load(tmp_path, f"""
[admin]
listen = "127.0.0.1:0"
token = "old-admin"

[[admin.tokens]]
name = "jobs"
scope = "flush"
token_file = "{tmp_path / 'flush.token'}"

[[admin.tokens]]
name = "grafana"
scope = "read"
token_env = "CKPTGW_TEST_READ_TOKEN"

[[admin.tokens]]
name = "ops"
scope = "admin"
token = "inline"
""")
    got = [(t.name, t.scope, t.secret) for t in cfg.admin_tokens()]
    assert got == [("admin.token", "admin", "old-admin"), ("jobs", "flush", "from-file"),
                   ("grafana", "read", "from-env"), ("ops", "admin", "inline")]
    # what status shows of them: the same tokens in the same order, where each secret comes from
    assert cfg.admin_token_info() == [
        {"name": "admin.token", "scope": "admin", "secret_from": "config"},
        {"name": "jobs", "scope": "flush", "secret_from": f"file {tmp_path / 'flush.token'}"},
        {"name": "grafana", "scope": "read", "secret_from": "env CKPTGW_TEST_READ_TOKEN"},
        {"name": "ops", "scope": "admin", "secret_from": "config"}]
    assert not {"old-admin", "from-file", "from-env", "inline"} & set(str(cfg.admin_token_info()).split("'"))
    # scoped tokens alone are enough for listen
    _load(tmp_path, '[admin]\nlisten = "127.0.0.1:0"\n[[admin.tokens]]\nname = "a"\nscope = "read"\ntoken = "t"\n')


def test_config_problems_are_named_in_one_pass(tmp_path):
    with pytest.raises(c.ConfigError) as info:
        _load(tmp_path, """
[admin]
listen = "127.0.0.1:0"

[[admin.tokens]]
name = "jobs"
scope = "flush"
token = "a"
token_env = "X"

[[admin.tokens]]
name = "jobs"
scope = "root"
token = "b"

[[admin.tokens]]
name = "no secret"
scope = "read"
""")
    problems = [(p.key, p.expected) for p in info.value.errors]
    keys = [k for k, _ in problems]
    assert "admin.tokens[0].token_file" in keys          # two sources
    assert "admin.tokens[1].name" in keys and "admin.tokens[1].scope" in keys
    assert "admin.tokens[2].name" in keys and "admin.tokens[2].token_file" in keys   # bad name, no source
    assert any("exactly one of token_file, token_env or token, got token_env and token" in e for _, e in problems)
    assert any("'jobs' repeats" in e for _, e in problems)
    assert all(p.where and p.where.startswith(str(tmp_path)) for p in info.value.errors)


def test_missing_name_or_scope_is_required(tmp_path):
    with pytest.raises(c.ConfigError) as info:
        _load(tmp_path, '[[admin.tokens]]\ntoken = "t"\n')
    assert {p.key for p in info.value.errors} == {"admin.tokens[0].name", "admin.tokens[0].scope"}


@pytest.mark.parametrize("body, words", [
    ('token_env = "CKPTGW_TEST_UNSET_VARIABLE"', "no secret in $CKPTGW_TEST_UNSET_VARIABLE"),
    ('token_file = "/nonexistent/flush.token"', "cannot read /nonexistent/flush.token"),
    ('token = "old"', "'admin.token' and 'jobs' have the same secret"),
])
def test_secrets_that_cannot_be_used_stop_the_start(tmp_path, monkeypatch, body, words):
    monkeypatch.delenv("CKPTGW_TEST_UNSET_VARIABLE", raising=False)
    cfg = _load(tmp_path, f'[admin]\ntoken = "old"\n[[admin.tokens]]\nname = "jobs"\nscope = "flush"\n{body}\n')
    with pytest.raises(ValueError) as info:
        cfg.admin_tokens()
    assert words in str(info.value)


def test_tokens_are_no_serve_flag():
    assert not any("token" in flag and "tokens" in flag for flag, _, _ in c.flag_options())


# ---- the CLI with a scoped token ------------------------------------------------------------

def test_the_cli_with_a_flush_token(tcp_server, tmp_path, recorded_log):
    # (recorded_log: the server's log lines, same process, stay out of the CLI's stdout)
    addr = f"{tcp_server.tcp_address[0]}:{tcp_server.tcp_address[1]}"
    secret = tmp_path / "flush.token"
    secret.write_text("f-secret\n")
    env = {"CKPTGW_ADMIN_TOKEN": None, "CKPTGW_ADMIN_TOKEN_FILE": str(secret)}
    r = CliRunner().invoke(cli_main, ["--admin", addr, "evict", "/checkpoints/run1"], env=env)
    assert r.exit_code == EXIT["forbidden"] == 8
    assert "has scope 'flush'; evict needs 'admin'" in r.stderr
    r = CliRunner().invoke(cli_main, ["--admin", addr, "retention", "apply", "--yes", "--json"], env=env)
    assert r.exit_code == 8 and json.loads(r.stdout)["code"] == "forbidden"
    r = CliRunner().invoke(cli_main, ["--admin", addr, "reload", "--json"], env=env)
    assert r.exit_code == 8
    r = CliRunner().invoke(cli_main, ["--admin", addr, "status", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout) == {"ran": "status"}
    r = CliRunner().invoke(cli_main, ["--admin", addr, "status"], env={**env, "CKPTGW_ADMIN_TOKEN_FILE": None,
                                                                        "CKPTGW_ADMIN_TOKEN": "wrong"})
    assert r.exit_code == EXIT["denied"] == 6


# ---- the daemon -------------------------------------------------------------------------------

def test_a_live_daemon_serves_scoped_tokens_from_its_config(live_daemon, tmp_path):
    (tmp_path / "flush.token").write_text("flush-secret\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[admin]\nlisten = "127.0.0.1:0"\n\n[[admin.tokens]]\nname = "jobs"\nscope = "flush"\n'
                   f'token_file = "{tmp_path / "flush.token"}"\n')
    d = live_daemon(config=cfg)
    addr = d.status["admin_tcp"]
    env = {"CKPTGW_ADMIN_TOKEN": None, "CKPTGW_ADMIN_TOKEN_FILE": str(tmp_path / "flush.token")}

    def cli(*args, input=None):
        return CliRunner().invoke(cli_main, ["--admin", addr, *args], env=env, input=input)
    r = cli("flush", "--wait", "--timeout", "30", "/checkpoints", "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["waited"] is True
    for args in (("evict", "/checkpoints"), ("retention", "apply", "--yes"), ("reload",)):
        r = cli(*args)
        assert r.exit_code == 8 and "needs 'admin'" in r.stderr, (args, r.stderr)
    denied = [e for e in d.log_events() if e.get("event") == "admin_scope_denied"]
    assert [e["op"] for e in denied] == ["evict", "retention_apply", "reload"]
    assert all(e["caller"] == "jobs" and e["client"].startswith("127.0.0.1:") for e in denied)
    assert "flush-secret" not in d.read_log()
    assert d.cli("evict", "/checkpoints").exit_code in (0, 3)      # the socket is not scoped (3: try-out mode)
    # asked interactively, a token that may not apply is refused before the plan and the question
    before = len([e for e in d.log_events() if e.get("event") == "admin_scope_denied"])
    for args, apply in ((("retention", "apply"), "retention_apply"), (("lifecycle", "sync"), "lifecycle_sync")):
        r = cli(*args, input="y\n")
        assert r.exit_code == 8, (args, r.exit_code, r.stdout, r.stderr)
        assert r.stderr.strip() == (f"ckptgw: the admin token 'jobs' has scope 'flush'; {apply} needs 'admin'."), \
            r.stderr
        assert r.stdout == "" and "?" not in r.stderr, (r.stdout, r.stderr)      # no plan shown, nothing asked
    denied = [e for e in d.log_events() if e.get("event") == "admin_scope_denied"][before:]
    assert [(e["op"], e["asked"]) for e in denied] == [("retention_apply", "retention_plan"),
                                                       ("lifecycle_sync", "lifecycle_plan")]
    # status names the tokens in effect and their scopes, never a secret (issue 39)
    st = d.cli_json("status")
    assert st["admin_tokens"] == [{"name": "jobs", "scope": "flush",
                                   "secret_from": f"file {tmp_path / 'flush.token'}"}]
    human = d.cli("status").stdout
    assert f"admin tcp     {addr}" in human
    assert f"admin tokens  jobs (flush, file {tmp_path / 'flush.token'})" in human
    assert "flush-secret" not in human + json.dumps(st)
    r = cli("status", "--json")                                   # a read is within a flush token's scope
    assert r.exit_code == 0 and json.loads(r.stdout)["admin_tokens"] == st["admin_tokens"]


def test_a_token_whose_secret_is_missing_stops_the_start_before_the_store(tmp_path):
    import subprocess
    import sys
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nlisten = "127.0.0.1:0"\ncache_dir = "{tmp_path / "cache"}"\n'
                   f'[admin]\nsocket = "{tmp_path / "admin.sock"}"\nlisten = "127.0.0.1:0"\n'
                   '[[admin.tokens]]\nname = "jobs"\nscope = "flush"\ntoken_env = "CKPTGW_TEST_UNSET_VARIABLE"\n')
    env = {k: v for k, v in os.environ.items() if k != "CKPTGW_TEST_UNSET_VARIABLE"}
    proc = subprocess.run([sys.executable, "-m", "appliance.cli", "--config", str(cfg), "serve"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert "[[admin.tokens]] 'jobs': no secret in $CKPTGW_TEST_UNSET_VARIABLE" in proc.stderr
    assert not (tmp_path / "cache").exists()


def test_the_readme_table_says_what_the_scope_table_does():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = {}
    for scope in scopes.SCOPES:
        row = re.search(rf"^\| `{scope}` \| (.*) \|$", text, re.M).group(1)
        names = set()
        for chunk in re.findall(r"`([^`]+)`", row):
            names |= ({chunk.replace(" ", "_")} if chunk.split()[0] in ("retention", "lifecycle")
                      else set(chunk.split()))
        listed[scope] = names
    for scope in scopes.SCOPES:
        own = {cmd for cmd, s in scopes.COMMAND_SCOPE.items() if s == scope}
        assert own <= listed[scope], (scope, own - listed[scope])
        below = set().union(*(listed[s] for s in scopes.SCOPES[:scopes.SCOPES.index(scope)]))
        assert not (listed[scope] - own - below), (scope, listed[scope] - own - below)
