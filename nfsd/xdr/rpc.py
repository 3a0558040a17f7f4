"""ONC RPC v2 message types (RFC 5531), built from rpc_prot.x at import.

Every type and constant of rpc_prot.x is a module attribute under its RFC name
(rpc_msg, call_body, reply_body, accepted_reply, rejected_reply, opaque_auth,
authsys_parms, MSG_ACCEPTED, SUCCESS, AUTH_SYS, ...).  The anonymous members of the
RFC text are named <parent>_<field>:

    rpc_msg_body                             union (CALL: call_body, REPLY: reply_body)
    accepted_reply_reply_data                union on accept_stat
    accepted_reply_reply_data_mismatch_info  struct low, high (PROG_MISMATCH)
    rejected_reply_mismatch_info             struct low, high (RPC_MISMATCH)

Procedure arguments/results are not part of these types: call_body ends before the
arguments and accepted_reply's SUCCESS arm is opaque[0], so the RPC layer unpacks the
header with rpc_msg.unpack(buf, 0) and the procedure body from the returned offset.
"""
from __future__ import annotations

from ._loader import load_package_spec

_ns = load_package_spec("rpc_prot.x")
globals().update(_ns)
__all__ = sorted(_ns)
