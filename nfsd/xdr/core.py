"""XDR (RFC 4506) runtime combinators, sans-I/O.

Every type object T (an instance of one of the classes below, or a generated
struct/union class) has:

    T.pack(value, out: bytearray) -> None          appends the encoding
    T.unpack(buf: memoryview, pos: int) -> (value, new_pos)

plus descriptive attributes (``xdr_kind``, ``xdr_name`` and per-kind details)
that the parser, the tests and tooling read.  A pack that raises XdrError may have
appended part of the encoding to ``out``: callers packing into a shared buffer
truncate it back (encode() just discards its buffer).

Speed matters (every RPC goes through here), so composite types are compiled
once: structs get exec-generated pack/unpack functions in which runs of
fixed-size fields (ints, bools, enums, fixed opaques) are a single
``struct.Struct`` call; unions, arrays and optionals get closures over their
element functions.  Nothing looks a field up by name at run time.

Self-referential linked lists (a struct whose last field is ``Self *next``,
e.g. entry4) are packed, unpacked, compared and printed iteratively, so a
100,000-entry READDIR reply does not hit the recursion limit.

Python representation (the contract in notes/xdr_contract.md):

    int / unsigned int / hyper / unsigned hyper   int (range-checked on pack)
    bool                                          bool (0/1 only on the wire)
    enum                                          int (must be a member)
    opaque[n], opaque<n>, string<n>               bytes on decode; pack takes bytes,
                                                  bytearray or memoryview (string: also str)
    opaque<n> marked zero_copy                    memoryview slice of the input buffer
    T *x                                          None or the value
    T x[n], T x<n>                                list
    struct S                                      instance of generated class S (__slots__ =
                                                  field names, keywords get a trailing '_')
    union U                                       instance of generated class U: .tag, .value
    typedef                                       the same object as its target, unless it adds
                                                  a size or '*' (then a new object of that name)

Descriptive attributes, for tooling and tests: every type has ``xdr_kind`` (int, bool,
enum, fopaque, vopaque, string, farray, varray, optional, struct, union) and
``xdr_name``; int: lo, hi; enum: members, values; opaques/arrays: size or maxlen, elem;
optional: elem; struct: xdr_fields ((py_name, type), ...), xdr_linked; union: xdr_disc,
xdr_arms {value: (arm_name, type or None)}, xdr_default ((arm_name, type or None) or
NO_DEFAULT).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import keyword
import marshal
import os
import struct as _st
from typing import Any, Callable

__all__ = [
    "XdrError", "XdrType", "Primitive", "Bool", "Enum", "FixedOpaque", "VarOpaque",
    "String", "FixedArray", "VarArray", "Optional", "make_struct", "set_struct_types",
    "struct", "make_union", "set_union_arms", "NO_DEFAULT", "compile_type", "code_cache",
    "encode", "decode", "py_name", "INT", "UINT", "HYPER", "UHYPER", "BOOL",
]


class XdrError(ValueError):
    """Malformed, truncated or unencodable XDR data.  The message names the type."""

    def __init__(self, message: str, type_name: str | None = None, pos: int | None = None):
        super().__init__(message)
        self.type_name = type_name
        self.pos = pos


_U32 = _st.Struct(">I")
_sterr = _st.error
_PADS = (b"", b"\0\0\0", b"\0\0", b"\0")          # indexed by len & 3
_FALSE = b"\0\0\0\0"
_TRUE = b"\0\0\0\1"
_MAXLEN = 0xFFFFFFFF
# Exceptions a pack function can hit on a wrong value; all become XdrError.
_PACK_ERRORS = (_st.error, TypeError, AttributeError, KeyError, ValueError, OverflowError,
                IndexError)



def py_name(xdr_name: str) -> str:
    """The Python attribute name of an XDR field (keywords get a trailing '_')."""
    return xdr_name + "_" if keyword.iskeyword(xdr_name) else xdr_name


# --- error helpers (only on the error path) -----------------------------------------

def _truncated(name: str, pos: int, buf=None) -> XdrError:
    have = "" if buf is None else f" (buffer has {len(buf)} bytes)"
    return XdrError(f"{name}: truncated input at offset {pos}{have}", name, pos)


def _pack_error(name: str, value: Any, exc: BaseException) -> XdrError:
    r = repr(value)
    if len(r) > 120:
        r = r[:117] + "..."
    return XdrError(f"{name}: cannot encode {r}: {exc}", name)


def _bad_bool(name: str, value: Any, pos: int | None = None) -> XdrError:
    return XdrError(f"{name}: bool must be 0 or 1, got {value!r}", name, pos)


def _bad_enum(name: str, value: Any, pos: int | None = None) -> XdrError:
    return XdrError(f"{name}: {value!r} is not a member of the enum", name, pos)


def _too_long(name: str, n: int, mx: int, pos: int | None = None) -> XdrError:
    return XdrError(f"{name}: length {n} exceeds the declared maximum {mx}", name, pos)


def _as_bytes_len(v: Any) -> int:
    """Byte length of a bytes-like pack argument; TypeError for anything else."""
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    if isinstance(v, memoryview):
        return v.nbytes
    raise TypeError(f"expected bytes, bytearray or memoryview, got {type(v).__name__}")


# --- compilation machinery -------------------------------------------------------------

_in_progress: set[int] = set()


def _fns(t: Any) -> tuple[Callable, Callable]:
    """(pack, unpack) of t, compiling it first; late-bound if t is being compiled (a cycle)."""
    if getattr(t, "xdr_compiled", False):
        return t.pack, t.unpack
    if id(t) in _in_progress:
        return (lambda v, out: t.pack(v, out)), (lambda buf, pos: t.unpack(buf, pos))
    compile_type(t)
    return t.pack, t.unpack


def compile_type(t: Any) -> None:
    """Build t's pack/unpack (and those of everything it contains).  Idempotent."""
    if getattr(t, "xdr_compiled", False) or id(t) in _in_progress:
        return
    _in_progress.add(id(t))
    try:
        t.xdr_build()
    finally:
        _in_progress.discard(id(t))
    t.xdr_compiled = True


def _not_compiled(*_a):
    raise RuntimeError("XDR type used before compile_type() was called on it")


# --- compiled-code cache ------------------------------------------------------------------
# Compiling the generated struct code is most of the import time of nfsd.xdr.nfs4, so
# code objects can be cached in a marshal file (like .pyc files; keyed by the sha1 of the
# generated source, the file itself stamped with the interpreter's bytecode magic).

_code_cache: dict[str, Any] | None = None
_code_cache_dirty = False


def _compile(source: str, label: str):
    """Code object for generated source, from the active cache when possible."""
    global _code_cache_dirty
    if _code_cache is None:
        return compile(source, label, "exec")
    key = hashlib.sha1(source.encode()).hexdigest()
    code = _code_cache.get(key)
    if code is None:
        code = _code_cache[key] = compile(source, label, "exec")
        _code_cache_dirty = True
    return code


@contextlib.contextmanager
def code_cache(path: str | os.PathLike | None):
    """Use (and afterwards update) a cache of compiled code at path while building types.

    A missing, stale or unreadable cache is ignored; a cache that cannot be written is
    skipped silently (read-only installs just compile every time)."""
    global _code_cache, _code_cache_dirty
    if path is None:
        yield
        return
    path = os.fspath(path)
    stamp = importlib.util.MAGIC_NUMBER + b"xdr1"
    cache: dict[str, Any] = {}
    try:
        with open(path, "rb") as f:
            if f.read(len(stamp)) == stamp:
                loaded = marshal.load(f)
                if isinstance(loaded, dict):
                    cache = loaded
    except (OSError, EOFError, ValueError, TypeError):
        cache = {}
    outer = (_code_cache, _code_cache_dirty)      # re-entrant: restore on exit
    _code_cache, _code_cache_dirty = cache, False
    try:
        yield
        if _code_cache_dirty:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(stamp)
                    marshal.dump(cache, f)
                os.replace(tmp, path)
            except OSError:
                pass
    finally:
        _code_cache, _code_cache_dirty = outer


class XdrType:
    """Base of the non-class type objects."""
    xdr_kind = "?"
    xdr_compiled = False
    min_size = 4               # smallest encoding; bounds array counts before allocating
    run_fmt: str | None = None  # struct format if this type can join a fixed-size run
    run_kind: str | None = None

    def __init__(self, name: str):
        self.xdr_name = name
        self.pack = _not_compiled
        self.unpack = _not_compiled

    def xdr_build(self) -> None:     # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<xdr {self.xdr_kind} {self.xdr_name}>"


class Primitive(XdrType):
    """int, unsigned int, hyper, unsigned hyper: Python int, range-checked on pack."""
    xdr_kind = "int"
    run_kind = "num"

    def __init__(self, name: str, fmt: str):
        super().__init__(name)
        self.run_fmt = fmt
        s = _st.Struct(">" + fmt)
        self.min_size = self.size = s.size
        bits = s.size * 8
        self.signed = fmt.islower()
        self.lo = -(1 << (bits - 1)) if self.signed else 0
        self.hi = (1 << (bits - 1)) - 1 if self.signed else (1 << bits) - 1
        self.xdr_build()
        self.xdr_compiled = True

    def xdr_build(self) -> None:
        s, size, name = _st.Struct(">" + self.run_fmt), self.size, self.xdr_name
        spack, sunpack = s.pack, s.unpack_from

        def pack(v, out):
            try:
                out += spack(v)
            except (_sterr, TypeError) as e:
                raise _pack_error(name, v, e) from None

        def unpack(buf, pos):
            try:
                return sunpack(buf, pos)[0], pos + size
            except _sterr:
                raise _truncated(name, pos, buf) from None

        self.pack, self.unpack = pack, unpack


class Bool(XdrType):
    xdr_kind = "bool"
    run_fmt = "I"
    run_kind = "bool"

    def __init__(self, name: str = "bool"):
        super().__init__(name)
        self.xdr_build()
        self.xdr_compiled = True

    def xdr_build(self) -> None:
        name = self.xdr_name
        enc = {False: _FALSE, True: _TRUE}    # 0 and 1 hash like False and True
        uget = _U32.unpack_from

        def pack(v, out):
            try:
                out += enc[v]
            except (KeyError, TypeError):
                raise _bad_bool(name, v) from None

        def unpack(buf, pos):
            try:
                x = uget(buf, pos)[0]
            except _sterr:
                raise _truncated(name, pos, buf) from None
            if x == 0:
                return False, pos + 4
            if x == 1:
                return True, pos + 4
            raise _bad_bool(name, x, pos)

        self.pack, self.unpack = pack, unpack


class Enum(XdrType):
    """enum: Python int, validated against the members on pack and unpack."""
    xdr_kind = "enum"
    run_fmt = "i"
    run_kind = "enum"

    def __init__(self, name: str, members: dict[str, int]):
        super().__init__(name)
        self.members = dict(members)
        self.values = frozenset(self.members.values())
        self.names = {}
        for k, v in self.members.items():
            self.names.setdefault(v, k)
        self.xdr_build()
        self.xdr_compiled = True

    def name_of(self, value: int) -> str:
        return self.names.get(value, str(value))

    def xdr_build(self) -> None:
        name, values = self.xdr_name, self.values
        s = _st.Struct(">i")
        spack, sunpack = s.pack, s.unpack_from

        def pack(v, out):
            try:
                ok = v in values
            except TypeError:
                ok = False
            if not ok:
                raise _bad_enum(name, v)
            out += spack(v)

        def unpack(buf, pos):
            try:
                x = sunpack(buf, pos)[0]
            except _sterr:
                raise _truncated(name, pos, buf) from None
            if x not in values:
                raise _bad_enum(name, x, pos)
            return x, pos + 4

        self.pack, self.unpack = pack, unpack


class FixedOpaque(XdrType):
    """opaque[n]: bytes of exactly n."""
    xdr_kind = "fopaque"
    run_kind = "fopaque"

    def __init__(self, name: str, size: int):
        super().__init__(name)
        self.size = size
        self.padded = size + (-size & 3)
        self.min_size = self.padded
        self.run_fmt = f"{size}s" + "x" * (-size & 3)
        self.xdr_build()
        self.xdr_compiled = True

    def xdr_build(self) -> None:
        name, n, padded = self.xdr_name, self.size, self.padded
        pad = _PADS[n & 3]

        def pack(v, out):
            try:
                ln = len(v) if v.__class__ is bytes else _as_bytes_len(v)
            except TypeError as e:
                raise _pack_error(name, v, e) from None
            if ln != n:
                raise XdrError(f"{name}: fixed opaque needs exactly {n} bytes, got {ln}", name)
            out += v
            out += pad

        def unpack(buf, pos):
            end = pos + n
            if pos + padded > len(buf):
                raise _truncated(name, pos, buf)
            return bytes(buf[pos:end]), pos + padded

        self.pack, self.unpack = pack, unpack


class VarOpaque(XdrType):
    """opaque<max>: bytes (or, with zero_copy, a memoryview slice of the input buffer)."""
    xdr_kind = "vopaque"

    def __init__(self, name: str, maxlen: int | None = None, zero_copy: bool = False):
        super().__init__(name)
        self.maxlen = _MAXLEN if maxlen is None else maxlen
        self.zero_copy = zero_copy
        self.xdr_build()
        self.xdr_compiled = True

    def xdr_build(self) -> None:
        name, mx, zc = self.xdr_name, self.maxlen, self.zero_copy
        upack, uget = _U32.pack, _U32.unpack_from

        def pack(v, out):
            try:
                n = len(v) if v.__class__ is bytes else _as_bytes_len(v)
            except TypeError as e:
                raise _pack_error(name, v, e) from None
            if n > mx:
                raise _too_long(name, n, mx)
            out += upack(n)
            out += v
            if n & 3:
                out += _PADS[n & 3]

        def unpack(buf, pos):
            try:
                n = uget(buf, pos)[0]
            except _sterr:
                raise _truncated(name, pos, buf) from None
            if n > mx:
                raise _too_long(name, n, mx, pos)
            start = pos + 4
            end = start + n
            nxt = end + (-n & 3)
            if nxt > len(buf):
                raise _truncated(name, pos, buf)
            if zc:
                return buf[start:end], nxt
            return bytes(buf[start:end]), nxt

        self.pack, self.unpack = pack, unpack


class String(VarOpaque):
    """string<max>: bytes on decode (XDR strings are not necessarily UTF-8); pack also takes str."""
    xdr_kind = "string"

    def xdr_build(self) -> None:
        super().xdr_build()
        raw_pack = self.pack

        def pack(v, out):
            if v.__class__ is str:
                v = v.encode("utf-8")
            raw_pack(v, out)

        self.pack = pack


def _fast_elem_fmt(elem: Any) -> str | None:
    """struct format char for elements packable in bulk without validation."""
    return elem.run_fmt if getattr(elem, "run_kind", None) == "num" else None


class FixedArray(XdrType):
    """T name[n]: list of exactly n elements."""
    xdr_kind = "farray"

    def __init__(self, name: str, elem: Any, size: int):
        super().__init__(name)
        self.elem = elem
        self.size = size
        self.min_size = size * getattr(elem, "min_size", 4)

    def xdr_build(self) -> None:
        name, n, elem = self.xdr_name, self.size, self.elem
        fmt = _fast_elem_fmt(elem)
        if fmt is not None:
            s = _st.Struct(f">{n}{fmt}")
            spack, sunpack, size = s.pack, s.unpack_from, s.size

            def pack(v, out):
                try:
                    if len(v) != n:
                        raise XdrError(f"{name}: fixed array needs {n} elements, got {len(v)}", name)
                    out += spack(*v)
                except XdrError:
                    raise
                except _PACK_ERRORS as e:
                    raise _pack_error(name, v, e) from None

            def unpack(buf, pos):
                try:
                    return list(sunpack(buf, pos)), pos + size
                except _sterr:
                    raise _truncated(name, pos, buf) from None
        else:
            ep, eu = _fns(elem)

            def pack(v, out):
                try:
                    if len(v) != n:
                        raise XdrError(f"{name}: fixed array needs {n} elements, got {len(v)}", name)
                except TypeError as e:
                    raise _pack_error(name, v, e) from None
                for x in v:
                    ep(x, out)

            def unpack(buf, pos):
                return _unpack_elems(eu, n, buf, pos)

        self.pack, self.unpack = pack, unpack


def _unpack_elems(eu, n: int, buf, pos: int):
    """n elements decoded one after another by `eu`: (list, new_pos)."""
    res = []
    append = res.append
    for _ in range(n):
        x, pos = eu(buf, pos)
        append(x)
    return res, pos


class VarArray(XdrType):
    """T name<max>: list of at most max elements."""
    xdr_kind = "varray"

    def __init__(self, name: str, elem: Any, maxlen: int | None = None):
        super().__init__(name)
        self.elem = elem
        self.maxlen = _MAXLEN if maxlen is None else maxlen

    def xdr_build(self) -> None:
        name, mx, elem = self.xdr_name, self.maxlen, self.elem
        upack, uget = _U32.pack, _U32.unpack_from
        emin = max(1, getattr(elem, "min_size", 4))
        fmt = _fast_elem_fmt(elem)
        if fmt is not None:
            esize = _st.calcsize(">" + fmt)

            def pack(v, out):
                try:
                    n = len(v)
                    if n > mx:
                        raise _too_long(name, n, mx)
                    out += _st.pack(f">I{n}{fmt}", n, *v)
                except XdrError:
                    raise
                except _PACK_ERRORS as e:
                    raise _pack_error(name, v, e) from None

            def unpack(buf, pos):
                try:
                    n = uget(buf, pos)[0]
                except _sterr:
                    raise _truncated(name, pos, buf) from None
                if n > mx:
                    raise _too_long(name, n, mx, pos)
                end = pos + 4 + n * esize
                if end > len(buf):
                    raise _truncated(name, pos, buf)
                return list(_st.unpack_from(f">{n}{fmt}", buf, pos + 4)), end
        else:
            ep, eu = _fns(elem)

            def pack(v, out):
                try:
                    n = len(v)
                except TypeError as e:
                    raise _pack_error(name, v, e) from None
                if n > mx:
                    raise _too_long(name, n, mx)
                out += upack(n)
                for x in v:
                    ep(x, out)

            def unpack(buf, pos):
                try:
                    n = uget(buf, pos)[0]
                except _sterr:
                    raise _truncated(name, pos, buf) from None
                if n > mx:
                    raise _too_long(name, n, mx, pos)
                pos += 4
                if n * emin > len(buf) - pos:      # refuse absurd counts before allocating
                    raise _truncated(name, pos, buf)
                return _unpack_elems(eu, n, buf, pos)

        self.pack, self.unpack = pack, unpack


class Optional(XdrType):
    """T *name: None or the value (RFC 4506 section 4.19)."""
    xdr_kind = "optional"

    def __init__(self, name: str, elem: Any):
        super().__init__(name)
        self.elem = elem

    def xdr_build(self) -> None:
        name = self.xdr_name
        ep, eu = _fns(self.elem)
        uget = _U32.unpack_from

        def pack(v, out):
            if v is None:
                out += _FALSE
            else:
                out += _TRUE
                ep(v, out)

        def unpack(buf, pos):
            try:
                flag = uget(buf, pos)[0]
            except _sterr:
                raise _truncated(name, pos, buf) from None
            if flag == 0:
                return None, pos + 4
            if flag == 1:
                return eu(buf, pos + 4)
            raise _bad_bool(name, flag, pos)

        self.pack, self.unpack = pack, unpack


INT = Primitive("int", "i")
UINT = Primitive("unsigned int", "I")
HYPER = Primitive("hyper", "q")
UHYPER = Primitive("unsigned hyper", "Q")
BOOL = Bool("bool")


# --- structs -------------------------------------------------------------------------------

class _Gen:
    """Collects source lines and the globals they refer to for one exec."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.g: dict[str, Any] = {"XdrError": XdrError, "_sterr": _sterr, "_PACK_ERRORS": _PACK_ERRORS,
                                  "_truncated": _truncated, "_pack_error": _pack_error,
                                  "_bad_bool": _bad_bool, "_bad_enum": _bad_enum,
                                  "_as_bytes_len": _as_bytes_len, "_FALSE": _FALSE, "_TRUE": _TRUE,
                                  "_U32u": _U32.unpack_from}
        self.n = 0

    def ref(self, obj: Any, hint: str = "g") -> str:
        self.n += 1
        key = f"_{hint}{self.n}"
        self.g[key] = obj
        return key

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def _runs(fields: list[tuple[str, Any]]) -> list[tuple[str, list[tuple[int, str, Any]]]]:
    """Group consecutive fixed-size fields into ('run', [...]) and others into ('one', [...])."""
    groups: list = []
    for i, (pyn, t) in enumerate(fields):
        if getattr(t, "run_fmt", None) is not None:
            if groups and groups[-1][0] == "run":
                groups[-1][1].append((i, pyn, t))
            else:
                groups.append(("run", [(i, pyn, t)]))
        else:
            groups.append(("one", [(i, pyn, t)]))
    return groups


def _struct_source(cls: Any, g: _Gen, fields: list[tuple[str, Any]], linked: str | None):
    """Emit pack and unpack for a struct; linked = python name of a self-link last field."""
    name = cls.xdr_name
    qn = g.ref(name, "name")
    groups = _runs(fields)
    cls_ref = g.ref(cls, "cls")

    g.emit(0, f"# xdr struct {name}")    # keeps cached code objects per struct
    # ---- pack
    g.emit(0, "def pack(v, out):")
    g.emit(1, "try:")
    ind = 2
    if linked:
        g.emit(2, "while True:")
        ind = 3
    for kind, items in groups:
        if kind == "run":
            fmt = ">" + "".join(t.run_fmt for _, _, t in items)
            s = g.ref(_st.Struct(fmt).pack, "sp")
            args = []
            for i, pyn, t in items:
                a = f"a{i}"
                g.emit(ind, f"{a} = v.{pyn}")
                if t.run_kind == "bool":
                    g.emit(ind, f"{a} = {g.ref({False: 0, True: 1}, 'bools')}[{a}]")
                elif t.run_kind == "enum":
                    g.emit(ind, f"if {a} not in {g.ref(t.values, 'ev')}: "
                                f"raise _bad_enum({g.ref(t.xdr_name, 'en')}, {a})")
                elif t.run_kind == "fopaque":
                    g.emit(ind, f"if ({a}.__class__ is not bytes or len({a}) != {t.size}) and "
                                f"_as_bytes_len({a}) != {t.size}: "
                                f"raise XdrError({qn} + ': field {pyn} needs exactly {t.size} bytes')")
                    g.emit(ind, f"if {a}.__class__ is not bytes: {a} = bytes({a})")
                args.append(a)
            g.emit(ind, f"out += {s}({', '.join(args)})")
        else:
            i, pyn, t = items[0]
            p, _u = _fns(t)
            g.emit(ind, f"{g.ref(p, 'p')}(v.{pyn}, out)")
    if linked:
        g.emit(ind, f"v = v.{linked}")
        g.emit(ind, "if v is None:")
        g.emit(ind + 1, "out += _FALSE")
        g.emit(ind + 1, "return")
        g.emit(ind, "out += _TRUE")
    g.emit(1, "except XdrError:")
    g.emit(2, "raise")
    g.emit(1, "except _PACK_ERRORS as e:")
    g.emit(2, f"raise _pack_error({qn}, v, e) from None")

    # ---- unpack
    g.emit(0, "def unpack(buf, pos):")
    ind = 2
    if linked:
        g.emit(1, "head = prev = None")
    g.emit(1, "try:")
    if linked:
        g.emit(2, "while True:")
        ind = 3
    for kind, items in groups:
        if kind == "run":
            s = _st.Struct(">" + "".join(t.run_fmt for _, _, t in items))
            names = [f"a{i}" for i, _, _ in items]
            g.emit(ind, f"{', '.join(names)}{',' if len(names) == 1 else ''} = "
                        f"{g.ref(s.unpack_from, 'su')}(buf, pos)")
            off = 0
            for i, pyn, t in items:
                a = f"a{i}"
                if t.run_kind == "bool":
                    g.emit(ind, f"if {a} == 0: {a} = False")
                    g.emit(ind, f"elif {a} == 1: {a} = True")
                    g.emit(ind, f"else: raise _bad_bool({qn} + '.{pyn}', {a}, pos + {off})")
                elif t.run_kind == "enum":
                    g.emit(ind, f"if {a} not in {g.ref(t.values, 'ev')}: "
                                f"raise _bad_enum({g.ref(t.xdr_name, 'en')}, {a}, pos + {off})")
                off += _st.calcsize(">" + t.run_fmt)
            g.emit(ind, f"pos += {s.size}")
        else:
            i, pyn, t = items[0]
            _p, u = _fns(t)
            g.emit(ind, f"a{i}, pos = {g.ref(u, 'u')}(buf, pos)")
    if linked:
        args = ", ".join([f"a{i}" for i in range(len(fields))] + ["None"])
        g.emit(ind, f"o = {cls_ref}({args})")
        g.emit(ind, "if prev is None: head = o")
        g.emit(ind, f"else: prev.{linked} = o")
        g.emit(ind, "prev = o")
        g.emit(ind, "flag = _U32u(buf, pos)[0]")
        g.emit(ind, "pos += 4")
        g.emit(ind, "if flag == 0: return head, pos")
        g.emit(ind, f"if flag != 1: raise _bad_bool({qn} + '.{linked}', flag, pos - 4)")
    g.emit(1, "except _sterr:")
    g.emit(2, f"raise _truncated({qn}, pos, buf) from None")
    if not linked:
        args = ", ".join(f"a{i}" for i in range(len(fields)))
        g.emit(1, f"return {cls_ref}({args}), pos")


def _struct_class_source(name: str, pynames: list[str], linked: str | None) -> str:
    """__init__, __eq__ and __repr__ of a generated struct class."""
    L = []
    params = ", ".join(pynames)
    L.append(f"def __init__(_s, {params}):")
    for f in pynames:
        L.append(f"    _s.{f} = {f}")
    if linked:
        plain = [f for f in pynames if f != linked]
        L.append("def __eq__(a, b):")
        L.append("    if a.__class__ is not b.__class__: return NotImplemented")
        L.append("    while True:")
        if plain:
            L.append("        if not (" + " and ".join(f"a.{f} == b.{f}" for f in plain) + "): return False")
        L.append(f"        a = a.{linked}; b = b.{linked}")
        L.append("        if a is None or b is None: return a is b")
        L.append("        if a.__class__ is not b.__class__: return False")
        L.append("def __repr__(s):")
        L.append("    parts = []")
        L.append("    n = 0")
        L.append("    while s is not None:")
        inner = ", ".join(f"{f}={{s.{f}!r}}" for f in plain)
        sep = ", " if plain else ""
        L.append(f"        parts.append(f'{name}({inner}{sep}{linked}=')")
        L.append(f"        s = s.{linked}")
        L.append("        n += 1")
        L.append("    return ''.join(parts) + 'None' + ')' * n")
    else:
        L.append("def __eq__(a, b):")
        L.append("    if a.__class__ is not b.__class__: return NotImplemented")
        L.append("    return " + " and ".join(f"a.{f} == b.{f}" for f in pynames))
        L.append("def __repr__(s):")
        inner = ", ".join(f"{f}={{s.{f}!r}}" for f in pynames)
        L.append(f"    return f'{name}({inner})'")
    return "\n".join(L)


class _XdrClassMeta(type):
    """Metaclass of generated struct/union classes: only for a readable repr of the class."""

    def __repr__(cls) -> str:
        return f"<xdr {cls.xdr_kind} {cls.xdr_name}>"


def make_struct(name: str, field_names: list[str], linked: bool = False) -> type:
    """A new struct class with slots for field_names (XDR names; keywords get a '_').

    Field types are attached later with set_struct_types() (so structs can refer to
    types declared after them, or to themselves).  linked=True declares the last field
    a self-link (``name *next``) handled iteratively.
    """
    pynames = [py_name(f) for f in field_names]
    if not pynames:
        raise ValueError(f"struct {name} has no fields")
    link = pynames[-1] if linked else None
    ns: dict[str, Any] = {}
    exec(_compile(_struct_class_source(name, pynames, link), f"<xdr struct {name}>"), {}, ns)
    ns.update({"__slots__": tuple(pynames), "__match_args__": tuple(pynames),
               "xdr_kind": "struct", "xdr_name": name, "xdr_compiled": False,
               "xdr_field_names": tuple(field_names), "xdr_fields": None,
               "xdr_linked": link, "min_size": 4,
               "pack": staticmethod(_not_compiled), "unpack": staticmethod(_not_compiled),
               "xdr_build": classmethod(_struct_build)})
    return _XdrClassMeta(name, (), ns)


def set_struct_types(cls: type, types: list[Any]) -> None:
    """Attach the field types (in declared order) to a class made by make_struct."""
    if len(types) != len(cls.xdr_field_names):
        raise ValueError(f"struct {cls.xdr_name}: {len(types)} types for "
                         f"{len(cls.xdr_field_names)} fields")
    if cls.xdr_linked:
        last = types[-1]
        if getattr(last, "xdr_kind", None) != "optional" or last.elem is not cls:
            raise ValueError(f"struct {cls.xdr_name}: linked, but its last field is not "
                             f"'{cls.xdr_name} *'")
    cls.xdr_fields = tuple(zip(cls.__slots__, types))
    cls.min_size = sum(getattr(t, "min_size", 4) for t in types if t is not cls)


def _struct_build(cls: type) -> None:
    if cls.xdr_fields is None:
        raise RuntimeError(f"struct {cls.xdr_name}: field types were never set")
    fields = list(cls.xdr_fields)
    if cls.xdr_linked:
        fields = fields[:-1]       # the link is handled by the loop, not as a field
        for _n, t in fields:
            _fns(t)
    g = _Gen()
    _struct_source(cls, g, fields, cls.xdr_linked)
    ns: dict[str, Any] = {}
    exec(_compile("\n".join(g.lines), f"<xdr struct {cls.xdr_name} codec>"), g.g, ns)
    cls.pack = staticmethod(ns["pack"])
    cls.unpack = staticmethod(ns["unpack"])


def struct(name: str, fields: list[tuple[str, Any]]) -> type:
    """Convenience: a compiled struct from [(field_name, type)] (non-linked)."""
    cls = make_struct(name, [f for f, _ in fields])
    set_struct_types(cls, [t for _, t in fields])
    compile_type(cls)
    return cls


# --- unions ---------------------------------------------------------------------------------

_NOARM = object()


def make_union(name: str) -> type:
    """A new union class: instances have .tag (discriminant) and .value (arm value or None).

    The discriminant type and arms are attached later with set_union_arms().
    """
    def __init__(self, tag, value=None):
        self.tag = tag
        self.value = value

    def __eq__(a, b):
        if a.__class__ is not b.__class__:
            return NotImplemented
        return a.tag == b.tag and a.value == b.value

    def __repr__(s):
        d = type(s).xdr_disc
        tag = d.name_of(s.tag) if getattr(d, "xdr_kind", None) == "enum" else repr(s.tag)
        if s.value is None:
            return f"{name}({tag})"
        return f"{name}({tag}, {s.value!r})"

    ns = {"__slots__": ("tag", "value"), "__match_args__": ("tag", "value"),
          "__init__": __init__, "__eq__": __eq__, "__repr__": __repr__,
          "xdr_kind": "union", "xdr_name": name, "xdr_compiled": False,
          "xdr_disc": None, "xdr_disc_name": None, "xdr_arms": None, "xdr_default": _NOARM,
          "min_size": 4,
          "pack": staticmethod(_not_compiled), "unpack": staticmethod(_not_compiled),
          "xdr_build": classmethod(_union_build)}
    return _XdrClassMeta(name, (), ns)


def set_union_arms(cls: type, disc_name: str, disc: Any, arms: dict[Any, tuple[str, Any]],
                   default: Any = _NOARM) -> None:
    """arms: {discriminant value: (arm_name, type or None for void)};
    default: (arm_name, type or None) or NO_DEFAULT."""
    kind = getattr(disc, "xdr_kind", None)
    if kind not in ("int", "enum", "bool"):
        raise ValueError(f"union {cls.xdr_name}: discriminant must be int, unsigned, enum or bool")
    for v in arms:
        if kind == "enum" and v not in disc.values:
            raise ValueError(f"union {cls.xdr_name}: case {v} is not a member of {disc.xdr_name}")
    cls.xdr_disc = disc
    cls.xdr_disc_name = disc_name
    cls.xdr_arms = dict(arms)
    cls.xdr_default = default


NO_DEFAULT = _NOARM


def _union_build(cls: type) -> None:
    name = cls.xdr_name
    disc = cls.xdr_disc
    kind = disc.xdr_kind
    arms_p: dict = {}
    arms_u: dict = {}
    for v, (_arm, t) in cls.xdr_arms.items():
        if t is None:
            arms_p[v] = arms_u[v] = None
        else:
            arms_p[v], arms_u[v] = _fns(t)
    if cls.xdr_default is _NOARM:
        dflt_p = dflt_u = _NOARM
    elif cls.xdr_default[1] is None:
        dflt_p = dflt_u = None
    else:
        dflt_p, dflt_u = _fns(cls.xdr_default[1])
    if kind == "enum":
        valid = disc.values.__contains__
    elif kind == "bool":
        valid = (0, 1).__contains__
    else:
        lo, hi = disc.lo, disc.hi
        valid = lambda t: t.__class__ is int and lo <= t <= hi  # noqa: E731
    is_bool = kind == "bool"
    dpack = _st.Struct(">" + ("I" if is_bool else disc.run_fmt)).pack
    dget = _st.Struct(">" + ("I" if is_bool else disc.run_fmt)).unpack_from

    def pack(u, out):
        try:
            tag = u.tag
            p = arms_p.get(tag, _NOARM)
            if p is _NOARM:
                p = dflt_p
                if p is _NOARM:
                    raise XdrError(f"{name}: no arm for discriminant {tag!r}", name)
                if not valid(tag):
                    raise XdrError(f"{name}: invalid discriminant {tag!r}", name)
            out += dpack(tag)
            if p is not None:
                p(u.value, out)
        except XdrError:
            raise
        except _PACK_ERRORS as e:
            raise _pack_error(name, u, e) from None

    def unpack(buf, pos):
        try:
            tag = dget(buf, pos)[0]
        except _sterr:
            raise _truncated(name, pos, buf) from None
        uf = arms_u.get(tag, _NOARM)
        if uf is _NOARM:
            uf = dflt_u
            if uf is _NOARM or not valid(tag):
                raise XdrError(f"{name}: invalid discriminant {tag} at offset {pos}", name, pos)
        if is_bool:
            tag = tag == 1
        if uf is None:
            return cls(tag), pos + 4
        val, pos = uf(buf, pos + 4)
        return cls(tag, val), pos

    cls.pack = staticmethod(pack)
    cls.unpack = staticmethod(unpack)


# --- top level ------------------------------------------------------------------------------

def encode(t: Any, value: Any) -> bytes:
    """The XDR encoding of value as type t."""
    out = bytearray()
    t.pack(value, out)
    return bytes(out)


def decode(t: Any, data: Any) -> Any:
    """Decode data (bytes-like) as exactly one t; XdrError on malformed input or leftovers."""
    buf = data if isinstance(data, memoryview) else memoryview(data)
    if buf.ndim != 1 or buf.format not in ("B", "b", "c"):
        buf = buf.cast("B")
    value, pos = t.unpack(buf, 0)
    if pos != len(buf):
        name = getattr(t, "xdr_name", "?")
        raise XdrError(f"{name}: {len(buf) - pos} bytes left over after offset {pos}", name, pos)
    return value
