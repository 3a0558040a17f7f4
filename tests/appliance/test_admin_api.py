"""The admin API's edges: declared arguments only, a client timeout on a wedged daemon,
--version, --json always one document, ls --state as a filter."""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from appliance import commands
from appliance.admin import AdminClient, AdminError, AdminServer
from appliance.cli import main as cli_main
from cache.index import FORMAT
from tests.appliance.test_admin import LoopThread, loop_thread, sockdir  # noqa: F401 - fixtures

README = Path(__file__).resolve().parents[2] / "README.md"


class _NoDaemon:
    """A daemon whose every part refuses to be touched: argument checks come first."""

    def __getattr__(self, name):
        raise AssertionError(f"the command reached the daemon ({name}) with refused arguments")


def dispatch(cmd, args):
    return asyncio.run(commands.Commands(_NoDaemon()).dispatch(cmd, args, None))


@pytest.mark.parametrize("cmd, args, words", [
    ("retention_apply", {"now": 4e9}, "unknown argument(s) 'now'"),          # would age every checkpoint
    ("retention_apply", {"prefix": "other/"}, "unknown argument(s) 'prefix'"),
    ("retention_apply", {"rules": []}, "unknown argument(s) 'rules'"),
    ("retention_plan", {"now": 4e9}, "allowed: none"),
    ("lifecycle_sync", {"rules": [], "prefix": ""}, "unknown argument(s) 'prefix', 'rules'"),
    ("ls", {"recursive": "yes"}, "'recursive': expected true or false"),
    ("ls", {"path": 7}, "'path': expected a string"),
    ("ls", {"path": "a" * 5000}, "at most 4096 characters"),
    ("flush", {"timeout": -1}, "'timeout': expected a value in [0,"),
    ("flush", {"timeout": True}, "'timeout': expected a number, got a boolean"),
    ("retention_log", {"limit": 1.5}, "'limit': expected an integer"),
    ("retention_apply", {"only": "all"}, "'only': expected an array of strings"),
    ("pin", {"reason": "x" * 1000}, "at most 256 characters"),
    ("status", {"verbose": True}, "unknown argument(s) 'verbose'"),
])
def test_undeclared_or_ill_typed_arguments_are_refused(cmd, args, words):
    with pytest.raises(AdminError) as info:
        dispatch(cmd, args)
    assert info.value.code == "bad_request"
    assert words in info.value.message, info.value.message


def test_internal_parameters_win_even_if_a_schema_declared_them(monkeypatch):
    """Belt and braces: the daemon's own keyword arguments are applied after the caller's."""
    seen = {}

    async def plan(**kw):
        seen.update(kw)
        return {}
    import uploader.retention as retention
    monkeypatch.setattr(retention, "plan", plan)
    daemon = SimpleNamespace(store=object(), config=SimpleNamespace(retention=SimpleNamespace(series=("r",))),
                             object_client=None, uploader=None, s3_prefix="p/")
    asyncio.run(commands.Commands(daemon)._rules_module("retention", "plan", {"now": 4e9, "prefix": "x/"}))
    assert seen["prefix"] == "p/" and seen["now"] < 4e9 and seen["rules"] == ("r",)


def test_every_command_declares_its_arguments_and_the_readme_lists_them():
    declared = commands.schemas()
    handlers = {n[len("cmd_"):] for n in dir(commands.Commands) if n.startswith("cmd_")}
    assert set(declared) == handlers and all(isinstance(s, dict) for s in declared.values())
    text = README.read_text()
    listed = re.search(r"Commands: `([^`]+)`", text.replace("\n", " ")).group(1).split()
    assert sorted(listed) == sorted(declared)


# ---- the CLI against a fake daemon ---------------------------------------------------------

@pytest.fixture(autouse=True)
def quiet_server_logs():
    """The fake daemon runs in this process: its log lines must not land in the CLI's stdout."""
    import logging
    import structlog
    from appliance import logs
    logs.configure("json", "error", stream=open(os.devnull, "w"))
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers.clear()


class FakeDaemon:
    """An AdminServer answering with canned results, recording what the CLI sent."""

    def __init__(self, loop_thread, sockdir, results: dict):
        self.results, self.calls = results, []
        self.path = os.path.join(sockdir, "admin.sock")
        server = AdminServer(self.dispatch, self.path)
        loop_thread.run(server.start())
        loop_thread.servers.append(server)

    async def dispatch(self, cmd, args, progress):
        self.calls.append((cmd, args))
        return self.results[cmd]

    def cli(self, *args):
        return CliRunner().invoke(cli_main, ["--socket", self.path, *args], catch_exceptions=False)


PLAN = {"actions": [{"id": "a1", "action": "delete", "series": "s", "checkpoint": "runs/x/step_1", "step": 1,
                     "age": "2d", "rule": "keep_last", "reason": "old"}], "skipped": [], "notes": [],
        "summary": {}}
APPLIED = {"actions": PLAN["actions"], "skipped": [], "queued_jobs": 1, "resumed": []}
LC_PLAN = {"actions": [{"action": "put", "rule": "ckptgw-s", "detail": "new"}], "in_sync": False,
           "unchanged": [], "foreign_rules_kept": []}


@pytest.mark.parametrize("argv, plan_cmd", [(["retention", "apply", "--json"], "retention plan"),
                                             (["lifecycle", "sync", "--json"], "lifecycle plan")])
def test_json_without_yes_is_refused_before_anything_is_asked(loop_thread, sockdir, argv, plan_cmd):
    fake = FakeDaemon(loop_thread, sockdir, {"retention_plan": PLAN, "retention_apply": APPLIED,
                                             "lifecycle_plan": LC_PLAN, "lifecycle_sync": {"written": True}})
    r = fake.cli(*argv)
    assert r.exit_code == 2 and fake.calls == []
    assert "--json needs --yes" in r.stderr and plan_cmd in r.stderr
    doc = json.loads(r.stdout)                      # the refusal is the one document
    assert doc["ok"] is False and doc["code"] == "bad_request" and doc["exit"] == 2


def test_json_failures_are_one_document_too(sockdir, tmp_path):
    r = CliRunner().invoke(cli_main, ["--socket", os.path.join(sockdir, "none.sock"), "status", "--json"])
    assert r.exit_code == 7 and "no daemon" in r.stderr
    doc = json.loads(r.stdout)
    assert doc == {"ok": False, "code": "no_daemon", "exit": 7, "error": doc["error"]} and "no daemon" in doc["error"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nlease_time = "forever"\n[s3]\nbucket = "AB"\n')
    r = CliRunner().invoke(cli_main, ["check-config", "--json", str(bad)])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and [(p["key"], p["where"]) for p in doc["problems"]] == [
        ("server.lease_time", f"{bad}:2"), ("s3.bucket", f"{bad}:4")]
    good = tmp_path / "good.toml"
    good.write_text("[server]\nlease_time = 60\n")
    r = CliRunner().invoke(cli_main, ["check-config", "--json", str(good)])
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True


@pytest.mark.parametrize("argv, result", [(["retention", "apply", "--yes", "--json"], APPLIED),
                                           (["lifecycle", "sync", "--yes", "--json"], {"written": True}),
                                           (["retention", "plan", "--json"], PLAN),
                                           (["lifecycle", "plan", "--json"], LC_PLAN),
                                           (["status", "--json"], {"version": "x"})])
def test_json_is_exactly_one_document_on_stdout(loop_thread, sockdir, argv, result):
    fake = FakeDaemon(loop_thread, sockdir, {"retention_plan": PLAN, "retention_apply": APPLIED,
                                             "lifecycle_plan": LC_PLAN, "lifecycle_sync": {"written": True},
                                             "status": {"version": "x"}})
    r = fake.cli(*argv)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == result          # raises on a table before or after the document


def test_ls_state_filters_by_state(loop_thread, sockdir):
    entries = [{"path": p, "ino": i, "type": t, "size": 1, "state": st, "pinned": False, "progress": None}
               for i, (p, t, st) in enumerate([("d", "dir", "clean"), ("d/a", "reg", "dirty"),
                                               ("d/b", "reg", "clean"), ("d/c", "reg", "queued")])]
    fake = FakeDaemon(loop_thread, sockdir, {"ls": {"path": "", "entries": entries}})
    r = fake.cli("ls", "-R", "--state", "dirty", "--state", "queued", "--json", "/")
    assert r.exit_code == 0, r.stderr
    assert [e["path"] for e in json.loads(r.stdout)["entries"]] == ["d/a", "d/c"]
    r = fake.cli("ls", "--state", "clean", "/")
    assert "d/b" in r.stdout and "d/a" not in r.stdout and "d " not in r.stdout
    assert fake.cli("ls", "--state", "bogus", "/").exit_code == 2


def test_version_names_the_package_and_the_store_format():
    r = CliRunner().invoke(cli_main, ["--version"])
    assert r.exit_code == 0
    from importlib.metadata import version
    assert r.stdout.startswith(f"ckptgw {version('ckptgw')} ") and FORMAT.decode() in r.stdout


# ---- a wedged daemon ------------------------------------------------------------------------

@pytest.fixture
def wedged_socket(sockdir):
    """A Unix socket server that accepts and never answers (a daemon whose loop is stuck)."""
    path = os.path.join(sockdir, "admin.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except socket.timeout:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


@pytest.mark.timeout(60)
def test_a_wedged_daemon_makes_status_fail_not_hang(wedged_socket):
    r = CliRunner().invoke(cli_main, ["--socket", wedged_socket, "--admin-timeout", "0.5", "status"])
    assert r.exit_code == 4
    assert "did not answer within 0.5s" in r.stderr and "wedged" in r.stderr
    with pytest.raises(TimeoutError):
        with AdminClient(socket_path=wedged_socket, timeout=0.3) as client:
            client.call("status")


@pytest.mark.timeout(60)
def test_a_long_command_keeps_the_line_alive(loop_thread, sockdir, monkeypatch):
    """The client's timeout is on silence: a command longer than it still answers."""
    import appliance.admin as admin
    monkeypatch.setattr(admin, "HEARTBEAT_SECONDS", 0.1)

    async def slow(cmd, args, progress):
        await asyncio.sleep(1.0)
        return {"done": True}
    path = os.path.join(sockdir, "admin.sock")
    server = AdminServer(slow, path)
    loop_thread.run(server.start())
    loop_thread.servers.append(server)
    with AdminClient(socket_path=path, timeout=0.5) as client:
        assert client.call("anything") == {"done": True}
