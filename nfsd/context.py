"""Per-COMPOUND state handed to every op handler (RFC 8881 section 16.2.3)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Cred:
    """The RPC caller's credentials as received (squashing is the export's job)."""
    flavor: int                  # AUTH_NONE=0, AUTH_SYS=1
    uid: int = 65534
    gid: int = 65534
    gids: tuple[int, ...] = ()
    machinename: bytes = b""


@dataclass(slots=True)
class CompoundContext:
    server: Any                      # nfsd.server.NfsServer: .store .exports .sessions .opens .write_verifier
    cred: Cred
    peer: tuple                      # (ip, port) of the client connection
    conn: Any                        # the transport connection (for BIND_CONN_TO_SESSION / backchannel)
    minorversion: int
    session: Any = None              # set by SEQUENCE (4.1)
    client: Any = None               # the Client of the session (or of 4.0 clientid ops)
    current_fh: Any = None           # nfsd.fh.FileHandle
    saved_fh: Any = None
    current_stateid: Any = None      # stateid4 (4.1 "current stateid", RFC 8881 16.2.3.1.2)
    saved_stateid: Any = None
    tag: bytes = b""
    extra: dict = field(default_factory=dict)
