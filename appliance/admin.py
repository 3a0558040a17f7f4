"""The admin API transport: JSON lines over a Unix socket (and, only if configured, TCP).

Wire format, one JSON object per line each way:
    request   {"cmd": "flush", "args": {"path": "run1", "wait": true}, "token": "..."}
              optional "prepares": ["retention_apply"]: commands the caller means to send after this
              one (the plan shown before a confirmation); the token's scope must cover them too, so a
              token that may not apply is refused before anybody is asked to confirm
    progress  {"progress": {...}}              (zero or more, for long commands)
    alive     {"alive": true}                  (every HEARTBEAT_SECONDS while a command runs)
    reply     {"ok": true, "result": {...}}  |  {"ok": false, "code": "timeout", "error": "..."}
A connection may carry several requests, one after the other. The heartbeat lets a client
put a timeout on silence rather than on a command's length: a long `verify` keeps the line
alive, a wedged daemon (its event loop stuck) does not, and the client gives up with a clear
message instead of hanging.

Who may talk: on the Unix socket the peer's credentials (SO_PEERCRED, taken by the kernel at
connect) must be the daemon's uid, root, or a member of the configured admin group; the
socket file's mode (0600 by default) is the first fence; its peers may run every command. Over
TCP every request must carry one of the configured tokens (compared in constant time), and the
token's scope must cover the command (appliance.scopes: read < flush < admin). The commands
themselves live in appliance.commands; this module knows nothing of them.
"""
from __future__ import annotations

import asyncio
import errno
import grp
import json
import os
import socket
import struct
from typing import Any, Awaitable, Callable

import structlog

from . import scopes

log = structlog.get_logger(__name__)

MAX_REQUEST = 1 << 20
HEARTBEAT_SECONDS = 5.0
DEFAULT_CLIENT_TIMEOUT = 30.0        # seconds of silence from the daemon before a client gives up

# error codes on the wire; the CLI maps them to exit codes
# ("denied": no or a wrong token, or a refused peer; "forbidden": a good token whose scope does not
# cover the command)
CODES = ("bad_request", "denied", "forbidden", "not_found", "unavailable", "timeout", "failed", "busy")


class AdminError(Exception):
    """A command failed in a way the caller should be told about in one sentence."""

    def __init__(self, code: str, message: str):
        assert code in CODES, code
        super().__init__(message)
        self.code = code
        self.message = message


Progress = Callable[[dict], Awaitable[None]]
Dispatch = Callable[[str, dict, Progress], Awaitable[Any]]


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected this Unix socket."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)


def _supplementary_groups(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def _gid_of(group: str) -> int:
    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


class AdminServer:
    """Serves `dispatch` on a Unix socket and optionally on TCP with scoped tokens. `token`: the
    single token of old configs, an admin-scoped one."""

    def __init__(self, dispatch: Dispatch, socket_path: str, *, mode: int = 0o600,
                 group: str | None = None, tcp: tuple[str, int] | None = None, token: str | None = None,
                 tokens: tuple[scopes.Token, ...] = ()):
        tokens = tuple(tokens) + ((scopes.Token("token", "admin", token),) if token else ())
        if tcp and not tokens:
            raise ValueError("the admin API over TCP needs a token")
        self.dispatch = dispatch
        self.socket_path = socket_path
        self.mode = mode
        self.group_gid = _gid_of(group) if group else None
        self.tcp = tcp
        self.tokens = tokens
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[asyncio.Task] = set()
        self.tcp_address: tuple | None = None

    async def start(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.socket_path))
        os.makedirs(directory, mode=0o755, exist_ok=True)
        if os.path.exists(self.socket_path):
            if _socket_in_use(self.socket_path):
                raise OSError(errno.EADDRINUSE, "another ckptgw serves this admin socket", self.socket_path)
            os.unlink(self.socket_path)           # left by a daemon that did not exit cleanly
        # create it with no access at all, then open it up: no window where it is too open
        old_umask = os.umask(0o777)
        try:
            srv = await asyncio.start_unix_server(self._serve_unix, path=self.socket_path,
                                                  limit=MAX_REQUEST)
        finally:
            os.umask(old_umask)
        mode = self.mode
        if self.group_gid is not None:
            os.chown(self.socket_path, -1, self.group_gid)
            mode |= 0o060              # the group's members need read+write to connect
        os.chmod(self.socket_path, mode)
        self._servers.append(srv)
        if self.tcp:
            tsrv = await asyncio.start_server(self._serve_tcp, self.tcp[0], self.tcp[1], limit=MAX_REQUEST)
            self.tcp_address = tsrv.sockets[0].getsockname()[:2]
            self._servers.append(tsrv)
            log.warning("admin_tcp_enabled", listen=f"{self.tcp_address[0]}:{self.tcp_address[1]}")
        log.info("admin_listening", socket=self.socket_path, mode=oct(mode))

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        for srv in self._servers:
            await srv.wait_closed()
        self._servers.clear()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    # -- connections --------------------------------------------------------------------
    def _allowed(self, pid: int, uid: int, gid: int) -> bool:
        if uid in (0, os.getuid()):
            return True
        if self.group_gid is not None:
            return gid == self.group_gid or self.group_gid in _supplementary_groups(pid)
        return False

    async def _serve_unix(self, reader, writer) -> None:
        pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
        if not self._allowed(pid, uid, gid):
            log.warning("admin_refused", peer_pid=pid, peer_uid=uid, peer_gid=gid)
            try:      # take the request first: closing on unread data would reset the connection
                await asyncio.wait_for(reader.readline(), 2.0)
            except (asyncio.TimeoutError, ValueError, ConnectionError):
                pass
            await _send(writer, {"ok": False, "code": "denied",
                                 "error": f"uid {uid} may not use the admin API (allowed: uid "
                                          f"{os.getuid()}, root"
                                          + (f", group {self.group_gid}" if self.group_gid is not None else "")
                                          + ")"})
            writer.close()
            return
        await self._serve(reader, writer, who={"peer_uid": uid, "peer_pid": pid}, need_token=False)

    async def _serve_tcp(self, reader, writer) -> None:
        peer = writer.get_extra_info("peername")
        await self._serve(reader, writer, who={"client": f"{peer[0]}:{peer[1]}"}, need_token=True)

    async def _serve(self, reader, writer, who: dict, need_token: bool) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await _send(writer, {"ok": False, "code": "bad_request", "error": "request line too long"})
                    break
                except ConnectionError:
                    break
                if not line:
                    break
                reply = await self._handle(line, writer, who, need_token)
                if not await _send(writer, reply):
                    break
        except asyncio.CancelledError:
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _handle(self, line: bytes, writer, who: dict, need_token: bool) -> dict:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                raise ValueError("expected an object with a string 'cmd'")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise ValueError("'args' must be an object")
        except ValueError as e:
            return {"ok": False, "code": "bad_request", "error": f"malformed request: {e}"}
        if need_token:
            token = scopes.match(self.tokens, req.get("token"))
            if token is None:
                log.warning("admin_refused", reason="bad token", cmd=req["cmd"], **who)
                return {"ok": False, "code": "denied", "error": "missing or wrong admin token"}
            prepares = req.get("prepares") or []
            if not isinstance(prepares, list) or not all(isinstance(c, str) for c in prepares):
                return {"ok": False, "code": "bad_request",
                        "error": "malformed request: 'prepares' must be a list of command names"}
            for op in [req["cmd"], *prepares]:          # what it asks now first, then what it prepares
                if not scopes.allows(token.scope, op):
                    need = scopes.needed(op)
                    log.warning("admin_scope_denied", op=op, caller=token.name, scope=token.scope,
                                needs=need, **who, **({"asked": req["cmd"]} if op != req["cmd"] else {}))
                    return {"ok": False, "code": "forbidden",
                            "error": f"the admin token {token.name!r} has scope {token.scope!r}; "
                                     f"{op} needs {need!r}"}
            who = {**who, "caller": token.name}

        async def progress(info: dict) -> None:
            await _send(writer, {"progress": info})

        log.info("admin_request", cmd=req["cmd"], args=args, **who)
        task = asyncio.ensure_future(self.dispatch(req["cmd"], args, progress))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=HEARTBEAT_SECONDS)
                if not task.done():
                    await _send(writer, {"alive": True})
            result = task.result()
        except asyncio.CancelledError:
            task.cancel()
            raise
        except AdminError as e:
            return {"ok": False, "code": e.code, "error": e.message}
        except Exception as e:          # a bug: say so, keep serving
            log.exception("admin_command_failed", cmd=req["cmd"])
            return {"ok": False, "code": "failed", "error": f"internal error in {req['cmd']}: {e}"}
        return {"ok": True, "result": result}


async def _send(writer, obj: dict) -> bool:
    try:
        writer.write(json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n")
        await writer.drain()
        return True
    except (ConnectionError, RuntimeError):
        return False


def _socket_in_use(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


# ---- client side (the CLI) ----------------------------------------------------------

class AdminClient:
    """Blocking client: call(cmd, args, on_progress) -> result, raising AdminError.
    `timeout` bounds the connect and every wait for the next line (the daemon's heartbeat
    arrives every HEARTBEAT_SECONDS while a command runs); socket.timeout (TimeoutError) is
    raised when it passes."""

    def __init__(self, socket_path: str | None = None, tcp: tuple[str, int] | None = None,
                 token: str | None = None, timeout: float | None = DEFAULT_CLIENT_TIMEOUT):
        self.token = token
        if tcp:
            self.sock = socket.create_connection(tcp, timeout=timeout)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(socket_path)
            except BaseException:
                self.sock.close()
                raise
        self.file = self.sock.makefile("rwb")

    def call(self, cmd: str, args: dict | None = None,
             on_progress: Callable[[dict], None] | None = None, prepares: tuple[str, ...] = ()) -> Any:
        """`prepares`: the commands this call prepares (see the module's docstring): a token
        whose scope does not cover them is refused now, not after a confirmation."""
        req = {"cmd": cmd, "args": args or {}}
        if prepares:
            req["prepares"] = list(prepares)
        if self.token:
            req["token"] = self.token
        self.file.write(json.dumps(req).encode() + b"\n")
        self.file.flush()
        while True:
            line = self.file.readline()
            if not line:
                raise AdminError("failed", "the daemon closed the connection without an answer")
            msg = json.loads(line)
            if "alive" in msg:
                continue
            if "progress" in msg:
                if on_progress:
                    on_progress(msg["progress"])
                continue
            if msg.get("ok"):
                return msg.get("result")
            raise AdminError(msg.get("code", "failed") if msg.get("code") in CODES else "failed",
                             msg.get("error", "unknown error"))

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
