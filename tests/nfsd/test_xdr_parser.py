"""The .x parser: RFC 4506 section 6 syntax, naming rules, errors with line numbers."""
from __future__ import annotations

import pytest

from nfsd.xdr import XdrError, decode, encode
from nfsd.xdr.xparser import XdrSyntaxError, load_spec

SPEC = r"""
/* a comment
   over lines */
%#include <passthrough.h>
const MAXN = 0x10;          // line comment
const NEG = -3;
const OCT = 010;
enum color { RED = 1, GREEN = 2, BLUE = MAXN };
typedef opaque name<MAXN>;
typedef name alias;                      /* alias of the same object */
typedef unsigned hyper big;
typedef string label<>;
struct node {
    unsigned int id;
    color c;
    bool flag;
    opaque tag[3];
    int from;                            /* a Python keyword */
    node *next;
};
struct holder {
    struct { int a; hyper b; } inner;
    union switch (int k) { case 1: int one; case NEG: void; default: label other; } u;
    node *list;
    color palette[2];
    name names<2>;
};
union maybe switch (bool has) { case TRUE: forward f; case FALSE: void; };
struct forward { color c; };
program DEMO_PROG {
    version DEMO_V1 {
        void DEMO_NULL(void) = 0;
        holder DEMO_GET(node) = 1;
    } = 1;
} = 0x20000001;
"""


@pytest.fixture(scope="module")
def ns():
    return load_spec(SPEC)


def test_constants_and_enums(ns):
    assert (ns["MAXN"], ns["NEG"], ns["OCT"]) == (16, -3, 8)
    assert (ns["RED"], ns["BLUE"]) == (1, 16)
    assert ns["color"].members == {"RED": 1, "GREEN": 2, "BLUE": 16}
    assert (ns["DEMO_PROG"], ns["DEMO_V1"], ns["DEMO_NULL"], ns["DEMO_GET"]) == \
        (0x20000001, 1, 0, 1)


def test_typedef_alias_is_same_object(ns):
    assert ns["alias"] is ns["name"]
    assert ns["name"].maxlen == 16
    assert ns["big"].hi == 2**64 - 1
    assert ns["uint32_t"].hi == 2**32 - 1


def test_linked_struct_with_keyword_field(ns):
    node = ns["node"]
    assert node.xdr_linked == "next"
    assert node.__slots__[-2] == "from_"
    chain = node(1, ns["RED"], True, b"abc", -5, node(2, ns["BLUE"], False, b"xyz", 7, None))
    assert decode(node, encode(node, chain)) == chain


def test_anonymous_members_are_named_parent_field(ns):
    holder, inner, u = ns["holder"], ns["holder_inner"], ns["holder_u"]
    v = holder(inner(a=-1, b=2**40), u(1, 99), None, [ns["RED"], ns["GREEN"]], [b"x", b""])
    assert decode(holder, encode(holder, v)) == v
    for tag, val in ((-3, None), (77, b"dflt")):
        w = holder(inner(0, 0), u(tag, val), None, [1, 1], [])
        assert decode(holder, encode(holder, w)) == w
    with pytest.raises(XdrError):
        encode(holder, holder(inner(0, 0), u(1, 1), None, [1], []))   # fixed array length


def test_forward_reference_and_bool_union(ns):
    maybe, fwd = ns["maybe"], ns["forward"]
    v = maybe(True, fwd(ns["GREEN"]))
    assert decode(maybe, encode(maybe, v)) == v
    assert decode(maybe, encode(maybe, maybe(False))).tag is False


@pytest.mark.parametrize("text, line, what", [
    ("const A = ;", 1, "expected a number"),
    ("\n\nstruct s { int a; }", 3, "expected ';'"),
    ("typedef int x<UNKNOWN>;", 1, "known constant"),
    ("struct s { float f; };", 1, "float"),
    ("union u switch (int d) { case 1: int a; case 1: int b; };", None, "twice"),
    ("struct s { int a; };\nstruct s { int b; };", None, "defined twice"),
    ("struct s { missing m; };", None, "unknown type missing"),
    ("enum e { A = 1 };\nunion u switch (e d) { case 2: void; };", None, "not a member"),
    ("struct s { int a; } $", 1, "unexpected character"),
])
def test_syntax_errors(text, line, what):
    with pytest.raises(XdrSyntaxError, match=what) as ei:
        load_spec(text)
    if line is not None:
        assert f"line {line}" in str(ei.value)


def test_c_style_struct_reference():
    ns = load_spec("struct a { int x; };\nstruct b { struct a inner; enum e kind; };\n"
                   "enum e { ONE = 1 };")
    v = ns["b"](ns["a"](5), 1)
    assert decode(ns["b"], encode(ns["b"], v)) == v


def test_zero_copy_override():
    spec = "struct w { int a; opaque data<>; opaque other<>; };"
    ns = load_spec(spec, zero_copy={("w", "data")})
    wire = bytearray(encode(ns["w"], ns["w"](1, b"abc", b"def")))
    v = decode(ns["w"], wire)
    assert isinstance(v.data, memoryview) and v.data.obj is wire
    assert type(v.other) is bytes
    with pytest.raises(XdrSyntaxError, match="zero_copy"):
        load_spec(spec, zero_copy={("w", "nope")})
    with pytest.raises(XdrSyntaxError, match="zero_copy"):
        load_spec(spec, zero_copy={("w", "a")})


def test_rfc_spec_loads_through_load_spec():
    from importlib import resources
    from nfsd.xdr import nfs4, rpc
    text = resources.files("nfsd.xdr").joinpath("nfs4_prot.x").read_text()
    ns = load_spec(text, imports={k: getattr(rpc, k) for k in
                                  ("authsys_parms", "AUTH_NONE", "AUTH_SYS", "RPCSEC_GSS")})
    assert ns["NFS4_PROGRAM"] == 100003 and ns["NFSPROC4_COMPOUND"] == 1
    # The module namespace has exactly the spec's names (plus the imported RPC ones).
    assert set(nfs4.__all__) == set(ns) | {"authsys_parms", "AUTH_NONE", "AUTH_SYS",
                                           "RPCSEC_GSS"}


# --- compiled-code cache (nfsd/xdr/core.code_cache) -----------------------------------

CACHE_SPEC = "struct cc { unsigned int a; opaque b<4>; bool c; };"


def _cc_round_trip(ns):
    v = ns["cc"](7, b"ab", True)
    assert decode(ns["cc"], encode(ns["cc"], v)) == v


def test_code_cache_is_written_then_used(tmp_path):
    from nfsd.xdr import core
    path = tmp_path / "sub" / "spec.xdrcode"
    with core.code_cache(path):
        _cc_round_trip(load_spec(CACHE_SPEC))
    first = path.read_bytes()
    assert len(first) > 16
    with core.code_cache(path):
        _cc_round_trip(load_spec(CACHE_SPEC))
    assert path.read_bytes() == first          # nothing new to compile: not rewritten


def test_corrupt_or_foreign_cache_is_ignored_and_replaced(tmp_path):
    from nfsd.xdr import core
    path = tmp_path / "spec.xdrcode"
    for junk in (b"", b"garbage", b"\0" * 64):
        path.write_bytes(junk)
        with core.code_cache(path):
            _cc_round_trip(load_spec(CACHE_SPEC))
        assert path.read_bytes() != junk


def test_unwritable_cache_location_still_builds(tmp_path):
    from nfsd.xdr import core
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with core.code_cache(blocker / "spec.xdrcode"):
        _cc_round_trip(load_spec(CACHE_SPEC))
