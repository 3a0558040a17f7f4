"""What each admin token may do: the one table of command -> scope, and the token check.

Scopes nest: `read` < `flush` < `admin`; a token of a scope may run every command of that scope
and of the scopes below it.
  read   looks, changes nothing: status, ls, clients, exports, check, verify, the plans, the log
  flush  also moves data between the cache and S3 without deleting or un-protecting anything:
         flush (a training job waiting for its checkpoint) and warmup (one about to resume)
  admin  everything: reload, evict, pin/unpin, import, retention apply, lifecycle sync
A command missing from COMMAND_SCOPE needs `admin` (closed by default); the tests fail until a
new command is given its line here. The Unix socket is not scoped: its peers are admins.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

SCOPES = ("read", "flush", "admin")          # each includes the ones before it

COMMAND_SCOPE = {
    "status": "read",
    "ls": "read",
    "clients": "read",
    "exports": "read",
    "check": "read",
    "verify": "read",
    "retention_plan": "read",
    "retention_log": "read",
    "lifecycle_plan": "read",
    "flush": "flush",
    "warmup": "flush",
    "reload": "admin",
    "evict": "admin",
    "pin": "admin",
    "unpin": "admin",
    "import": "admin",
    "retention_apply": "admin",
    "lifecycle_sync": "admin",
}


def needed(cmd: str) -> str:
    """The scope `cmd` needs (the wire name; `retention-apply` spelled with a dash too)."""
    return COMMAND_SCOPE.get(cmd.replace("-", "_"), "admin")


def allows(scope: str, cmd: str) -> bool:
    return SCOPES.index(scope) >= SCOPES.index(needed(cmd))


@dataclass(frozen=True)
class Token:
    name: str              # shown in logs, never the secret
    scope: str
    secret: str

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {self.scope!r}; expected one of {', '.join(SCOPES)}")
        if not self.secret:
            raise ValueError(f"the admin token {self.name!r} is empty")


def _digest(text: str) -> bytes:
    # equal-length digests: compare_digest then takes the same time whatever the lengths
    return hashlib.sha256(text.encode()).digest()


def match(tokens: tuple[Token, ...] | list[Token], presented) -> Token | None:
    """The token whose secret was presented, or None. Every token is compared, in constant time,
    so the time taken tells nothing about which (or how much of one) matched."""
    given = _digest(presented if isinstance(presented, str) else "")
    found = None
    for token in tokens:
        if hmac.compare_digest(given, _digest(token.secret)) and found is None:
            found = token
    return found
