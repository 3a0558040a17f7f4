"""nfsd/optable.py: one row per op, and every op-number rule of the server reads it."""
from __future__ import annotations

import pytest

import nfsd.xdr.nfs4 as n
from nfsd import drc
from nfsd.ops import HANDLERS
from nfsd.optable import (
    CLIENT_WORK, DESCRIPTORS, NON_IDEMPOTENT, SESSIONLESS, V40_ONLY, OpTable, any_client_work,
)


def test_every_declared_op_has_a_row_with_its_rfc_minor_version():
    assert set(DESCRIPTORS) == set(range(3, n.OP_REMOVEXATTR + 1))
    assert DESCRIPTORS[n.OP_WRITE].since == 0 and DESCRIPTORS[n.OP_RELEASE_LOCKOWNER].since == 0
    assert DESCRIPTORS[n.OP_BACKCHANNEL_CTL].since == 1 and DESCRIPTORS[n.OP_RECLAIM_COMPLETE].since == 1
    assert DESCRIPTORS[n.OP_ALLOCATE].since == 2 and DESCRIPTORS[n.OP_CLONE].since == 2
    # RFC 8276's xattr ops extend the 4.2 numbering
    assert {DESCRIPTORS[op].since for op in (n.OP_GETXATTR, n.OP_SETXATTR, n.OP_LISTXATTRS,
                                             n.OP_REMOVEXATTR)} == {2}
    assert n.OP_ILLEGAL not in DESCRIPTORS


def test_flags_are_the_rfc_sets():
    assert V40_ONLY == {n.OP_OPEN_CONFIRM, n.OP_RENEW, n.OP_SETCLIENTID, n.OP_SETCLIENTID_CONFIRM,
                        n.OP_RELEASE_LOCKOWNER}
    assert SESSIONLESS == {n.OP_EXCHANGE_ID, n.OP_CREATE_SESSION, n.OP_DESTROY_SESSION,
                           n.OP_DESTROY_CLIENTID, n.OP_BIND_CONN_TO_SESSION}
    # seqid-replayed ops (OPEN, CLOSE, LOCK...) are not the DRC's business
    assert NON_IDEMPOTENT == {n.OP_CREATE, n.OP_LINK, n.OP_REMOVE, n.OP_RENAME, n.OP_SETATTR}
    assert drc.NON_IDEMPOTENT is NON_IDEMPOTENT
    assert n.OP_WRITE in CLIENT_WORK and n.OP_GETATTR not in CLIENT_WORK
    assert any_client_work([n.OP_SEQUENCE, n.OP_PUTFH, n.OP_COMMIT])
    assert not any_client_work([n.OP_SEQUENCE, n.OP_PUTFH, n.OP_LOOKUP, n.OP_GETATTR])


def test_table_holds_every_handler_once_and_swaps_one():
    table = OpTable(HANDLERS)
    assert table.handlers() == HANDLERS
    assert table[n.OP_SEQUENCE].handler is None          # the COMPOUND loop's own
    assert table[n.OP_ILLEGAL] is None and table[-1] is None and table[2] is None

    async def other(ctx, args):
        return None
    table.set_handler(n.OP_READ, other)
    assert table.handler(n.OP_READ) is other and HANDLERS[n.OP_READ] is not other
    with pytest.raises(KeyError):
        table.set_handler(n.OP_ILLEGAL, other)
    with pytest.raises(ValueError, match="undeclared"):
        OpTable({9999: other})
