"""Round trips of EVERY declared XDR type of nfs4 and rpc, with hypothesis strategies
derived from the type descriptions (not written per type)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsd.xdr import decode, encode
from nfsd.xdr import nfs4, rpc

# Keep generated values small: the point is coverage of every type's shape.
MAX_BYTES = 12
MAX_ITEMS = 2

_cache: dict[int, st.SearchStrategy] = {}


def strategy_for(t) -> st.SearchStrategy:
    """A hypothesis strategy for values of XDR type t, read off its description."""
    key = id(t)
    if key not in _cache:
        # deferred() breaks cycles (entry4 -> entry4 *) and shares work between types.
        _cache[key] = st.deferred(lambda: _build(t))
    return _cache[key]


def _build(t) -> st.SearchStrategy:
    kind = t.xdr_kind
    if kind == "int":
        return st.integers(t.lo, t.hi)
    if kind == "bool":
        return st.booleans()
    if kind == "enum":
        return st.sampled_from(sorted(t.values))
    if kind == "fopaque":
        return st.binary(min_size=t.size, max_size=t.size)
    if kind in ("vopaque", "string"):
        return st.binary(max_size=min(t.maxlen, MAX_BYTES))
    if kind == "farray":
        return st.lists(strategy_for(t.elem), min_size=t.size, max_size=t.size)
    if kind == "varray":
        return st.lists(strategy_for(t.elem), max_size=min(t.maxlen, MAX_ITEMS))
    if kind == "optional":
        return st.none() | strategy_for(t.elem)
    if kind == "struct":
        return _struct_strategy(t)
    if kind == "union":
        return _union_strategy(t)
    raise AssertionError(f"no strategy for {t!r}")


def _struct_strategy(cls) -> st.SearchStrategy:
    fields = cls.xdr_fields
    if cls.xdr_linked:
        # A short chain of nodes: all fields but the link, then linked up in order.
        plain = [strategy_for(ft) for _n, ft in fields[:-1]]
        node = st.tuples(*plain)

        def chain(rows):
            head = None
            for row in reversed(rows):
                head = cls(*row, head)
            return head
        return st.lists(node, min_size=1, max_size=3).map(chain)
    return st.builds(cls, *[strategy_for(ft) for _n, ft in fields])


def _union_strategy(cls) -> st.SearchStrategy:
    disc = cls.xdr_disc
    options = []
    for tag, (_arm, at) in sorted(cls.xdr_arms.items()):
        if disc.xdr_kind == "bool":
            tag = bool(tag)
        if at is None:
            options.append(st.just(cls(tag)))
        else:
            options.append(strategy_for(at).map(lambda v, tag=tag: cls(tag, v)))
    default = cls.xdr_default
    if isinstance(default, tuple):
        if disc.xdr_kind == "enum":
            others = sorted(disc.values - set(cls.xdr_arms))
            tags = st.sampled_from(others) if others else None
        else:
            tags = st.integers(disc.lo, disc.hi).filter(lambda v: v not in cls.xdr_arms)
        if tags is not None:
            if default[1] is None:
                options.append(tags.map(cls))
            else:
                options.append(st.tuples(tags, strategy_for(default[1])).map(lambda p: cls(*p)))
    return st.one_of(options)


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
