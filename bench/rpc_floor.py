"""The floor of any CPython event-loop server: what answering one RPC record costs when the server
does nothing else (no decoding, no task, a canned reply), to set beside a real server's CPU per
request. `python -m bench.rpc_floor [--loop uvloop|asyncio]` serves on a free loopback port and
prints `port=N`; `null_calls(port, seconds)` is its load (and loads any ONC-RPC server: NFS NULL
calls). The gateway serves on uvloop (nfsd/eventloop.py), so its floor is the uvloop one; the
stdlib loop's is measured beside it.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import time

from nfsd.rpc import LAST_FRAGMENT, frame

_MARK = struct.Struct(">I")
NFS_PROGRAM, NFS_V4 = 100003, 4


def null_call(xid: int) -> bytes:
    """One framed ONC-RPC call of NFSv4's NULL procedure with AUTH_NONE (RFC 5531)."""
    return frame(struct.pack(">6I4I", xid, 0, 2, NFS_PROGRAM, NFS_V4, 0, 0, 0, 0, 0))


def null_calls(port: int, seconds: float) -> int:
    """NULL calls one after the other (each waits for its reply) for `seconds`; their count."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop:
            s.sendall(null_call(n))
            (mark,) = _MARK.unpack(s.recv(4, socket.MSG_WAITALL))
            s.recv(mark & ~LAST_FRAGMENT, socket.MSG_WAITALL)
            n += 1
        return n


def null_calls_n(port: int, count: int) -> None:
    """`count` NULL calls one after the other (bench/instructions.py counts per call)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for n in range(count):
            s.sendall(null_call(n))
            (mark,) = _MARK.unpack(s.recv(4, socket.MSG_WAITALL))
            s.recv(mark & ~LAST_FRAGMENT, socket.MSG_WAITALL)


class _Echo(asyncio.Protocol):
    """Answers each record with an accepted, successful reply carrying the call's xid."""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            size = _MARK.unpack_from(self.buf)[0] & ~LAST_FRAGMENT
            if len(self.buf) < 4 + size:
                return
            xid, self.buf = self.buf[4:8], self.buf[4 + size:]
            # REPLY, MSG_ACCEPTED, empty AUTH_NONE verifier, SUCCESS
            self.transport.write(frame(xid + struct.pack(">5I", 1, 0, 0, 0, 0)))


async def _serve() -> None:
    server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
    print(f"port={server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.rpc_floor")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="asyncio")
    if parser.parse_args().loop == "uvloop":
        import uvloop
        uvloop.run(_serve())
    else:
        asyncio.run(_serve())
