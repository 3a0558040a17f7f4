"""Hypothesis strategies derived from nfsd.xdr type objects (no per-type or per-op code).

`XdrStrategies(...).for_type(t)` reads a type object's descriptive attributes (xdr_kind,
lo/hi, members, size/maxlen, elem, xdr_fields, xdr_linked, xdr_arms, xdr_default; see
nfsd/xdr/core.py) and returns a strategy for well-typed values of it, so every type the
.x files declare, the whole COMPOUND4args included, has one. Sizes are capped
(max_bytes, max_items) and recursion (linked lists, optionals, nested arrays) ends at
max_depth, to keep examples small; lengths past the caps are the byte-level mutator's
job. `edges` biases integers to 0..16 and the type's bounds (the fuzzer wants both).

Used by the fuzzer (tests/fuzz) and the XDR round-trip tests (tests/nfsd).
"""
from __future__ import annotations

from hypothesis import strategies as st


class XdrStrategies:
    def __init__(self, max_bytes: int = 48, max_items: int = 4, max_depth: int = 3,
                 edges: bool = True):
        self.max_bytes, self.max_items, self.max_depth, self.edges = max_bytes, max_items, max_depth, edges
        self._cache: dict[tuple[int, int], st.SearchStrategy] = {}

    def for_type(self, t, depth: int = 0) -> st.SearchStrategy:
        key = (id(t), depth)
        s = self._cache.get(key)
        if s is None:
            # deferred: built on first draw, so cycles (entry4 -> entry4 *) cost nothing here
            s = self._cache[key] = st.deferred(lambda: self._build(t, depth))
        return s

    def _ints(self, lo: int, hi: int) -> st.SearchStrategy:
        if not self.edges:
            return st.integers(lo, hi)
        small = st.integers(max(lo, 0), min(hi, 16))
        bounds = st.sampled_from(sorted({lo, hi, max(lo, 0), min(hi, 2**31 - 1)}))
        return st.one_of(small, bounds, st.integers(lo, hi))

    def _build(self, t, depth: int) -> st.SearchStrategy:
        kind = t.xdr_kind
        deeper = depth + 1
        leaf = depth >= self.max_depth
        if kind == "int":
            return self._ints(t.lo, t.hi)
        if kind == "bool":
            return st.booleans()
        if kind == "enum":
            return st.sampled_from(sorted(t.values))
        if kind == "fopaque":
            return st.binary(min_size=t.size, max_size=t.size)
        if kind in ("vopaque", "string"):
            return st.binary(max_size=min(t.maxlen, self.max_bytes))
        if kind == "farray":
            return st.lists(self.for_type(t.elem, deeper), min_size=t.size, max_size=t.size)
        if kind == "varray":
            return st.lists(self.for_type(t.elem, deeper), max_size=0 if leaf else min(t.maxlen, self.max_items))
        if kind == "optional":
            return st.none() if leaf else st.one_of(st.none(), self.for_type(t.elem, deeper))
        if kind == "struct":
            fields = list(t.xdr_fields)
            if t.xdr_linked:                      # Self *next: a short chain
                link = st.none() if leaf else st.one_of(st.none(), self.for_type(t, deeper))
                return st.builds(t, *[self.for_type(ft, deeper) for _n, ft in fields[:-1]], link)
            return st.builds(t, *[self.for_type(ft, deeper) for _n, ft in fields])
        if kind == "union":
            return self._union(t, deeper)
        raise TypeError(f"no strategy for {t!r}")

    def _union(self, t, deeper: int) -> st.SearchStrategy:
        disc = t.xdr_disc
        options = []
        for tag, (_arm, at) in sorted(t.xdr_arms.items(), key=lambda kv: int(kv[0])):
            tag = bool(tag) if disc.xdr_kind == "bool" else tag
            value = st.none() if at is None else self.for_type(at, deeper)
            options.append(st.builds(t, st.just(tag), value))
        default = t.xdr_default
        if isinstance(default, tuple):
            if disc.xdr_kind == "enum":
                others = sorted(disc.values - set(t.xdr_arms))
                tags = st.sampled_from(others) if others else None
            elif disc.xdr_kind == "int":
                tags = self._ints(disc.lo, disc.hi).filter(lambda v: v not in t.xdr_arms)
            else:
                tags = None
            if tags is not None:
                value = st.none() if default[1] is None else self.for_type(default[1], deeper)
                options.append(st.builds(t, tags, value))
        return st.one_of(options)


# The fuzzer's defaults.
strategy = XdrStrategies().for_type
