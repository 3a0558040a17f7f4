#!/usr/bin/env python3
"""Build-time generator (rpcgen's model, issue 37): typed Cython codecs from the .x text.

    python nfsd/xdr/gen_cython.py [OUTPUT]     # default: nfsd/native/xdr_nfs4.pyx

setup.py runs it (GENERATORS) before cythonize. It imports the REFERENCE codec, nfsd.xdr.nfs4
(which parses nfs4_prot.x and rpc_prot.x into core.py combinators), walks every type object
nfs4 exports (that includes everything reachable from COMPOUND4args, COMPOUND4res,
CB_COMPOUND4args and CB_COMPOUND4res) and writes one `cdef` decoder and one `cdef` encoder
per type object into nfsd/native/xdr_nfs4.pyx:

- decoders read a `const unsigned char*` with its length and a `Py_ssize_t` position (a C
  struct, _B); every length and count is checked against the bytes left and the type's bound
  (the .x maximum, or nfs4.DECODE_LIMITS) before anything is read or allocated;
- encoders append to the caller's bytearray, grown geometrically and written through its
  C pointer (no struct module, no per-field Python dispatch on the hot path);
- decoded values are the reference's own objects: instances of the generated struct/union
  classes of nfsd.xdr.nfs4, allocated with PyType_GenericAlloc and their __slots__ filled
  through the member descriptors' offsets (read at import, checked), ints, bytes, bools,
  lists, None, memoryview slices for nfs4.ZERO_COPY_FIELDS, linked lists as the reference
  builds them;
- errors are XdrError raised where the reference raises them, with the same type_name and
  message. To get there the encoders mirror the reference's error structure (which
  container wraps which Python exception), and values off the fast path (bool or IntEnum
  where an int goes, floats, objects with __index__, out-of-range ints) are handed to the
  very Python operation the reference runs (struct.Struct.pack, the bool dict, the enum
  frozenset), so the exception and its text are the reference's. That slow path is the only
  use of the struct module.

The generated module checks at import that the reference it was generated from is the one
installed (the .x texts' sha1, the decode limits and zero-copy fields, each type's name and
kind): a stale build fails to import rather than decode differently.

Why the import dance below: in the build environment (pip's build isolation) only
setuptools, wheel and Cython are installed. nfsd.xdr imports the standard library alone, but
importing it as a subpackage runs nfsd/__init__.py first; that file is empty today, yet a
future import there (structlog, lmdb...) would break the build. So the generator registers a
bare `nfsd` package (no __init__ executed) when nfsd is not imported yet, and removes what
it added afterwards.
"""
from __future__ import annotations

import hashlib
import importlib
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "nfsd" / "native" / "xdr_nfs4.pyx"
HOT = ("COMPOUND4args", "COMPOUND4res", "CB_COMPOUND4args", "CB_COMPOUND4res",
       "nfs_argop4", "nfs_resop4", "nfs_cb_argop4", "nfs_cb_resop4")


def _load_reference():
    """(nfs4 module, core module), imported without running nfsd/__init__.py."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    added: list[str] = []
    if "nfsd" not in sys.modules:
        pkg = types.ModuleType("nfsd")
        pkg.__path__ = [str(ROOT / "nfsd")]
        pkg.__package__ = "nfsd"
        sys.modules["nfsd"] = pkg
        added.append("nfsd")
    before = set(sys.modules)
    nfs4 = importlib.import_module("nfsd.xdr.nfs4")
    core = importlib.import_module("nfsd.xdr.core")
    heavy = [m for m in ("structlog", "lmdb") if m in sys.modules and m not in before]
    if added:
        added += [m for m in sys.modules if m.startswith("nfsd.") and m not in before]
    if heavy:
        raise SystemExit(f"gen_cython: importing nfsd.xdr pulled in {heavy}: the build "
                         "environment has only the standard library")
    return nfs4, core, added


def spec_digest() -> str:
    """sha1 of the .x texts the types come from (checked again by the generated module)."""
    h = hashlib.sha1()
    for name in ("nfs4_prot.x", "rpc_prot.x"):
        h.update((ROOT / "nfsd" / "xdr" / name).read_bytes())
    return h.hexdigest()


# --- the type graph ------------------------------------------------------------------------

class _Graph:
    """Every type object reachable from nfs4's exports, with a Python expression reaching it."""

    def __init__(self, nfs4):
        self.types: list = []
        self.expr: dict[int, str] = {}
        self.ident: dict[int, str] = {}
        used: set[str] = set()
        roots = [(n, getattr(nfs4, n)) for n in HOT]
        roots += [(n, getattr(nfs4, n)) for n in nfs4.__all__
                  if hasattr(getattr(nfs4, n), "xdr_kind")]
        for n, t in roots:
            self._walk(t, f"_n.{n}", used)

    def _walk(self, t, expr: str, used: set[str]) -> None:
        stack = [(t, expr)]
        while stack:
            t, expr = stack.pop()
            if id(t) in self.expr:
                continue
            self.expr[id(t)] = expr
            base = "".join(c if c.isalnum() else "_" for c in t.xdr_name)
            ident, k = base, 1
            while ident in used:
                k += 1
                ident = f"{base}_{k}"
            used.add(ident)
            self.ident[id(t)] = ident
            self.types.append(t)
            kind = t.xdr_kind
            kids = []
            if kind in ("farray", "varray", "optional"):
                kids.append((t.elem, f"{expr}.elem"))
            elif kind == "struct":
                for i, (_n, ft) in enumerate(t.xdr_fields):
                    kids.append((ft, f"{expr}.xdr_fields[{i}][1]"))
            elif kind == "union":
                kids.append((t.xdr_disc, f"{expr}.xdr_disc"))
                for v, (_a, at) in t.xdr_arms.items():
                    if at is not None:
                        kids.append((at, f"{expr}.xdr_arms[{v!r}][1]"))
                if isinstance(t.xdr_default, tuple) and t.xdr_default[1] is not None:
                    kids.append((t.xdr_default[1], f"{expr}.xdr_default[1]"))
            stack.extend(reversed(kids))


# --- code generation -------------------------------------------------------------------------

_PRIM = {  # fmt: (size, C type of the value, reader, Python-int constructor, converter)
    "i": (4, "int32_t", "<int32_t>_r32", "PyLong_FromLong", "_cv_i"),
    "I": (4, "uint32_t", "_r32", "PyLong_FromUnsignedLong", "_cv_I"),
    "q": (8, "int64_t", "<int64_t>_r64", "PyLong_FromLongLong", "_cv_q"),
    "Q": (8, "uint64_t", "_r64", "PyLong_FromUnsignedLongLong", "_cv_Q"),
}


def _runs(fields):
    groups = []
    for i, (pyn, t) in enumerate(fields):
        if getattr(t, "run_fmt", None) is not None:
            if groups and groups[-1][0] == "run":
                groups[-1][1].append((i, pyn, t))
            else:
                groups.append(("run", [(i, pyn, t)]))
        else:
            groups.append(("one", [(i, pyn, t)]))
    return groups


def _run_size(t) -> int:
    k = t.xdr_kind
    if k == "int":
        return t.size
    if k in ("bool", "enum"):
        return 4
    if k == "fopaque":
        return t.padded
    raise AssertionError(k)


def _q(s: str) -> str:
    return repr(s)


class _Gen:
    def __init__(self, graph: _Graph, core, nfs4):
        self.g = graph
        self.core = core
        self.nfs4 = nfs4
        self.out: list[str] = []
        # C arrays indexed by constants: classes (_TP), slot offsets (_OFF), enum value sets
        # (_VALS, slow paths) and union arm dicts (_ARMS, slow paths).
        self.tp: dict[int, int] = {}
        self.off: dict[int, int] = {}
        self.vals: dict[int, int] = {}
        self.arms: dict[int, int] = {}
        self.classes: list = []
        noff = 0
        for k, t in enumerate(graph.types):
            kind = t.xdr_kind
            if kind in ("struct", "union"):
                names = tuple(p for p, _ in t.xdr_fields) if kind == "struct" else ("tag", "value")
                self.tp[id(t)] = len(self.classes)
                self.off[id(t)] = noff
                self.classes.append((k, names, noff))
                noff += len(names)
            if kind == "enum":
                self.vals[id(t)] = len(self.vals)
            if kind == "union":
                self.arms[id(t)] = len(self.arms)
        self.noff = noff

    def I(self, t) -> str:                     # noqa: E743 - the C identifier of a type
        return self.g.ident[id(t)]

    def T(self, t) -> str:
        return f"_TP[{self.tp[id(t)]}]"

    def O(self, t, j: int) -> str:             # noqa: E741,E743
        return f"_OFF[{self.off[id(t)] + j}]"

    def V(self, t) -> str:
        return f"_VALS[{self.vals[id(t)]}]"

    def A(self, t) -> str:
        return f"_ARMS[{self.arms[id(t)]}]"

    def emit(self, *lines: str) -> None:
        self.out.extend(lines)

    # -- module-level declarations
    def globals_(self) -> None:
        g = self.g
        E = self.emit
        E("", "# --- the reference's type objects and classes (resolved and checked at import)",
          "cdef list _TYPES = []", "cdef list _VALS = []", "cdef list _ARMS = []",
          f"cdef PyTypeObject* _TP[{len(self.classes)}]", f"cdef Py_ssize_t _OFF[{self.noff}]")
        E("_TYPE_EXPRS = (")
        for t in g.types:
            E(f"    ({g.expr[id(t)]!r}, {t.xdr_name!r}, {t.xdr_kind!r}),")
        E(")", "_CLASSES = (")
        for k, names, off0 in self.classes:
            E(f"    ({k}, {names!r}, {off0}),")
        E(")", "_ENUMS = (")
        enums = sorted(((n, g.types.index(t)) for tid, n in self.vals.items()
                        for t in g.types if id(t) == tid))
        for _n, k in enums:
            E(f"    {k},")
        E(")", "_UNIONS = (")
        unions = sorted(((n, t) for tid, n in self.arms.items() for t in g.types if id(t) == tid),
                        key=lambda x: x[0])
        for _n, t in unions:
            E(f"    {self.arm_dict(t)!r},")
        E(")")
        for t in g.types:
            if t.xdr_kind == "enum":
                E(f"cdef inline bint m_{self.I(t)}(long long x) noexcept:",
                  f"    return x in ({', '.join(map(str, sorted(t.values)))},)")
        E("", "cdef _resolve():",
          "    cdef Py_ssize_t c, j, off0",
          "    for expr, name, kind in _TYPE_EXPRS:",
          "        t = eval(expr, {'_n': _n})",
          "        if t.xdr_name != name or t.xdr_kind != kind:",
          "            raise ImportError(f'nfsd.native.xdr_nfs4 is stale: {expr} is '",
          "                              f'{t.xdr_kind} {t.xdr_name}, generated for {kind} {name}; rebuild')",
          "        _TYPES.append(t)",
          "    for c, (k, names, off0) in enumerate(_CLASSES):",
          "        cls = _TYPES[k]",
          "        _check_class(cls, names)",
          "        _TP[c] = <PyTypeObject*>cls",
          "        for j, nm in enumerate(names):",
          "            _OFF[off0 + j] = _slot_offset(cls, nm)",
          "    for k in _ENUMS:",
          "        _VALS.append(_TYPES[k].values)",
          "    _ARMS.extend(_UNIONS)")

    # -- unions: arms grouped by type
    def union_arms(self, t):
        """[(arm index, type or None, [tag values])], default index or None."""
        groups: list = []
        index: dict = {}
        for v, (_a, at) in t.xdr_arms.items():
            key = id(at)
            if key not in index:
                index[key] = len(groups)
                groups.append([len(groups), at, []])
            groups[index[key]][2].append(int(v))
        dflt = None
        if isinstance(t.xdr_default, tuple):
            at = t.xdr_default[1]
            dflt = len(groups)
            groups.append([dflt, at, []])
        return groups, dflt

    def arm_dict(self, t):
        groups, _d = self.union_arms(t)
        return {v: idx for idx, _at, vals in groups for v in vals}

    # -- decoders
    def dec(self, t) -> None:
        k = t.xdr_kind
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        E("", f"cdef object d_{i}(_B* d):", f"    # {k} {name}")
        if k == "int":
            size, _ct, rd, mk, _cv = _PRIM[t.run_fmt]
            E("    cdef Py_ssize_t p = d.pos",
              f"    if d.n - p < {size}: raise _truncated({_q(name)}, p, d.n)",
              f"    d.pos = p + {size}",
              f"    return {mk}({rd}(d.b + p))")
        elif k == "bool":
            E("    cdef Py_ssize_t p = d.pos",
              f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
              "    cdef uint32_t x = _r32(d.b + p)",
              f"    if x > 1: raise _bad_bool({_q(name)}, x, p)",
              "    d.pos = p + 4",
              "    return x == 1")
        elif k == "enum":
            E("    cdef Py_ssize_t p = d.pos",
              f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
              "    cdef int32_t x = <int32_t>_r32(d.b + p)",
              f"    if not m_{i}(x): raise _bad_enum({_q(name)}, x, p)",
              "    d.pos = p + 4",
              "    return PyLong_FromLong(x)")
        elif k == "fopaque":
            E("    cdef Py_ssize_t p = d.pos",
              f"    if d.n - p < {t.padded}: raise _truncated({_q(name)}, p, d.n)",
              f"    d.pos = p + {t.padded}",
              f"    return PyBytes_FromStringAndSize(<const char*>d.b + p, {t.size})")
        elif k in ("vopaque", "string"):
            E("    cdef Py_ssize_t p = d.pos",
              "    cdef uint64_t cnt, padded",
              f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
              "    cnt = _r32(d.b + p)")
            if t.maxlen < 0xFFFFFFFF:
                E(f"    if cnt > {t.maxlen}u: raise _too_long({_q(name)}, cnt, {t.maxlen}, p)")
            E("    padded = (cnt + 3) & ~(<uint64_t>3)",
              f"    if padded > <uint64_t>(d.n - p - 4): raise _truncated({_q(name)}, p, d.n)",
              "    d.pos = p + 4 + <Py_ssize_t>padded")
            if getattr(t, "zero_copy", False):
                E("    return _zc_slice(d, p + 4, p + 4 + <Py_ssize_t>cnt)")
            else:
                E("    return PyBytes_FromStringAndSize(<const char*>d.b + p + 4, <Py_ssize_t>cnt)")
        elif k == "varray":
            el = t.elem
            E("    cdef Py_ssize_t p = d.pos, j",
              "    cdef uint64_t cnt",
              "    cdef list lst",
              f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
              "    cnt = _r32(d.b + p)")
            if t.maxlen < 0xFFFFFFFF:
                E(f"    if cnt > {t.maxlen}u: raise _too_long({_q(name)}, cnt, {t.maxlen}, p)")
            if el.xdr_kind == "int":         # the reference's bulk path: one bounds check
                size, _ct, rd, mk, _cv = _PRIM[el.run_fmt]
                E(f"    if cnt * {size} > <uint64_t>(d.n - p - 4): raise _truncated({_q(name)}, p, d.n)",
                  "    lst = PyList_New(<Py_ssize_t>cnt)",
                  "    p += 4",
                  "    for j in range(<Py_ssize_t>cnt):",
                  f"        _lset(lst, j, {mk}({rd}(d.b + p)))",
                  f"        p += {size}",
                  "    d.pos = p",
                  "    return lst")
            else:
                emin = max(1, getattr(el, "min_size", 4))
                E("    p += 4",
                  f"    if cnt * {emin} > <uint64_t>(d.n - p): raise _truncated({_q(name)}, p, d.n)",
                  "    d.pos = p",
                  "    lst = PyList_New(<Py_ssize_t>cnt)",
                  "    for j in range(<Py_ssize_t>cnt):",
                  f"        _lset(lst, j, d_{self.I(el)}(d))",
                  "    return lst")
        elif k == "farray":
            raise SystemExit(f"gen_cython: fixed arrays ({name}) are not generated yet")
        elif k == "optional":
            E("    cdef Py_ssize_t p = d.pos",
              f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
              "    cdef uint32_t x = _r32(d.b + p)",
              "    d.pos = p + 4",
              "    if x == 0: return None",
              f"    if x == 1: return d_{self.I(t.elem)}(d)",
              f"    raise _bad_bool({_q(name)}, x, p)")
        elif k == "struct":
            self.dec_struct(t)
        elif k == "union":
            self.dec_union(t)
        else:
            raise SystemExit(f"gen_cython: unknown kind {k} ({name})")

    def dec_struct(self, t) -> None:
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        fields = list(t.xdr_fields)
        linked = t.xdr_linked
        if linked:
            fields = fields[:-1]
        kinds = {ft.xdr_kind for _p, ft in fields if getattr(ft, "run_fmt", None) is not None}
        E("    cdef object o")
        if kinds or linked:
            E("    cdef Py_ssize_t p")
        if "bool" in kinds or linked:
            E("    cdef uint32_t x")
        if "enum" in kinds:
            E("    cdef int32_t e")
        ind = "    "
        if linked:
            E("    cdef object head = None, prev = None", "    while True:")
            ind = "        "
        E(f"{ind}o = PyType_GenericAlloc({self.T(t)}, 0)")
        for kind, items in _runs(fields):
            if kind == "one":
                j, pyn, ft = items[0]
                E(f"{ind}_ss(o, {self.O(t, j)}, d_{self.I(ft)}(d))")
                continue
            size = sum(_run_size(ft) for _j, _p, ft in items)
            E(f"{ind}p = d.pos",
              f"{ind}if d.n - p < {size}: raise _truncated({_q(name)}, p, d.n)")
            off = 0
            for j, pyn, ft in items:
                fk = ft.xdr_kind
                at = f"d.b + p + {off}"
                if fk == "int":
                    _s, _ct, rd, mk, _cv = _PRIM[ft.run_fmt]
                    E(f"{ind}_ss(o, {self.O(t, j)}, {mk}({rd}({at})))")
                elif fk == "bool":
                    E(f"{ind}x = _r32({at})",
                      f"{ind}if x > 1: raise _bad_bool({_q(name + '.' + pyn)}, x, p + {off})",
                      f"{ind}_ss(o, {self.O(t, j)}, x == 1)")
                elif fk == "enum":
                    E(f"{ind}e = <int32_t>_r32({at})",
                      f"{ind}if not m_{self.I(ft)}(e): raise _bad_enum({_q(ft.xdr_name)}, e, p + {off})",
                      f"{ind}_ss(o, {self.O(t, j)}, PyLong_FromLong(e))")
                elif fk == "fopaque":
                    E(f"{ind}_ss(o, {self.O(t, j)}, PyBytes_FromStringAndSize(<const char*>{at}, {ft.size}))")
                off += _run_size(ft)
            E(f"{ind}d.pos = p + {size}")
        if not linked:
            E("    return o")
            return
        nl = len(t.xdr_fields) - 1
        E(f"{ind}_ss(o, {self.O(t, nl)}, None)",
          f"{ind}if prev is None: head = o",
          f"{ind}else: _rs(prev, {self.O(t, nl)}, o)",
          f"{ind}prev = o",
          f"{ind}p = d.pos",
          f"{ind}if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
          f"{ind}x = _r32(d.b + p)",
          f"{ind}d.pos = p + 4",
          f"{ind}if x == 0: return head",
          f"{ind}if x != 1: raise _bad_bool({_q(name + '.' + linked)}, x, p)")

    def dec_union(self, t) -> None:
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        disc = t.xdr_disc
        dk = disc.xdr_kind
        groups, dflt = self.union_arms(t)
        signed = dk == "enum" or (dk == "int" and disc.run_fmt == "i")
        if dk == "int" and disc.run_fmt not in ("i", "I"):
            raise SystemExit(f"gen_cython: union {name}: 8-byte discriminants not generated")
        ct = "int32_t" if signed else "uint32_t"
        E("    cdef Py_ssize_t p = d.pos",
          f"    cdef {ct} tag",
          "    cdef object o, val",
          f"    if d.n - p < 4: raise _truncated({_q(name)}, p, d.n)",
          f"    tag = <{ct}>_r32(d.b + p)",
          "    d.pos = p + 4")
        first = True
        for idx, at, vals in groups:
            if idx == dflt:
                continue
            cond = " or ".join(f"tag == {v}" for v in vals)
            E(f"    {'if' if first else 'elif'} {cond}:")
            first = False
            E(f"        val = {'None' if at is None else f'd_{self.I(at)}(d)'}")
        if first:
            E("    if False: pass")
        E("    else:")
        if dflt is None:
            E(f"        raise _bad_disc({_q(name)}, tag, p)")
        else:
            if dk == "enum":
                E(f"        if not m_{self.I(disc)}(tag): raise _bad_disc({_q(name)}, tag, p)")
            elif dk == "bool":
                E(f"        if tag > 1: raise _bad_disc({_q(name)}, tag, p)")
            at = groups[dflt][1]
            E(f"        val = {'None' if at is None else f'd_{self.I(at)}(d)'}")
        E(f"    o = PyType_GenericAlloc({self.T(t)}, 0)")
        if dk == "bool":
            E(f"    _ss(o, {self.O(t, 0)}, tag == 1)")
        elif signed:
            E(f"    _ss(o, {self.O(t, 0)}, PyLong_FromLong(tag))")
        else:
            E(f"    _ss(o, {self.O(t, 0)}, PyLong_FromUnsignedLong(tag))")
        E(f"    _ss(o, {self.O(t, 1)}, val)", "    return o")

    # -- encoders
    def enc(self, t) -> None:
        k = t.xdr_kind
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        if k == "struct":
            return self.enc_struct(t)
        if k == "union":
            return self.enc_union(t)
        E("", f"cdef int e_{i}(_W* w, object v) except -1:", f"    # {k} {name}")
        if k == "int":
            size, ct, _rd, _mk, cv = _PRIM[t.run_fmt]
            E(f"    cdef {ct} x",
              f"    {cv}_named({_q(name)}, v, &x)",
              f"    _need(w, {size})",
              f"    _w{size * 8}(w, <uint{size * 8}_t>x)",
              "    return 0")
        elif k == "bool":
            E("    cdef uint32_t x",
              "    if v is True: x = 1",
              "    elif v is False: x = 0",
              f"    else: x = _bool_standalone({_q(name)}, v)",
              "    _need(w, 4)",
              "    _w32(w, x)",
              "    return 0")
        elif k == "enum":
            E("    cdef int32_t x",
              "    cdef long long y",
              "    cdef int ovf = 1",
              "    if PyLong_CheckExact(v):",
              "        y = PyLong_AsLongLongAndOverflow(v, &ovf)",
              f"    if ovf == 0 and m_{i}(y): x = <int32_t>y",
              f"    else: _enum_standalone({_q(name)}, v, {self.V(t)}, &x)",
              "    _need(w, 4)",
              "    _w32(w, <uint32_t>x)",
              "    return 0")
        elif k == "fopaque":
            E("    cdef Py_ssize_t ln",
              "    if PyBytes_CheckExact(v): ln = PyBytes_GET_SIZE(v)",
              f"    else: ln = _blen({_q(name)}, v)",
              f"    if ln != {t.size}: _fop_size({_q(name)}, {t.size}, ln)",
              f"    _wbytes(w, v, {t.size})",
              "    return 0")
        elif k in ("vopaque", "string"):
            E("    cdef Py_ssize_t ln")
            if k == "string":
                E("    if PyUnicode_CheckExact(v): v = v.encode('utf-8')")
            E("    if PyBytes_CheckExact(v): ln = PyBytes_GET_SIZE(v)",
              f"    else: ln = _blen({_q(name)}, v)",
              f"    if ln > {t.maxlen}: raise _too_long({_q(name)}, ln, {t.maxlen})",
              "    _need(w, 4)",
              "    _w32(w, <uint32_t>ln)",
              "    _wbytes(w, v, ln)",
              "    return 0")
        elif k == "varray":
            self.enc_varray(t)
        elif k == "optional":
            E("    _need(w, 4)",
              "    if v is None:",
              "        _w32(w, 0)",
              "        return 0",
              "    _w32(w, 1)",
              f"    return e_{self.I(t.elem)}(w, v)")
        else:
            raise SystemExit(f"gen_cython: cannot encode {k} ({name})")

    def enc_varray(self, t) -> None:
        name = t.xdr_name
        E = self.emit
        el = t.elem
        mx = t.maxlen
        E("    cdef Py_ssize_t n, j, start")
        if el.xdr_kind == "int":                # the reference's bulk path
            size, _ct, _rd, _mk, _cv = _PRIM[el.run_fmt]
            if el.run_fmt == "q":
                bad = "ovf"
            elif el.run_fmt == "Q":
                bad = "ovf or y < 0"
            else:
                bad = f"ovf or y < {el.lo} or y > {el.hi}"
            E("    cdef long long y",
              "    cdef int ovf",
              "    cdef PyObject* item",
              "    if PyList_CheckExact(v):",
              "        n = PyList_GET_SIZE(v)",
              f"        if n > {mx}: raise _too_long({_q(name)}, n, {mx})",
              "        start = w.len",
              f"        _need(w, 4 + n * {size})",
              "        _w32(w, <uint32_t>n)",
              "        for j in range(n):",
              "            item = PyList_GET_ITEM(v, j)",
              "            if not PyLong_CheckExact(<object>item): break",
              "            y = PyLong_AsLongLongAndOverflow(<object>item, &ovf)",
              f"            if {bad}: break",
              f"            _w{size * 8}(w, <uint{size * 8}_t>y)",
              "        else:",
              "            return 0",
              "        w.len = start",
              f"    return _varray_num_slow(w, {_q(name)}, v, {mx}, {_q(el.run_fmt)})")
            return
        E("    if PyList_CheckExact(v): n = PyList_GET_SIZE(v)",
          f"    else: n = _len_of({_q(name)}, v)",
          f"    if n > {mx}: raise _too_long({_q(name)}, n, {mx})",
          "    _need(w, 4)",
          "    _w32(w, <uint32_t>n)",
          "    for item in v:",
          f"        e_{self.I(el)}(w, item)",
          "    return 0")

    def _wrapper(self, t) -> None:
        """e_X calls the body b_X and turns what escapes it into the reference's XdrError."""
        i = self.I(t)
        self.emit("", f"cdef int e_{i}(_W* w, object v) except -1:",
                  f"    # {t.xdr_kind} {t.xdr_name}: the reference wraps what escapes in XdrError",
                  f"    if XDR_CALL_NOCHECK(b_{i}, w, v) == 0: return 0",
                  f"    return _wrap({_q(t.xdr_name)}, v)")

    def enc_struct(self, t) -> None:
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        fields = list(t.xdr_fields)
        linked = t.xdr_linked
        if linked:
            fields = fields[:-1]
            E("", f"cdef int e_{i}(_W* w, object v) except -1:", f"    # linked struct {name}")
        else:
            self._wrapper(t)
            E("", f"cdef int b_{i}(_W* w, object v) except -1:")
        groups = _runs(fields)
        decl = set()
        for kind, items in groups:
            if kind != "run":
                continue
            for j, _pyn, ft in items:
                fk = ft.xdr_kind
                if fk == "int":
                    decl.add(f"    cdef {_PRIM[ft.run_fmt][1]} c{j}")
                elif fk in ("bool", "enum"):
                    decl.add(f"    cdef int32_t c{j}")
                    if fk == "enum":
                        decl.add(f"    cdef bint f{j}")
        if any(ft.xdr_kind == "enum" for k_, its in groups if k_ == "run" for _j, _p, ft in its):
            decl.update(("    cdef long long y", "    cdef int ovf"))
        E(*sorted(decl))
        ind = "    "
        if linked:
            E("    try:", "        while True:")
            ind = "            "
        for kind, items in groups:
            if kind == "one":
                j, pyn, ft = items[0]
                E(f"{ind}e_{self.I(ft)}(w, _gf(v, {self.T(t)}, {self.O(t, j)}, {pyn!r}))")
                continue
            # phase 1: read and check in field order (what the reference does before spack)
            for j, pyn, ft in items:
                fk = ft.xdr_kind
                E(f"{ind}a{j} = _gf(v, {self.T(t)}, {self.O(t, j)}, {pyn!r})")
                if fk == "bool":
                    E(f"{ind}if a{j} is True: c{j} = 1",
                      f"{ind}elif a{j} is False: c{j} = 0",
                      f"{ind}else: c{j} = _bool_slow(a{j})")
                elif fk == "enum":
                    E(f"{ind}f{j} = False",
                      f"{ind}if PyLong_CheckExact(a{j}):",
                      f"{ind}    y = PyLong_AsLongLongAndOverflow(a{j}, &ovf)",
                      f"{ind}    if ovf == 0 and m_{self.I(ft)}(y):",
                      f"{ind}        c{j} = <int32_t>y",
                      f"{ind}        f{j} = True",
                      f"{ind}if not f{j}: _enum_field(a{j}, {self.V(ft)}, {_q(ft.xdr_name)})")
                elif fk == "fopaque":
                    E(f"{ind}if not PyBytes_CheckExact(a{j}) or PyBytes_GET_SIZE(a{j}) != {ft.size}:",
                      f"{ind}    _fop_field(a{j}, {ft.size}, "
                      f"{_q(f'{name}: field {pyn} needs exactly {ft.size} bytes')})")
            # phase 2: ints (and enums off the fast path) in order, as struct.pack checks them
            for j, pyn, ft in items:
                fk = ft.xdr_kind
                if fk == "int":
                    E(f"{ind}{_PRIM[ft.run_fmt][4]}(a{j}, &c{j})")
                elif fk == "enum":
                    E(f"{ind}if not f{j}: _cv_i(a{j}, &c{j})")
            # phase 3: write
            size = sum(_run_size(ft) for _j, _p, ft in items)
            E(f"{ind}_need(w, {size})")
            for j, pyn, ft in items:
                fk = ft.xdr_kind
                if fk == "int":
                    bits = _PRIM[ft.run_fmt][0] * 8
                    E(f"{ind}_w{bits}(w, <uint{bits}_t>c{j})")
                elif fk in ("bool", "enum"):
                    E(f"{ind}_w32(w, <uint32_t>c{j})")
                else:
                    E(f"{ind}_wbytes(w, a{j}, {ft.size})")
        if not linked:
            E("    return 0")
            return
        nl = len(t.xdr_fields) - 1
        E(f"{ind}v = _gf(v, {self.T(t)}, {self.O(t, nl)}, {linked!r})",
          f"{ind}_need(w, 4)",
          f"{ind}if v is None:",
          f"{ind}    _w32(w, 0)",
          f"{ind}    return 0",
          f"{ind}_w32(w, 1)",
          "    except XdrError:",
          "        raise",
          "    except _PACK_ERRORS as exc:",
          f"        raise _pack_error({_q(name)}, v, exc) from None",
          "    return 0")

    def enc_union(self, t) -> None:
        i = self.I(t)
        name = t.xdr_name
        E = self.emit
        disc = t.xdr_disc
        dk = disc.xdr_kind
        groups, dflt = self.union_arms(t)
        fmt = "I" if dk == "bool" else disc.run_fmt
        self._wrapper(t)
        E("", f"cdef int b_{i}(_W* w, object v) except -1:",
          "    cdef long long c",
          "    cdef int ovf = 1, arm = -1",
          f"    tag = _gf(v, {self.T(t)}, {self.O(t, 0)}, 'tag')",
          "    if PyLong_CheckExact(tag):",
          "        c = PyLong_AsLongLongAndOverflow(tag, &ovf)")
        first = True
        for idx, at, vals in groups:
            if idx == dflt:
                continue
            cond = " or ".join(f"c == {v}" for v in vals)
            E(f"        {'if' if first else 'elif'} ovf == 0 and ({cond}): arm = {idx}")
            first = False
        if dflt is None:
            E("        if arm == -1:", f"            raise _no_arm({_q(name)}, tag)")
        else:
            if dk == "enum":
                valid = f"ovf == 0 and m_{self.I(disc)}(c)"
            elif dk == "bool":
                valid = "ovf == 0 and (c == 0 or c == 1)"
            else:
                valid = f"ovf == 0 and {disc.lo} <= c <= {disc.hi}"
            E("        if arm == -1:",
              f"            if not ({valid}): raise _bad_tag({_q(name)}, tag)",
              f"            arm = {dflt}")
        if dk == "enum":
            valid = self.V(disc)
        elif dk == "bool":
            valid = "(0, 1)"
        else:
            valid = "None"                # the reference wants tag.__class__ is int
        E("    else:",
          f"        c = _slow_tag({_q(name)}, tag, {self.A(t)}, {-1 if dflt is None else dflt}, "
          f"{valid}, _S_{fmt}, {int(fmt == 'i')}, &arm)",
          "    _need(w, 4)",
          "    _w32(w, <uint32_t>c)")
        first = True
        for idx, at, vals in groups:
            if at is None:
                continue
            E(f"    {'if' if first else 'elif'} arm == {idx}:",
              f"        e_{self.I(at)}(w, _gf(v, {self.T(t)}, {self.O(t, 1)}, 'value'))")
            first = False
        E("    return 0")

    # -- public tables
    def tables(self) -> None:
        g = self.g
        n = len(g.types)
        E = self.emit
        E("", "ctypedef object (*_dfunc)(_B*)", "ctypedef int (*_efunc)(_W*, object) except -1",
          f"cdef _dfunc _DEC[{n}]", f"cdef _efunc _ENC[{n}]", "cdef dict _INDEX = {}",
          "", "cdef _tables():")
        for k, t in enumerate(g.types):
            i = self.I(t)
            E(f"    _DEC[{k}] = d_{i}", f"    _ENC[{k}] = e_{i}")
        E("    for k, t in enumerate(_TYPES):",
          "        _INDEX[id(t)] = k",
          "        _INDEX.setdefault(t.xdr_name, k)",
          f"    for name in {tuple(n_ for n_ in self.nfs4.__all__ if hasattr(getattr(self.nfs4, n_), 'xdr_kind'))!r}:",
          "        _INDEX[name] = _INDEX[id(getattr(_n, name))]")
        for h in HOT:
            t = getattr(self.nfs4, h)
            k = g.types.index(t)
            i = self.I(t)
            E("", f"def decode_{h}(buf, Py_ssize_t pos=0):",
              f'    """{h}.unpack(memoryview(buf), pos) natively: (value, new_pos)."""',
              f"    return _decode_with(d_{i}, buf, pos)",
              "", f"def encode_{h}(value, bytearray out not None):",
              f'    """{h}.pack(value, out) natively: appends the encoding to out."""',
              f"    _encode_with(e_{i}, value, out)")


PRELUDE = r'''# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# GENERATED by nfsd/xdr/gen_cython.py from nfsd/xdr/nfs4_prot.x and rpc_prot.x: do not edit,
# do not commit (setup.py regenerates it at build time).
"""Typed Cython XDR codecs of every NFSv4 type (issue 37), generated from the reference.

    decode(T, buf, pos=0) -> (value, new_pos)     == T.unpack(memoryview(buf), pos)
    encode(T, value, out: bytearray) -> None      == T.pack(value, out)
    decode_COMPOUND4args(buf, pos=0), encode_COMPOUND4res(value, out), ...: the same for the
        hot types, no lookup: decode_X and encode_X for X in COMPOUND4args, COMPOUND4res,
        CB_COMPOUND4args, CB_COMPOUND4res, nfs_argop4, nfs_resop4, nfs_cb_argop4, nfs_cb_resop4
    codec(T) -> Codec with .decode(buf, pos=0) and .encode(value, out): any type, looked up once

T is a type object of nfsd.xdr.nfs4 (or its xdr_name). Values are the reference's objects;
errors are nfsd.xdr.core.XdrError with the reference's type_name and message. A pack that
raises may leave part of the encoding in out (as the reference's does).
"""
from libc.stdint cimport uint8_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.unicode cimport PyUnicode_CheckExact
from cpython.long cimport (PyLong_FromLong, PyLong_FromUnsignedLong, PyLong_FromLongLong,
                           PyLong_FromUnsignedLongLong, PyLong_CheckExact, PyLong_AsUnsignedLongLong)
from cpython.list cimport PyList_New, PyList_GET_ITEM, PyList_GET_SIZE, PyList_CheckExact
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.sequence cimport PySequence_GetSlice
from cpython.exc cimport PyErr_ExceptionMatches, PyErr_Fetch, PyErr_NormalizeException

cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    int PyByteArray_Resize(object ba, Py_ssize_t n) except -1
    void PyList_SET_ITEM(object l, Py_ssize_t i, PyObject* o)
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

import hashlib as _hashlib
import os as _os
import struct as _struct
from nfsd.xdr import nfs4 as _n
from nfsd.xdr.core import (XdrError, _PACK_ERRORS, _pack_error, _bad_bool, _bad_enum,
                           _too_long, _as_bytes_len)

__all__ = ["decode", "encode", "codec", "Codec", "types", "SPEC_SHA1"]

cdef object _sterr = _struct.error
cdef object _struct_pack = _struct.pack
cdef object _BOOLS = {False: 0, True: 1}   # not `dict`: Cython would raise KeyError() for None
# Slow path only (values that are not plain ints): the reference's own conversions.
cdef object _S_i = _struct.Struct(">i").pack
cdef object _S_I = _struct.Struct(">I").pack
cdef object _S_q = _struct.Struct(">q").pack
cdef object _S_Q = _struct.Struct(">Q").pack


# --- input: a C view of the caller's buffer ---------------------------------------------------

ctypedef struct _B:
    const unsigned char* b
    Py_ssize_t n
    Py_ssize_t pos
    PyObject* src       # the caller's object (borrowed)
    PyObject* mv        # memoryview of it for zero-copy slices (owned; made on first use)

cdef inline uint32_t _r32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]

cdef inline uint64_t _r64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_r32(p) << 32) | <uint64_t>_r32(p + 4)

cdef object _zc_slice(_B* d, Py_ssize_t start, Py_ssize_t end):
    """buf[start:end] of the reference's memoryview of the input (made once per decode)."""
    cdef object mv
    cdef Py_buffer* vb
    if d.mv == NULL:
        mv = PyMemoryView_FromObject(<object>d.src)
        vb = PyMemoryView_GET_BUFFER(mv)
        if vb.ndim != 1 or (vb.format != NULL and not (
                vb.format[0] in b"Bbc" and vb.format[0] != 0 and vb.format[1] == 0)):
            mv = mv.cast("B")
        Py_INCREF(mv)
        d.mv = <PyObject*>mv
    return PySequence_GetSlice(<object>d.mv, start, end)

cdef object _truncated(str name, Py_ssize_t pos, Py_ssize_t n):
    return XdrError(f"{name}: truncated input at offset {pos} (buffer has {n} bytes)", name, pos)

cdef object _bad_disc(str name, long long tag, Py_ssize_t pos):
    return XdrError(f"{name}: invalid discriminant {tag} at offset {pos}", name, pos)

cdef object _no_arm(str name, object tag):
    return XdrError(f"{name}: no arm for discriminant {tag!r}", name)

cdef object _bad_tag(str name, object tag):
    return XdrError(f"{name}: invalid discriminant {tag!r}", name)

cdef inline void _lset(list l, Py_ssize_t i, object v) noexcept:
    Py_INCREF(v)
    PyList_SET_ITEM(l, i, <PyObject*>v)

# Slots of the reference's struct/union classes, written through their member offsets.
cdef inline void _ss(object o, Py_ssize_t off, object v) noexcept:
    Py_INCREF(v)
    (<PyObject**>((<char*><PyObject*>o) + off))[0] = <PyObject*>v

cdef inline void _rs(object o, Py_ssize_t off, object v) noexcept:
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>o) + off)
    cdef PyObject* old = slot[0]
    Py_INCREF(v)
    slot[0] = <PyObject*>v
    Py_XDECREF(old)

cdef inline object _gf(object o, PyTypeObject* tp, Py_ssize_t off, str name):
    cdef PyObject* r
    if <PyTypeObject*>Py_TYPE(o) == tp:
        r = (<PyObject**>((<char*><PyObject*>o) + off))[0]
        if r != NULL:
            return <object>r
    return _getattr(o, name)

cdef object _getattr(object o, str name):
    return getattr(o, name)

cdef Py_ssize_t _slot_offset(object cls, str name) except -1:
    desc = cls.__dict__.get(name)
    if type(desc).__name__ != "member_descriptor":
        raise ImportError(f"nfsd.native.xdr_nfs4: {cls!r}.{name} is not a slot")
    return (<PyMemberDescrObject*>desc).d_member.offset

cdef _check_class(object cls, tuple names):
    if tuple(cls.__slots__) != names or cls.__dictoffset__ != 0 or cls.__itemsize__ != 0 \
            or cls.__bases__ != (object,):
        raise ImportError(f"nfsd.native.xdr_nfs4: {cls!r} is not the plain slotted class it was "
                          "generated for")


# --- output: the caller's bytearray, written through its pointer ---------------------------------

ctypedef struct _W:
    PyObject* ba
    unsigned char* p
    Py_ssize_t len
    Py_ssize_t cap

cdef int _grow(_W* w, Py_ssize_t k) except -1:
    cdef Py_ssize_t need = w.len + k
    cdef Py_ssize_t nc = w.cap * 2
    if nc < need:
        nc = need
    if nc < 512:
        nc = 512
    PyByteArray_Resize(<object>w.ba, nc)
    w.p = <unsigned char*>PyByteArray_AS_STRING(<object>w.ba)
    w.cap = nc
    return 0

cdef inline int _need(_W* w, Py_ssize_t k) except -1:
    if w.len + k > w.cap:
        return _grow(w, k)
    return 0

cdef inline void _w32(_W* w, uint32_t x) noexcept:
    cdef unsigned char* q = w.p + w.len
    q[0] = <unsigned char>(x >> 24)
    q[1] = <unsigned char>(x >> 16)
    q[2] = <unsigned char>(x >> 8)
    q[3] = <unsigned char>x
    w.len += 4

cdef inline void _w64(_W* w, uint64_t x) noexcept:
    _w32(w, <uint32_t>(x >> 32))
    _w32(w, <uint32_t>x)

cdef int _wbytes(_W* w, object v, Py_ssize_t n) except -1:
    """n bytes of the bytes-like v, then zero padding to a multiple of 4."""
    cdef Py_buffer view
    cdef Py_ssize_t pad = (-n) & 3
    if PyBytes_CheckExact(v):
        _need(w, n + pad)
        memcpy(w.p + w.len, PyBytes_AS_STRING(v), n)
    else:
        PyObject_GetBuffer(v, &view, PyBUF_SIMPLE)
        try:
            if view.len != n:
                raise ValueError("buffer changed size while encoding")
            _need(w, n + pad)
            memcpy(w.p + w.len, view.buf, n)
        finally:
            PyBuffer_Release(&view)
    w.len += n
    if pad:
        memset(w.p + w.len, 0, pad)
        w.len += pad
    return 0

# int conversions: plain ints in range in C; anything else through struct (the reference's
# exact acceptance and error text); raise struct.error like the reference's spack.
cdef int _cv_i(object v, int32_t* r) except -1:
    cdef int ovf
    cdef long long y
    if PyLong_CheckExact(v):
        y = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf == 0 and -2147483648 <= y <= 2147483647:
            r[0] = <int32_t>y
            return 0
    r[0] = <int32_t>_r32(<const unsigned char*>PyBytes_AS_STRING(_S_i(v)))
    return 0

cdef int _cv_I(object v, uint32_t* r) except -1:
    cdef int ovf
    cdef long long y
    if PyLong_CheckExact(v):
        y = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf == 0 and 0 <= y <= 4294967295:
            r[0] = <uint32_t>y
            return 0
    r[0] = _r32(<const unsigned char*>PyBytes_AS_STRING(_S_I(v)))
    return 0

cdef int _cv_q(object v, int64_t* r) except -1:
    cdef int ovf
    cdef long long y
    if PyLong_CheckExact(v):
        y = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf == 0:
            r[0] = <int64_t>y
            return 0
    r[0] = <int64_t>_r64(<const unsigned char*>PyBytes_AS_STRING(_S_q(v)))
    return 0

cdef int _cv_Q(object v, uint64_t* r) except -1:
    cdef int ovf
    cdef long long y
    if PyLong_CheckExact(v):
        y = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf == 0 and y >= 0:
            r[0] = <uint64_t>y
            return 0
    r[0] = _r64(<const unsigned char*>PyBytes_AS_STRING(_S_Q(v)))
    return 0

cdef int _cv_i_named(str name, object v, int32_t* r) except -1:
    try:
        return _cv_i(v, r)
    except (_sterr, TypeError) as exc:
        raise _pack_error(name, v, exc) from None

cdef int _cv_I_named(str name, object v, uint32_t* r) except -1:
    try:
        return _cv_I(v, r)
    except (_sterr, TypeError) as exc:
        raise _pack_error(name, v, exc) from None

cdef int _cv_q_named(str name, object v, int64_t* r) except -1:
    try:
        return _cv_q(v, r)
    except (_sterr, TypeError) as exc:
        raise _pack_error(name, v, exc) from None

cdef int _cv_Q_named(str name, object v, uint64_t* r) except -1:
    try:
        return _cv_Q(v, r)
    except (_sterr, TypeError) as exc:
        raise _pack_error(name, v, exc) from None


# --- slow and error paths, shared (each mirrors one line of the reference) ---------------------

cdef extern from *:
    """
    /* call an encoder body without Cython's error check: the wrapper inspects the exception */
    #define XDR_CALL_NOCHECK(f, w, v) ((f)((w), (v)))
    """
    int XDR_CALL_NOCHECK(int (*f)(_W*, object) except -1, _W* w, object v) noexcept

cdef int _wrap(str name, object v) except -1:
    """A struct or union body failed: XdrError passes; what the reference's `except
    _PACK_ERRORS` catches becomes its _pack_error(name, value, exc); the rest passes."""
    cdef PyObject* et = NULL
    cdef PyObject* ev = NULL
    cdef PyObject* tb = NULL
    if PyErr_ExceptionMatches(XdrError) or not PyErr_ExceptionMatches(_PACK_ERRORS):
        return -1
    PyErr_Fetch(&et, &ev, &tb)
    PyErr_NormalizeException(&et, &ev, &tb)
    exc = <object>ev
    Py_XDECREF(et)
    Py_XDECREF(ev)
    Py_XDECREF(tb)
    raise _pack_error(name, v, exc) from None

cdef Py_ssize_t _blen(str name, object v) except -1:
    try:
        return _as_bytes_len(v)
    except TypeError as exc:
        raise _pack_error(name, v, exc) from None

cdef int _fop_size(str name, Py_ssize_t size, Py_ssize_t ln) except -1:
    raise XdrError(f"{name}: fixed opaque needs exactly {size} bytes, got {ln}", name)

cdef int _fop_field(object a, Py_ssize_t size, str msg) except -1:
    if _as_bytes_len(a) != size:
        raise XdrError(msg)
    return 0

cdef int _enum_field(object a, object vals, str ename) except -1:
    if a not in vals:
        raise _bad_enum(ename, a)
    return 0

cdef int _enum_standalone(str name, object v, object vals, int32_t* r) except -1:
    try:
        ok = v in vals
    except TypeError:
        ok = False
    if not ok:
        raise _bad_enum(name, v)
    return _cv_i(v, r)

cdef int32_t _bool_slow(object a) except? -1:
    return _BOOLS[a]

cdef uint32_t _bool_standalone(str name, object v) except? 9:
    try:
        return _BOOLS[v]
    except (KeyError, TypeError):
        raise _bad_bool(name, v) from None

cdef Py_ssize_t _len_of(str name, object v) except -1:
    try:
        return len(v)
    except TypeError as exc:
        raise _pack_error(name, v, exc) from None

cdef int _varray_num_slow(_W* w, str name, object v, Py_ssize_t mx, str fmt) except -1:
    try:
        n = len(v)
        if n > mx:
            raise _too_long(name, n, mx)
        bs = _struct_pack(f">I{n}{fmt}", n, *v)
    except XdrError:
        raise
    except _PACK_ERRORS as exc:
        raise _pack_error(name, v, exc) from None
    _wbytes(w, bs, PyBytes_GET_SIZE(bs))
    return 0

cdef long long _slow_tag(str name, object tag, dict arms, int dflt, object valid, object spack,
                         bint signed, int* arm) except? -1:
    a = arms.get(tag, -1)
    if a == -1:
        if dflt < 0:
            raise _no_arm(name, tag)
        if valid is None or tag not in valid:
            raise _bad_tag(name, tag)
        a = dflt
    arm[0] = a
    b = spack(tag)
    if signed:
        return <int32_t>_r32(<const unsigned char*>PyBytes_AS_STRING(b))
    return _r32(<const unsigned char*>PyBytes_AS_STRING(b))
'''

EPILOGUE = r'''

# --- entry points ----------------------------------------------------------------------------

cdef tuple _decode_with(_dfunc f, object buf, Py_ssize_t pos):
    cdef Py_buffer view
    cdef _B d
    if pos < 0:
        raise ValueError(f"negative offset {pos}")
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    d.b = <const unsigned char*>view.buf
    d.n = view.len
    d.pos = pos
    d.src = <PyObject*>buf
    d.mv = NULL
    try:
        value = f(&d)
        return value, d.pos
    finally:
        PyBuffer_Release(&view)
        Py_XDECREF(d.mv)

cdef int _encode_with(_efunc f, object value, bytearray out) except -1:
    cdef _W w
    w.ba = <PyObject*>out
    w.len = w.cap = PyByteArray_GET_SIZE(out)
    w.p = <unsigned char*>PyByteArray_AS_STRING(out)
    try:
        f(&w, value)
    finally:
        if w.cap != w.len:
            PyByteArray_Resize(out, w.len)
    return 0

cdef Py_ssize_t _index(object t) except -1:
    k = _INDEX.get(t if isinstance(t, str) else id(t))
    if k is None:
        raise KeyError(f"nfsd.native.xdr_nfs4 has no codec for {t!r}")
    return k

def decode(t, buf, Py_ssize_t pos=0):
    """t.unpack(memoryview(buf), pos) natively: (value, new_pos). t: type object or xdr_name."""
    return _decode_with(_DEC[_index(t)], buf, pos)

def encode(t, value, bytearray out not None):
    """t.pack(value, out) natively: appends the encoding of value to out."""
    _encode_with(_ENC[_index(t)], value, out)

def types():
    """The reference type objects this module has codecs for."""
    return list(_TYPES)


cdef class Codec:
    """The native codec of one type, looked up once: .decode(buf, pos=0), .encode(value, out)."""
    cdef _dfunc _d
    cdef _efunc _e
    cdef readonly object type

    def decode(self, buf, Py_ssize_t pos=0):
        """type.unpack(memoryview(buf), pos) natively: (value, new_pos)."""
        return _decode_with(self._d, buf, pos)

    def encode(self, value, bytearray out not None):
        """type.pack(value, out) natively."""
        _encode_with(self._e, value, out)

    def __repr__(self):
        return f"<native xdr codec {self.type.xdr_name}>"


def codec(t):
    """The Codec of t (a type object of nfsd.xdr.nfs4 or an xdr_name)."""
    cdef Py_ssize_t k = _index(t)
    cdef Codec c = Codec.__new__(Codec)
    c._d = _DEC[k]
    c._e = _ENC[k]
    c.type = _TYPES[k]
    return c


def _check_spec():
    here = _os.path.dirname(_n.__file__)
    h = _hashlib.sha1()
    for name in ("nfs4_prot.x", "rpc_prot.x"):
        with open(_os.path.join(here, name), "rb") as f:
            h.update(f.read())
    if h.hexdigest() != SPEC_SHA1 or dict(_n.DECODE_LIMITS) != DECODE_LIMITS \
            or frozenset(_n.ZERO_COPY_FIELDS) != ZERO_COPY_FIELDS:
        raise ImportError("nfsd.native.xdr_nfs4 was generated from another nfs4_prot.x/rpc_prot.x "
                          "or other decode limits: rebuild (pip install -e . / setup.py build_ext)")

_check_spec()
_resolve()
_tables()
'''


def generate(out_path: Path = DEFAULT_OUT) -> Path:
    nfs4, core, added = _load_reference()
    try:
        graph = _Graph(nfs4)
        g = _Gen(graph, core, nfs4)
        g.emit(PRELUDE)
        g.emit(f"SPEC_SHA1 = {spec_digest()!r}",
               f"DECODE_LIMITS = {dict(nfs4.DECODE_LIMITS)!r}",
               f"ZERO_COPY_FIELDS = frozenset({sorted(nfs4.ZERO_COPY_FIELDS)!r})")
        g.globals_()
        for t in graph.types:
            g.dec(t)
            g.enc(t)
        g.tables()
        g.emit(EPILOGUE)
        text = "\n".join(g.out) + "\n"
    finally:
        for m in added:
            sys.modules.pop(m, None)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if out_path.read_text() == text:       # unchanged: keep the mtime (no recompile)
            return out_path
    except OSError:
        pass
    tmp = out_path.with_suffix(".pyx.tmp")
    tmp.write_text(text)
    tmp.replace(out_path)
    return out_path


if __name__ == "__main__":
    # setup.py runs this with runpy: sys.argv is then setup.py's, so only a .pyx path counts
    target = Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].endswith(".pyx") \
        else DEFAULT_OUT
    print(f"gen_cython: wrote {generate(target)}", file=sys.stderr)
