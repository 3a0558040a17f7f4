"""The admin transport: JSON lines, progress, errors, SO_PEERCRED checks, the TCP token."""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import stat
import tempfile
import threading

import pytest

from appliance.admin import AdminClient, AdminError, AdminServer

NOBODY = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")


async def dispatch(cmd, args, progress):
    if cmd == "echo":
        return {"args": args}
    if cmd == "count":
        for i in range(3):
            await progress({"i": i})
        return {"done": 3}
    if cmd == "missing":
        raise AdminError("not_found", "run1 does not exist in the cache")
    if cmd == "crash":
        raise RuntimeError("boom")
    raise AdminError("bad_request", f"unknown command {cmd!r}")


class LoopThread:
    """An event loop in a thread, so blocking clients in the test can talk to the server."""

    def __init__(self):
        self.servers: list[AdminServer] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self):
        for server in self.servers:
            self.run(server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="ckptgw-admin-")
    os.chmod(d, 0o755)              # another uid must be able to reach the socket file
    yield d
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def start(loop_thread, path, **kw) -> AdminServer:
    server = AdminServer(dispatch, path, **kw)
    loop_thread.run(server.start())
    loop_thread.servers.append(server)
    return server


def test_requests_replies_progress_and_errors(loop_thread, sockdir):
    path = os.path.join(sockdir, "admin.sock")
    server = start(loop_thread, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    seen = []
    with AdminClient(socket_path=path, timeout=10) as client:
        assert client.call("echo", {"x": 1}) == {"args": {"x": 1}}
        assert client.call("count", on_progress=seen.append) == {"done": 3}
        assert seen == [{"i": 0}, {"i": 1}, {"i": 2}]
        with pytest.raises(AdminError) as info:
            client.call("missing")
        assert info.value.code == "not_found" and "run1" in info.value.message
        with pytest.raises(AdminError) as info:
            client.call("crash")
        assert info.value.code == "failed" and "boom" in info.value.message
        assert client.call("echo") == {"args": {}}          # the connection survived all that
    with socket.socket(socket.AF_UNIX) as s:                  # garbage gets a clear answer
        s.connect(path)
        s.sendall(b"not json\n")
        reply = json.loads(s.makefile("rb").readline())
        assert reply["ok"] is False and reply["code"] == "bad_request"
    loop_thread.run(server.stop())
    loop_thread.servers.remove(server)
    assert not os.path.exists(path)


def test_a_second_daemon_cannot_steal_the_socket(loop_thread, sockdir):
    path = os.path.join(sockdir, "admin.sock")
    server = start(loop_thread, path)
    with pytest.raises(OSError, match="another ckptgw"):
        start(loop_thread, path)


def _as_nobody(path: str, gid: int | None = None) -> dict:
    """Fork; the child drops to nobody and calls `echo`; returns what happened."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid if gid is not None else NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            try:
                with AdminClient(socket_path=path, timeout=10) as client:
                    out = {"result": client.call("echo", {"who": "nobody"})}
            except AdminError as e:
                out = {"admin_error": e.code, "message": e.message}
            except PermissionError as e:
                out = {"connect_error": e.errno}
            except Exception as e:               # noqa: BLE001 - reported to the parent
                out = {"unexpected": repr(e)}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@needs_root
def test_socket_mode_keeps_other_uids_out(loop_thread, sockdir):
    path = os.path.join(sockdir, "admin.sock")
    start(loop_thread, path)
    import errno
    assert _as_nobody(path) == {"connect_error": errno.EACCES}


@needs_root
def test_peer_credentials_refuse_other_uids(loop_thread, sockdir):
    # a world-writable socket: only SO_PEERCRED stands between nobody and the API
    path = os.path.join(sockdir, "admin.sock")
    start(loop_thread, path, mode=0o666)
    out = _as_nobody(path)
    assert out["admin_error"] == "denied"
    assert f"uid {NOBODY.pw_uid} may not use the admin API" in out["message"]


@needs_root
def test_admin_group_members_are_let_in(loop_thread, sockdir):
    path = os.path.join(sockdir, "admin.sock")
    start(loop_thread, path, group="nogroup")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == 65534
    assert _as_nobody(path, gid=65534) == {"result": {"args": {"who": "nobody"}}}


def test_tcp_needs_the_token(loop_thread, sockdir):
    path = os.path.join(sockdir, "admin.sock")
    with pytest.raises(ValueError):
        AdminServer(dispatch, path, tcp=("127.0.0.1", 0))
    server = start(loop_thread, path, tcp=("127.0.0.1", 0), token="s3cret")
    with AdminClient(tcp=server.tcp_address, token="s3cret", timeout=10) as client:
        assert client.call("echo", {"a": 1}) == {"args": {"a": 1}}
    for token in ("wrong", None):
        with AdminClient(tcp=server.tcp_address, token=token, timeout=10) as client:
            with pytest.raises(AdminError) as info:
                client.call("echo")
            assert info.value.code == "denied"
