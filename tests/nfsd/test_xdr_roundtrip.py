"""Round trips of EVERY declared XDR type of nfs4 and rpc, with hypothesis strategies
derived from the type descriptions (not written per type)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsd.xdr import decode, encode
from nfsd.xdr import nfs4, rpc
from tests.fuzz.xdr_strategies import XdrStrategies

# Keep generated values small: the point is coverage of every type's shape. The
# derivation from the type descriptions is shared with the fuzzer.
strategy_for = XdrStrategies(max_bytes=12, max_items=2, max_depth=8, edges=False).for_type


def _types(module):
    seen = {}
    for name in module.__all__:
        t = getattr(module, name)
        if isinstance(t, int) or id(t) in seen:
            continue
        seen[id(t)] = name
    return sorted(seen.values())


NFS4_TYPES = _types(nfs4)
RPC_TYPES = _types(rpc)


def test_type_inventory_is_complete():
    # Every kind of RFC 7863 definition made it through the parser.
    assert len(NFS4_TYPES) > 300      # distinct objects; typedef aliases share one
    for name in ("COMPOUND4args", "COMPOUND4res", "CB_COMPOUND4args", "nfs_cb_resop4",
                 "write_response4", "fattr4_acl", "SECINFO4resok", "entry4", "netloc4"):
        assert name in NFS4_TYPES
    for name in ("rpc_msg", "rpc_msg_body", "accepted_reply_reply_data", "authsys_parms"):
        assert name in RPC_TYPES


def _round_trip(t, value):
    data = encode(t, value)
    back = decode(t, data)
    assert back == value
    assert encode(t, back) == data          # canonical: re-encoding gives the same bytes
    assert len(data) % 4 == 0


@pytest.mark.parametrize("name", NFS4_TYPES)
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_nfs4_type_round_trip(name, data):
    t = getattr(nfs4, name)
    _round_trip(t, data.draw(strategy_for(t)))


@pytest.mark.parametrize("name", RPC_TYPES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_rpc_type_round_trip(name, data):
    t = getattr(rpc, name)
    _round_trip(t, data.draw(strategy_for(t)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_compound_messages_round_trip(data):
    for t in (nfs4.COMPOUND4args, nfs4.COMPOUND4res, nfs4.CB_COMPOUND4args,
              nfs4.CB_COMPOUND4res):
        _round_trip(t, data.draw(strategy_for(t)))
