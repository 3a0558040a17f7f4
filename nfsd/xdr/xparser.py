"""Parser for the XDR language (RFC 4506 section 6) that builds core type objects.

    ns = load_spec(text)            # {name: type object or int constant}

Supported: const, enum, struct, union (switch / case / default), typedef, optional
``*``, fixed ``[n]`` and variable ``<n>`` arrays, opaque, string, unsigned, hyper,
bool, void, anonymous struct/union/enum type specifiers inside declarations, and
rpcgen ``program``/``version`` blocks (turned into constants: program, version and
procedure numbers, as rpcgen does).  ``/* */`` and ``//`` comments and ``%``
pass-through lines are ignored.  float/double/quadruple are rejected (not used by
NFS, and we do not carry them).

Naming rules for what the spec does not name:
  * an anonymous struct/union declared as field F of type P is exported as ``P_F``
    (e.g. RFC 5531's ``rpc_msg_body``);
  * XDR field names that are Python keywords get a trailing ``_``.

Typedefs of a plain type name are aliases of the same object
(``typedef utf8string utf8str_cs`` -> the same type object); a typedef that adds a
size or ``*`` creates a new type object named after the typedef.

Per-field overrides: ``load_spec(text, zero_copy={("WRITE4args", "data")})`` makes
those variable opaque fields decode to a memoryview slice of the input buffer instead
of bytes.  A name in zero_copy that is not a variable opaque field is an error.

Decode limits: ``load_spec(text, limits={"bitmap4": 8})`` gives an unbounded (``<>``)
variable array, opaque or string typedef a maximum length, enforced on decode (before
anything is allocated) and on encode, as if the .x had declared ``bitmap4<8>``.  A key
"Owner.field" (``{"TEST_STATEID4args.ts_stateids": 1024}``) does the same for an
unbounded variable-length member of a struct or union arm (``stateid4 ts_stateids<>``),
whose array has no typedef name of its own.  It is for the server's own protection
where the protocol leaves a client-controlled count open; a name that is not such a
typedef or member is an error.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from . import core

__all__ = ["XdrSyntaxError", "parse", "load_spec", "builtin_namespace"]


class XdrSyntaxError(ValueError):
    """The .x text is not valid XDR (message has the line number)."""


# Comments are replaced by as many newlines as they contain, so line numbers survive.
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|^[ \t]*%[^\n]*", re.S | re.M)

_KEYWORDS = {"bool", "case", "const", "default", "double", "quadruple", "enum", "float",
             "hyper", "int", "opaque", "string", "struct", "switch", "typedef", "union",
             "unsigned", "void", "program", "version"}


def builtin_namespace() -> dict[str, Any]:
    """Names every spec may use: TRUE/FALSE and the RFC 1832-style int typedefs."""
    return {"TRUE": 1, "FALSE": 0,
            "int32_t": core.INT, "uint32_t": core.UINT,
            "int64_t": core.HYPER, "uint64_t": core.UHYPER}


def _strip(text: str) -> str:
    return _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)


_TOKENS = re.compile(r"(-?0[xX][0-9A-Fa-f]+|-?[0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|([{}()\[\]<>;:,=*])|(\S)")


def _tokenize(text: str) -> list[tuple[str, str]]:
    """[(kind, value)] with kind in num/id/punct (positions are recomputed only for errors)."""
    toks = []
    append = toks.append
    for num, ident, punct, bad in _TOKENS.findall(text):
        if ident:
            append(("id", ident))
        elif punct:
            append(("punct", punct))
        elif num:
            append(("num", num))
        else:
            raise XdrSyntaxError(f"line {_token_line(text, len(toks))}: "
                                 f"unexpected character {bad!r}")
    return toks


def _token_line(text: str, index: int) -> int:
    """Line number of the index-th token of text (error path only)."""
    for i, m in enumerate(_TOKENS.finditer(text)):
        if i == index:
            return text.count("\n", 0, m.start()) + 1
    return text.count("\n") + 1


# --- parse tree ------------------------------------------------------------------------
# Type specs (tuples):
#   ("prim", core_type)              int/unsigned/hyper/bool ...
#   ("ref", name)                    a named type
#   ("enum", [(name, value)])
#   ("struct", [decl, ...])
#   ("union", disc_decl, [(values, decl)], default_decl or None or "none")
#   ("fopaque", n) ("vopaque", max) ("string", max)
#   ("farray", spec, n) ("varray", spec, max) ("opt", spec)
# A declaration is (name, spec) or None for void.
# Definitions: ("typedef", name, spec) ("enum", name, spec) ("struct", name, spec)
#              ("union", name, spec) ("const", name, value)


class _Parser:
    def __init__(self, text: str, consts: dict[str, int]):
        self.text = _strip(text)
        self.toks = _tokenize(self.text)
        self.i = 0
        self.consts = consts       # constants and enum members, resolved as we go
        self.defs: list[tuple] = []

    # -- token helpers
    def _line(self, i: int | None = None) -> int:
        return _token_line(self.text, self.i if i is None else i)

    def err(self, msg: str) -> XdrSyntaxError:
        got = self.toks[self.i][1] if self.i < len(self.toks) else "end of input"
        return XdrSyntaxError(f"line {self._line()}: {msg} (at {got!r})")

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise self.err("unexpected end of input")
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, value: str) -> None:
        if self.peek() != value:
            raise self.err(f"expected {value!r}")
        self.i += 1

    def accept(self, value: str) -> bool:
        if self.peek() == value:
            self.i += 1
            return True
        return False

    def ident(self) -> str:
        kind, v = self.take()
        if kind != "id" or v in _KEYWORDS:
            self.i -= 1
            raise self.err("expected an identifier")
        return v

    def value(self) -> int:
        kind, v = self.take()
        if kind == "num":
            neg = v.startswith("-")
            body = v[1:] if neg else v
            if body[:2] in ("0x", "0X"):
                n = int(body, 16)
            elif len(body) > 1 and body[0] == "0":
                n = int(body, 8)
            else:
                n = int(body)
            return -n if neg else n
        if kind == "id" and v in self.consts:
            return self.consts[v]
        self.i -= 1
        raise self.err("expected a number or a known constant")

    # -- grammar
    def spec(self) -> list[tuple]:
        while self.i < len(self.toks):
            self.definition()
        return self.defs

    def definition(self) -> None:
        kw = self.peek()
        if kw == "const":
            self.i += 1
            name = self.ident()
            self.expect("=")
            v = self.value()
            self.expect(";")
            self._const(name, v)
        elif kw == "typedef":
            self.i += 1
            decl = self.declaration()
            if decl is None:
                raise self.err("typedef of void")
            self.expect(";")
            self.defs.append(("typedef", decl[0], decl[1]))
        elif kw in ("enum", "struct", "union"):
            self.i += 1
            name = self.ident()
            body = {"enum": self.enum_body, "struct": self.struct_body,
                    "union": self.union_body}[kw]()
            self.expect(";")
            self.defs.append((kw, name, body))
        elif kw == "program":
            self.program()
        else:
            raise self.err("expected const, typedef, enum, struct, union or program")

    def _const(self, name: str, v: int) -> None:
        if name in self.consts and self.consts[name] != v:
            raise self.err(f"constant {name} redefined")
        self.consts[name] = v
        self.defs.append(("const", name, v))

    def enum_body(self) -> tuple:
        self.expect("{")
        members = []
        while True:
            name = self.ident()
            self.expect("=")
            v = self.value()
            members.append((name, v))
            self._const(name, v)
            if not self.accept(","):
                break
        self.expect("}")
        return ("enum", members)

    def struct_body(self) -> tuple:
        self.expect("{")
        decls = []
        while not self.accept("}"):
            d = self.declaration()
            self.expect(";")
            if d is None:
                raise self.err("void field in struct")
            decls.append(d)
        if not decls:
            raise self.err("empty struct")
        return ("struct", decls)

    def union_body(self) -> tuple:
        self.expect("switch")
        self.expect("(")
        disc = self.declaration()
        if disc is None:
            raise self.err("void discriminant")
        self.expect(")")
        self.expect("{")
        cases: list[tuple[list[int], Any]] = []
        default: Any = "none"
        while not self.accept("}"):
            if self.accept("default"):
                self.expect(":")
                if default != "none":
                    raise self.err("two default arms")
                default = self.declaration()
                self.expect(";")
                continue
            values = []
            self.expect("case")
            values.append(self.value())
            self.expect(":")
            while self.accept("case"):
                values.append(self.value())
                self.expect(":")
            decl = self.declaration()
            self.expect(";")
            cases.append((values, decl))
        return ("union", disc, cases, default)

    def type_specifier(self) -> tuple:
        t = self.peek()
        if t == "unsigned":
            self.i += 1
            if self.accept("int"):
                return ("prim", core.UINT)
            if self.accept("hyper"):
                return ("prim", core.UHYPER)
            if self.accept("long"):          # rpcgen extension: long is 32-bit here
                return ("prim", core.UINT)
            return ("prim", core.UINT)       # bare 'unsigned' (RFC 5531 uses it)
        if t in ("int", "long"):
            self.i += 1
            return ("prim", core.INT)
        if t == "hyper":
            self.i += 1
            return ("prim", core.HYPER)
        if t == "bool":
            self.i += 1
            return ("prim", core.BOOL)
        if t in ("float", "double", "quadruple"):
            raise self.err(f"{t} is not supported")
        if t in ("enum", "struct", "union"):
            self.i += 1
            if self.peek() not in ("{", "switch"):    # rpcgen style: "struct foo x;"
                return ("ref", self.ident())
            return {"enum": self.enum_body, "struct": self.struct_body,
                    "union": self.union_body}[t]()
        return ("ref", self.ident())

    def declaration(self):
        t = self.peek()
        if t == "void":
            self.i += 1
            return None
        if t in ("opaque", "string"):
            self.i += 1
            name = self.ident()
            if t == "opaque" and self.accept("["):
                n = self.value()
                self.expect("]")
                return (name, ("fopaque", n))
            self.expect("<")
            mx = None if self.peek() == ">" else self.value()
            self.expect(">")
            return (name, ("vopaque" if t == "opaque" else "string", mx))
        ts = self.type_specifier()
        if self.accept("*"):
            return (self.ident(), ("opt", ts))
        name = self.ident()
        if self.accept("["):
            n = self.value()
            self.expect("]")
            return (name, ("farray", ts, n))
        if self.accept("<"):
            mx = None if self.peek() == ">" else self.value()
            self.expect(">")
            return (name, ("varray", ts, mx))
        return (name, ts)

    def program(self) -> None:
        """program P { version V { rettype PROC(argtype) = n; ... } = v; ... } = p;"""
        self.expect("program")
        pname = self.ident()
        self.expect("{")
        versions = []
        while self.accept("version"):
            vname = self.ident()
            self.expect("{")
            procs = []
            while not self.accept("}"):
                self.type_specifier() if self.peek() != "void" else self.take()
                proc = self.ident()
                self.expect("(")
                while not self.accept(")"):
                    self.take()
                self.expect("=")
                procs.append((proc, self.value()))
                self.expect(";")
            self.expect("=")
            versions.append((vname, self.value(), procs))
            self.expect(";")
        self.expect("}")
        self.expect("=")
        self._const(pname, self.value())
        self.expect(";")
        for vname, vnum, procs in versions:
            self._const(vname, vnum)
            for proc, pnum in procs:
                self._const(proc, pnum)


def parse(text: str, consts: dict[str, int] | None = None) -> tuple[list[tuple], dict[str, int]]:
    """Parse .x text into definitions; consts (updated in place) seeds known constants."""
    consts = {} if consts is None else consts
    p = _Parser(text, consts)
    return p.spec(), consts


# --- building ------------------------------------------------------------------------------

class _Builder:
    def __init__(self, ns: dict[str, Any], zero_copy: set[tuple[str, str]],
                 limits: dict[str, int] | None = None):
        self.ns = ns
        self.limits = dict(limits or {})
        self.zero_copy = set(zero_copy)
        self.used_zero_copy: set[tuple[str, str]] = set()
        self.pending_struct: list[tuple[type, list]] = []
        self.pending_union: list[tuple[type, tuple]] = []
        self.typedefs: dict[str, tuple] = {}
        self.resolving: set[str] = set()
        self.created: list[Any] = []        # every type object built, for compilation
        self.defined: list[str] = []         # names this spec defines (export order)
        self.builtin_names = set(builtin_namespace())

    def declare(self, defs: list[tuple]) -> None:
        ns = self.ns
        for d in defs:
            kind, name = d[0], d[1]
            if kind != "const" and (name in self.typedefs or (
                    name in ns and name not in self.builtin_names)):
                raise XdrSyntaxError(f"{name} is defined twice")
            ns.pop(name, None) if kind != "const" else None
            if kind == "const":
                ns[name] = d[2]
            elif kind == "enum":
                ns[name] = self.make_enum(name, d[2])
            elif kind == "struct":
                ns[name] = self.make_struct(name, d[2])
            elif kind == "union":
                ns[name] = self.make_union(name, d[2])
            elif kind == "typedef":
                self.typedefs[name] = d[2]
            self.defined.append(name)
        for name in self.typedefs:
            self.resolve_typedef(name)

    def make_enum(self, name: str, spec: tuple) -> core.Enum:
        e = core.Enum(name, dict(spec[1]))
        self.created.append(e)
        return e

    def make_struct(self, name: str, spec: tuple) -> type:
        decls = spec[1]
        last = decls[-1][1]
        linked = last[0] == "opt" and last[1] == ("ref", name)
        cls = core.make_struct(name, [n for n, _ in decls], linked=linked)
        self.pending_struct.append((cls, decls))
        self.created.append(cls)
        return cls

    def make_union(self, name: str, spec: tuple) -> type:
        cls = core.make_union(name)
        self.pending_union.append((cls, spec))
        self.created.append(cls)
        return cls

    def resolve_typedef(self, name: str) -> Any:
        if name in self.ns:
            return self.ns[name]
        if name in self.resolving:
            raise XdrSyntaxError(f"typedef {name} refers to itself")
        self.resolving.add(name)
        spec = self.typedefs[name]
        if name in self.limits:
            spec = self._limited(name, spec, self.limits.pop(name))
        t = self.type_of(spec, name, alias_ok=True)
        self.resolving.discard(name)
        self.ns[name] = t
        return t

    @staticmethod
    def _limited(name: str, spec: tuple, limit: int) -> tuple:
        """spec with its open maximum length replaced by limit (see Decode limits)."""
        if spec[0] not in ("varray", "vopaque", "string") or spec[-1] is not None:
            raise XdrSyntaxError(f"limits: {name} is not an unbounded variable-length "
                                 "typedef or member")
        if not 0 < limit <= 0xFFFFFFFF:
            raise XdrSyntaxError(f"limits: {name}: bad limit {limit}")
        return spec[:-1] + (limit,)

    def lookup(self, name: str) -> Any:
        t = self.ns.get(name)
        if t is None and name in self.typedefs:
            t = self.resolve_typedef(name)
        if t is None or isinstance(t, int):
            raise XdrSyntaxError(f"unknown type {name}")
        return t

    def type_of(self, spec: tuple, name: str, alias_ok: bool = False, owner: str | None = None,
                field: str | None = None) -> Any:
        """The type object for a spec; name is what to call a new one."""
        k = spec[0]
        if k == "prim":
            return spec[1]
        if k == "ref":
            return self.lookup(spec[1])
        if k in ("enum", "struct", "union"):
            return {"enum": self.make_enum, "struct": self.make_struct,
                    "union": self.make_union}[k](name, spec)
        if k == "fopaque":
            t = core.FixedOpaque(name, spec[1])
        elif k == "vopaque":
            zc = (owner, field) in self.zero_copy
            if zc:
                self.used_zero_copy.add((owner, field))
            t = core.VarOpaque(name, spec[1], zero_copy=zc)
        elif k == "string":
            t = core.String(name, spec[1])
        elif k == "farray":
            t = core.FixedArray(name, self.type_of(spec[1], name + "_elem"), spec[2])
        elif k == "varray":
            t = core.VarArray(name, self.type_of(spec[1], name + "_elem"), spec[2])
        elif k == "opt":
            t = core.Optional(name, self.type_of(spec[1], name + "_elem"))
        else:  # pragma: no cover - parser never produces others
            raise XdrSyntaxError(f"bad spec {spec!r}")
        self.created.append(t)
        return t

    def _member_type(self, owner: str, decl: tuple) -> Any:
        fname, spec = decl
        sub = f"{owner}_{fname}"
        if f"{owner}.{fname}" in self.limits:
            spec = self._limited(f"{owner}.{fname}", spec, self.limits.pop(f"{owner}.{fname}"))
        if spec[0] in ("struct", "union", "enum"):
            t = self.type_of(spec, sub)
            self.ns[sub] = t
            self.defined.append(sub)
            return t
        if spec[0] in ("farray", "varray", "opt") and spec[1][0] in ("struct", "union", "enum"):
            inner = self.type_of(spec[1], sub)
            self.ns[sub] = inner
            self.defined.append(sub)
            spec = (spec[0], ("ref", sub)) + tuple(spec[2:])
        return self.type_of(spec, f"{owner}.{fname}", owner=owner, field=fname)

    def finish(self) -> None:
        # Anonymous members can create more pending structs/unions: loop until done.
        while self.pending_struct or self.pending_union:
            while self.pending_struct:
                cls, decls = self.pending_struct.pop(0)
                core.set_struct_types(cls, [self._member_type(cls.xdr_name, d) for d in decls])
            while self.pending_union:
                cls, spec = self.pending_union.pop(0)
                self.finish_union(cls, spec)
        missing = self.zero_copy - self.used_zero_copy
        if missing:
            raise XdrSyntaxError(f"zero_copy names no variable opaque field: {sorted(missing)}")
        if self.limits:
            raise XdrSyntaxError(f"limits name no typedef or member: {sorted(self.limits)}")
        for t in self.created:
            core.compile_type(t)

    def finish_union(self, cls: type, spec: tuple) -> None:
        _, disc_decl, cases, default = spec
        name = cls.xdr_name
        dname, dspec = disc_decl
        disc = self.type_of(dspec, f"{name}.{dname}")
        arms: dict[Any, tuple[str, Any]] = {}
        for values, decl in cases:
            arm = ("void", None) if decl is None else (decl[0], self._member_type(name, decl))
            for v in values:
                if v in arms:
                    raise XdrSyntaxError(f"union {name}: case {v} appears twice")
                arms[v] = arm
        if default == "none":
            d: Any = core.NO_DEFAULT
        elif default is None:
            d = ("void", None)
        else:
            d = (default[0], self._member_type(name, default))
        try:
            core.set_union_arms(cls, dname, disc, arms, d)
        except ValueError as e:
            raise XdrSyntaxError(str(e)) from None


def load_spec(text: str, imports: dict[str, Any] | None = None,
              zero_copy: Iterable[tuple[str, str]] = (),
              limits: dict[str, int] | None = None) -> dict[str, Any]:
    """Parse and build a .x spec.  Returns {name: type object or int} of the names the spec
    defines (plus the builtin int typedefs); imports supplies names from other specs
    (e.g. authsys_parms and AUTH_SYS for nfs4_prot.x) without re-exporting them."""
    base = builtin_namespace()
    if imports:
        base.update(imports)
    consts = {k: v for k, v in base.items() if isinstance(v, int)}
    defs, _ = parse(text, consts)
    ns = dict(base)
    b = _Builder(ns, set(zero_copy), limits)
    b.declare(defs)
    b.finish()
    out = {k: v for k, v in builtin_namespace().items() if not isinstance(v, int)}
    for name in b.defined:
        out[name] = ns[name]
    return out
