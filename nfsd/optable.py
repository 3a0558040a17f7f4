"""The NFSv4 op descriptor table: one row per op with everything the server decides by op number.

NFS-Ganesha's `optabv4[]` shape (nfs4_Compound.c): each row names the op, its handler and its
flags, and every rule that depends on the op number reads its row instead of a set of its own:

- `since`: the first minor version whose numbering has the op (RFC 7530 ops 3-39: 0, RFC 8881
  40-58: 1, RFC 7862 59-71 and RFC 8276's xattr ops 72-75: 2); in an older minor version the
  op number is OP_ILLEGAL;
- `v40_only`: an NFSv4.0 op that NFSv4.1 servers MUST NOT implement (RFC 8881 section 18,
  "MNI"): NFS4ERR_NOTSUPP from 4.1 on;
- `sessionless`: may be a 4.1 COMPOUND's only op, without SEQUENCE (RFC 8881 2.6.3.1.1.x);
- `non_idempotent`: a second run differs from the first and the op has no seqid replay of its
  own, so the NFSv4.0 duplicate-request cache keeps the reply of a COMPOUND that ran it
  (nfsd/drc.py; OPEN, CLOSE, LOCK... replay by their owner's seqid, nfsd/owners.py);
- `client_work`: a client saving or reading; such a COMPOUND stamps the server's
  `last_client_op`, and the uploader's drain yields to it (uploader/foreground.py). Not SEQUENCE,
  GETATTR, LOOKUP and the like: a mounted, idle cluster renews and revalidates all the time;
- `handler`: `async handler(ctx, args) -> X4res` from the op's family module in nfsd/ops
  (None: not offered, NFS4ERR_NOTSUPP; SEQUENCE is the COMPOUND loop's own);
- `native`: the handler's typed twin (nfsd/native/fileops.pyx), a plain function with the same
  results and errors that the native COMPOUND loop calls without a coroutine, or None. Swapping
  the handler drops it.

The table is a list indexed by op number (the native engine keeps the same rows as C arrays).
Op numbers above the highest declared one (75, REMOVEXATTR), OP_ILLEGAL included, have no row.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Iterable

import nfsd.xdr.nfs4 as nfs4

Handler = Callable[..., Awaitable]

# Fore channel ops only: the callback ops (OP_CB_*) reuse the same numbers.
OP_NAMES: dict[int, str] = {getattr(nfs4, n): n[3:] for n in dir(nfs4)
                            if n.startswith("OP_") and not n.startswith("OP_CB_")
                            and isinstance(getattr(nfs4, n), int)}
# The last op number of each minor version's numbering (RFC 7530, RFC 8881, RFC 7862 + RFC 8276).
LAST_OP = {0: 39, 1: 58, 2: 75}

_V40_ONLY = {"OPEN_CONFIRM", "RENEW", "SETCLIENTID", "SETCLIENTID_CONFIRM", "RELEASE_LOCKOWNER"}
_SESSIONLESS = {"EXCHANGE_ID", "CREATE_SESSION", "DESTROY_SESSION", "DESTROY_CLIENTID",
                "BIND_CONN_TO_SESSION"}
_NON_IDEMPOTENT = {"CREATE", "LINK", "REMOVE", "RENAME", "SETATTR"}
_CLIENT_WORK = {"READ", "READ_PLUS", "WRITE", "WRITE_SAME", "COMMIT", "OPEN", "CREATE", "REMOVE",
                "RENAME", "LINK", "SETATTR", "COPY", "CLONE", "ALLOCATE", "DEALLOCATE"}


@dataclass(frozen=True, slots=True)
class OpDesc:
    num: int
    name: str
    since: int
    v40_only: bool = False
    sessionless: bool = False
    non_idempotent: bool = False
    client_work: bool = False
    handler: Handler | None = None
    native: Callable | None = None


def _since(num: int) -> int:
    return min(minor for minor, last in LAST_OP.items() if num <= last)


def _describe(num: int, name: str) -> OpDesc:
    return OpDesc(num, name, _since(num), v40_only=name in _V40_ONLY,
                  sessionless=name in _SESSIONLESS, non_idempotent=name in _NON_IDEMPOTENT,
                  client_work=name in _CLIENT_WORK)


# The rows without handlers: what is true of an op whoever serves it.
DESCRIPTORS: dict[int, OpDesc] = {num: _describe(num, name) for num, name in OP_NAMES.items()
                                  if 3 <= num <= LAST_OP[max(LAST_OP)]}
for _names in (_V40_ONLY, _SESSIONLESS, _NON_IDEMPOTENT, _CLIENT_WORK):
    assert _names <= {d.name for d in DESCRIPTORS.values()}, _names - {d.name for d in DESCRIPTORS.values()}

# Sets derived from the rows, for the callers that ask about a whole COMPOUND's ops.
NON_IDEMPOTENT = frozenset(d.num for d in DESCRIPTORS.values() if d.non_idempotent)
CLIENT_WORK = frozenset(d.num for d in DESCRIPTORS.values() if d.client_work)
SESSIONLESS = frozenset(d.num for d in DESCRIPTORS.values() if d.sessionless)
V40_ONLY = frozenset(d.num for d in DESCRIPTORS.values() if d.v40_only)


class OpTable:
    """The rows with the handlers a server runs, indexed by op number (`rows[num]`, None where
    no op is declared). One per server: tests swap a handler with `set_handler`."""

    __slots__ = ("rows",)

    def __init__(self, handlers: dict[int, Handler], native: dict[int, Callable] | None = None):
        native = native or {}
        unknown = (set(handlers) | set(native)) - set(DESCRIPTORS)
        if unknown:
            raise ValueError(f"handlers for undeclared ops {sorted(unknown)}")
        if set(native) - set(handlers):
            raise ValueError(f"native forms without a handler: {sorted(set(native) - set(handlers))}")
        self.rows: list[OpDesc | None] = [None] * (max(DESCRIPTORS) + 1)
        for num, desc in DESCRIPTORS.items():
            self.rows[num] = replace(desc, handler=handlers.get(num), native=native.get(num))

    def __getitem__(self, num: int) -> OpDesc | None:
        rows = self.rows
        return rows[num] if 0 <= num < len(rows) else None

    def handler(self, num: int) -> Handler | None:
        row = self[num]
        return None if row is None else row.handler

    def set_handler(self, num: int, handler: Handler | None) -> None:
        row = self[num]
        if row is None:
            raise KeyError(f"op {num} is not declared")
        self.rows[num] = replace(row, handler=handler, native=None)

    def handlers(self) -> dict[int, Handler]:
        return {row.num: row.handler for row in self.rows if row is not None and row.handler}


def any_client_work(opnums: Iterable[int]) -> bool:
    return not CLIENT_WORK.isdisjoint(opnums)


def op_name(num: int) -> str:
    return OP_NAMES.get(num, f"op{num}")
