"""TEST_STATEID FREE_STATEID (RFC 8881 sections 18.48, 18.38)."""
from __future__ import annotations

from nfsd.errors import NfsError
from nfsd.ops._common import clientid_of, resolve_stateid_arg
from nfsd.xdr.nfs4 import (
    NFS4_OK, OP_FREE_STATEID, OP_TEST_STATEID, FREE_STATEID4res, TEST_STATEID4res,
    TEST_STATEID4resok,
)


async def op_test_stateid(ctx, args) -> TEST_STATEID4res:
    clientid = clientid_of(ctx)
    opens = ctx.server.opens
    codes = [opens.test(clientid, sid) for sid in args.ts_stateids]
    return TEST_STATEID4res(NFS4_OK, TEST_STATEID4resok(tsr_status_codes=codes))


async def op_free_stateid(ctx, args) -> FREE_STATEID4res:
    # The current stateid names the stateid to free (RFC 8881 16.2.3.1.2): after an
    # OPEN it is the open stateid, which holds state: NFS4ERR_LOCKS_HELD.
    sid = resolve_stateid_arg(ctx, args.fsa_stateid)
    status = ctx.server.opens.free(clientid_of(ctx), sid)
    if status != NFS4_OK:
        raise NfsError(status)
    return FREE_STATEID4res(fsr_status=NFS4_OK)


HANDLERS = {OP_TEST_STATEID: op_test_stateid, OP_FREE_STATEID: op_free_stateid}
