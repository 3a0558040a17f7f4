"""Per-COMPOUND state handed to every op handler (RFC 8881 section 16.2.3)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    from cache.api import NfsStore
    from nfsd.exports import Exports
    from nfsd.grace import Grace
    from nfsd.limits import RateLimitedLog
    from nfsd.offload import OffloadTable
    from nfsd.openstate import OpenStateTable
    from nfsd.optable import OpTable
    from nfsd.state import SessionManager


class ServerContext(Protocol):
    """What the op handlers, the COMPOUND loop and the attribute getters use of `ctx.server`:
    `nfsd.server.NfsServer` implements it, and so does the ops harness's FakeServer
    (tests/nfsd/test_server_context.py holds both to it). A handler that needs more of the
    server adds it here first."""

    store: NfsStore                      # cache/api.py: the store calls nfsd makes
    exports: Exports                     # pseudo-root, export checks, idmap
    sessions: SessionManager             # clients, sessions, slots, leases (nfsd/state.py)
    opens: OpenStateTable                # open and lock stateids (nfsd/openstate.py)
    grace: Grace                         # reclaim after a restart (nfsd/grace.py)
    offloads: OffloadTable               # asynchronous COPYs (nfsd/offload.py)
    ops: OpTable                         # the op descriptor table (nfsd/optable.py)
    write_verifier: bytes                # WRITE / COMMIT verifier (the store's)
    lease_time: float                    # seconds (FATTR4_LEASE_TIME)
    server_owner: bytes                  # EXCHANGE_ID's server owner major id
    server_scope: bytes                  # EXCHANGE_ID's server scope
    ratelog: RateLimitedLog              # refusals logged at most once per client and interval
    # Hooks, None when not set. observer(op_name, status_name, seconds, nbytes): per-op
    # metrics. fetch_missing(ino, ranges): read-through of ABSENT ranges (may return an
    # awaitable); note_read(ino, offset, nbytes): readahead hears of READs of such files.
    observer: Callable[[str, str, float, int], None] | None
    fetch_missing: Callable[[int, list], Awaitable[None] | None] | None
    note_read: Callable[[int, int, int], None] | None

    def run_blocking(self, fn: Callable, *args) -> Awaitable[Any]:
        """Run a blocking call (fsync, LMDB sync) off the event loop; returns an awaitable."""
        ...

    def start_blocking(self, fn: Callable, *args) -> None:
        """Start a blocking call off the event loop without waiting for it (it answers its
        caller another way: Store.commit_async)."""
        ...


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
    server: ServerContext            # nfsd.server.NfsServer (or the ops harness's FakeServer)
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
    # (current_fh, export, attr) as the typed ops (nfsd/native/fileops.pyx) resolved it during
    # their run of consecutive ops; the native loop clears it before any other op
    resolved: Any = None
