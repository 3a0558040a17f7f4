# cython: language_level=3
"""fattr4 encoding in C (issue 37 point 3): the attrlist4 bytes of GETATTR, READDIR, VERIFY.

`nfsd/attrs.py` is the specification: its table (ATTRS) says which attributes exist, in which
minor version, with which XDR type and getter. This module only writes, for one request, the
same bytes the reference would, straight from the object's Attr record into a C buffer: no
Python object per attribute, one bytes object per reply.

It never decides anything the reference decides. A request bitmap is planned once by the
reference (`attrs._plan`: which bits are returned, in which order), and the plan is native
only when every returned bit is one this module knows:
  - per-plan constants (fh_expire_type, the booleans, maxread, time_delta, supported_attrs of
    the plan's minor version, ...): encoded once by the reference's own getter and packer;
  - per-object values (type, change, size, fsid, fileid, mode, numlinks, owner, owner_group,
    rawdev, space_used, the times, mounted_on_fileid, filehandle, the statfs ones,
    lease_time, rdattr_error): written here, each guarded by its row still having the
    getter and XDR type this code was written against (a rewritten row falls back).
Anything else — an attribute added to the table later, a value out of its XDR range, a
non-int where an int belongs, an env or idmap of another class, any exception — makes
`encode` return None, and the caller runs the reference for that request. So the output is
the reference's, byte for byte, error for error (tests/nfsd/test_fattr_native.py).
"""
import dis

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "Python.h":
    # Declared without Cython's error checks: callers test PyErr_Occurred themselves.
    unsigned long long PyLong_AsUnsignedLongLong(object o)
    unsigned long long PyLong_AsUnsignedLongLongMask(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow)
    bint PyLong_Check(object o)
    bint PyLong_CheckExact(object o)
    bint PyBytes_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)
    char *PyBytes_AS_STRING(object o)
    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t n)
    void *PyErr_Occurred()
    void PyErr_Clear()


# RFC 8881 / 7862 attribute numbers (checked against nfsd.xdr.nfs4 at import).
cdef enum:
    A_SUPPORTED_ATTRS = 0
    A_TYPE = 1
    A_CHANGE = 3
    A_SIZE = 4
    A_FSID = 8
    A_LEASE_TIME = 10
    A_RDATTR_ERROR = 11
    A_FILEHANDLE = 19
    A_FILEID = 20
    A_FILES_AVAIL = 21
    A_FILES_FREE = 22
    A_FILES_TOTAL = 23
    A_MODE = 33
    A_NUMLINKS = 35
    A_OWNER = 36
    A_OWNER_GROUP = 37
    A_RAWDEV = 41
    A_SPACE_AVAIL = 42
    A_SPACE_FREE = 43
    A_SPACE_TOTAL = 44
    A_SPACE_USED = 45
    A_TIME_ACCESS = 47
    A_TIME_METADATA = 52
    A_TIME_MODIFY = 53
    A_MOUNTED_ON_FILEID = 55
    A_CONST = 1000          # a step that copies precomputed bytes

# A step per returned attribute; a reply of more than this many falls back (the table has ~50).
cdef enum:
    MAX_STEPS = 128
# The attrlist4 is written here; an owner name that would not fit falls back.
cdef enum:
    BUF_SIZE = 4096

# The per-object attributes written below, and the getters (and helpers) of nfsd/attrs.py they
# were written against: a row whose getter's code is not this code (a rewritten getter, another
# XDR type) is not ours, and falls back. Compared compiled, by the same interpreter.
_DYNAMIC = {
    A_TYPE: ("lambda e: int(e.attr.type)", "nfs_ftype4"),
    A_CHANGE: ("lambda e: e.attr.change", "unsigned hyper"),
    A_SIZE: ("lambda e: e.attr.size", "unsigned hyper"),
    A_FSID: ("lambda e: e.fsid()", "fsid4"),
    A_LEASE_TIME: ("lambda e: int(e.server.lease_time)", "unsigned int"),
    A_RDATTR_ERROR: ("lambda e: e.rdattr_error", "nfsstat4"),
    A_FILEHANDLE: ("lambda e: e.obj.fh.raw", "nfs_fh4"),
    A_FILEID: ("lambda e: e.attr.ino", "unsigned hyper"),
    A_FILES_AVAIL: ("lambda e: e.statfs().files_avail", "unsigned hyper"),
    A_FILES_FREE: ("lambda e: e.statfs().files_free", "unsigned hyper"),
    A_FILES_TOTAL: ("lambda e: e.statfs().files_total", "unsigned hyper"),
    A_MODE: ("lambda e: e.attr.mode & 0o7777", "unsigned int"),
    A_NUMLINKS: ("lambda e: e.attr.nlink", "unsigned int"),
    A_OWNER: ("lambda e: _idmap(e).owner(e.attr.uid)", "utf8string"),
    A_OWNER_GROUP: ("lambda e: _idmap(e).group(e.attr.gid)", "utf8string"),
    A_RAWDEV: ("lambda e: specdata4(specdata1=e.attr.rdev[0], specdata2=e.attr.rdev[1])",
               "specdata4"),
    A_SPACE_AVAIL: ("lambda e: e.statfs().bytes_avail", "unsigned hyper"),
    A_SPACE_FREE: ("lambda e: e.statfs().bytes_free", "unsigned hyper"),
    A_SPACE_TOTAL: ("lambda e: e.statfs().bytes_total", "unsigned hyper"),
    A_SPACE_USED: ("lambda e: e.attr.space_used", "unsigned hyper"),
    A_TIME_ACCESS: ("lambda e: ns_to_time(e.attr.atime_ns)", "nfstime4"),
    A_TIME_METADATA: ("lambda e: ns_to_time(e.attr.ctime_ns)", "nfstime4"),
    A_TIME_MODIFY: ("lambda e: ns_to_time(e.attr.mtime_ns)", "nfstime4"),
    A_MOUNTED_ON_FILEID: ("lambda e: e.mounted_on_fileid()", "unsigned hyper"),
}
_HELPERS = {
    "ns_to_time": """def ns_to_time(ns):
    seconds, nanos = divmod(ns, 1_000_000_000)
    return nfstime4(seconds=seconds, nseconds=nanos)
""",
    "_idmap": """def _idmap(env):
    return env.server.exports.idmap
""",
    "AttrEnv.fsid": """def fsid(self):
    exp = self.obj.export
    major = exp.export_id if exp else 0
    fsid = _FSIDS.get(major)
    if fsid is None:
        fsid = _FSIDS[major] = fsid4(major=major, minor=0)
    return fsid
""",
    "AttrEnv.mounted_on_fileid": """def mounted_on_fileid(self):
    exp = self.obj.export
    if exp is not None and exp.mount_fileid and self.attr.ino == exp.root_ino:
        return exp.mount_fileid
    return self.attr.ino
""",
    "AttrEnv.statfs": """def statfs(self):
    if self._statfs is None:
        self._statfs = self.server.store.statfs()
    return self._statfs
""",
    "AttrEnv.attr": """def attr(self):
    return self.obj.attr
""",
}


def _code_of(src):
    ns = {}
    exec(compile(src if src.startswith("def") else "f = " + src, "<fattr.pyx>", "exec"), ns)
    return [v for k, v in ns.items() if k != "__builtins__"][0].__code__


def _same_code(fn, src) -> bool:
    a, b = getattr(fn, "__code__", None), _code_of(src)
    return a is not None and all(getattr(a, f) == getattr(b, f) for f in (
        "co_code", "co_names", "co_consts", "co_varnames", "co_argcount", "co_freevars"))


def _helpers_unchanged(attrs) -> bool:
    for name, src in _HELPERS.items():
        owner, _, attr = name.rpartition(".")
        fn = getattr(attrs.AttrEnv, attr, None) if owner else getattr(attrs, attr, None)
        if isinstance(fn, property):
            fn = fn.fget
        if not _same_code(fn, src):
            return False
    return True


# Attributes whose getter depends on nothing (fh_expire_type, the booleans, the maxima,
# time_delta, suppattr_exclcreat, clone_blksize) or only on the minor version, which is part
# of a plan's key (supported_attrs): encoded once per plan by the reference itself.
_PLAN_CONSTANT = frozenset({0, 2, 5, 6, 7, 9, 15, 16, 17, 18, 26, 27, 28, 29, 30, 31, 34, 51,
                            75, 77})
_MAX_PLANS = 256


def _reads_its_argument(fn) -> bool:
    code = fn.__code__
    if code.co_argcount != 1:
        return True
    arg = code.co_varnames[0]
    return any(i.opname.startswith(("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "DELETE_FAST",
                                    "STORE_FAST")) and i.argval == arg
               for i in dis.get_instructions(code))


def _covered(attrs) -> frozenset:
    """The bits of the reference's table this module may encode, given its rows today."""
    out = set()
    helpers = _helpers_unchanged(attrs)
    for bit, row in attrs.ATTRS.items():
        get = row.get
        if get is None or not hasattr(get, "__code__"):
            continue
        if bit in _PLAN_CONSTANT:
            if bit == A_SUPPORTED_ATTRS:
                if _same_code(get, "lambda e: SUPPORTED_BITMAPS[e.minorversion]"):
                    out.add(bit)
            elif not _reads_its_argument(get):
                out.add(bit)
            continue
        want = _DYNAMIC.get(bit)
        if want is not None and helpers and row.xdr.xdr_name == want[1] and _same_code(get, want[0]):
            out.add(bit)
    return frozenset(out)


cdef class _Plan:
    """One request bitmap's encoding: the returned mask and a step per returned attribute."""
    cdef object mask            # list: the returned bitmap (copied into each reply)
    cdef bytes consts           # the precomputed bytes of the plan-constant attributes
    cdef int nsteps
    cdef int kind[MAX_STEPS]     # an A_* attribute number, or A_CONST
    cdef int off[MAX_STEPS]      # A_CONST: where in consts, and how long
    cdef int length[MAX_STEPS]


cdef inline unsigned char *put32(unsigned char *p, uint32_t v) noexcept:
    p[0] = <unsigned char>(v >> 24)
    p[1] = <unsigned char>(v >> 16)
    p[2] = <unsigned char>(v >> 8)
    p[3] = <unsigned char>v
    return p + 4


cdef inline unsigned char *put64(unsigned char *p, uint64_t v) noexcept:
    put32(p, <uint32_t>(v >> 32))
    return put32(p + 4, <uint32_t>v)


cdef inline bint as_u64(object v, uint64_t *out):
    """v as an XDR unsigned hyper, or False (not an int, or out of range: the reference's case)."""
    if not PyLong_CheckExact(v):
        return False
    cdef unsigned long long x = PyLong_AsUnsignedLongLong(v)
    if x == <unsigned long long>-1 and PyErr_Occurred() != NULL:
        PyErr_Clear()
        return False
    out[0] = x
    return True


cdef inline bint as_u32(object v, uint32_t *out):
    cdef uint64_t x
    if not as_u64(v, &x) or x > 0xFFFFFFFFu:
        return False
    out[0] = <uint32_t>x
    return True


cdef inline bint as_i64(object v, int64_t *out):
    cdef int overflow = 0
    if not PyLong_CheckExact(v):
        return False
    cdef long long x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or (x == -1 and PyErr_Occurred() != NULL):
        PyErr_Clear()
        return False
    out[0] = x
    return True


cdef inline unsigned char *put_time(unsigned char *p, int64_t ns) noexcept:
    # ns_to_time: divmod by 10**9, floor division (negative times have positive nanos)
    cdef int64_t sec = ns // 1000000000
    cdef int64_t nsec = ns % 1000000000
    if nsec < 0:
        nsec += 1000000000
        sec -= 1
    put64(p, <uint64_t>sec)
    return put32(p + 8, <uint32_t>nsec)


cdef inline unsigned char *put_opaque(unsigned char *p, const char *s, Py_ssize_t n) noexcept:
    p = put32(p, <uint32_t>n)
    memcpy(p, s, n)
    p += n
    while n & 3:
        p[0] = 0
        p += 1
        n += 1
    return p


cdef inline unsigned char *put_decimal(unsigned char *p, uint64_t v) noexcept:
    """str(v).encode() as an XDR opaque: the idmap's numeric owner string."""
    cdef char digits[24]
    cdef int n = 0, i
    while True:
        digits[23 - n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    return put_opaque(p, &digits[24 - n], n)


cdef class Encoder:
    """fattr4 encoder held to one reference module (nfsd.attrs). `encode(env, requested)`
    returns the reference's fattr4, or None when the reference must do this one."""
    cdef object attrs               # the nfsd.attrs module
    cdef object plan_of             # attrs._plan
    cdef object fattr4              # the fattr4 struct class
    cdef object env_class           # attrs.AttrEnv: another class of env falls back
    cdef object idmapper_class      # nfsd.exports.IdMapper: numeric owners are written here
    cdef object type_values         # nfs_ftype4's members
    cdef object status_values       # nfsstat4's members
    cdef Py_ssize_t fh_max          # nfs_fh4's bound
    cdef readonly frozenset covered
    cdef dict plans                 # (minorversion, request words) -> _Plan, or None: fall back
    cdef _Plan fallback_plan

    def __init__(self, attrs, idmapper_class):
        from nfsd.xdr import nfs4
        for name, bit in (("SUPPORTED_ATTRS", A_SUPPORTED_ATTRS), ("TYPE", A_TYPE),
                          ("CHANGE", A_CHANGE), ("SIZE", A_SIZE), ("FSID", A_FSID),
                          ("LEASE_TIME", A_LEASE_TIME), ("RDATTR_ERROR", A_RDATTR_ERROR),
                          ("FILEHANDLE", A_FILEHANDLE), ("FILEID", A_FILEID),
                          ("FILES_AVAIL", A_FILES_AVAIL), ("FILES_FREE", A_FILES_FREE),
                          ("FILES_TOTAL", A_FILES_TOTAL), ("MODE", A_MODE),
                          ("NUMLINKS", A_NUMLINKS), ("OWNER", A_OWNER),
                          ("OWNER_GROUP", A_OWNER_GROUP), ("RAWDEV", A_RAWDEV),
                          ("SPACE_AVAIL", A_SPACE_AVAIL), ("SPACE_FREE", A_SPACE_FREE),
                          ("SPACE_TOTAL", A_SPACE_TOTAL), ("SPACE_USED", A_SPACE_USED),
                          ("TIME_ACCESS", A_TIME_ACCESS), ("TIME_METADATA", A_TIME_METADATA),
                          ("TIME_MODIFY", A_TIME_MODIFY),
                          ("MOUNTED_ON_FILEID", A_MOUNTED_ON_FILEID)):
            if getattr(nfs4, "FATTR4_" + name) != bit:
                raise ImportError(f"FATTR4_{name} is not {bit}")
        self.attrs = attrs
        self.plan_of = attrs._plan
        self.fattr4 = attrs.fattr4
        self.env_class = attrs.AttrEnv
        self.idmapper_class = idmapper_class
        self.type_values = attrs.fattr4_type.values
        self.status_values = attrs.fattr4_rdattr_error.values
        self.fh_max = attrs.fattr4_filehandle.maxlen
        self.covered = _covered(attrs)
        self.plans = {}

    cdef _Plan make_plan(self, env, requested, int minor):
        """The native plan of a request, or None (an attribute we do not know)."""
        mask, steps = self.plan_of(requested, minor)   # the reference decides what is returned
        bits = self.attrs.bits_of(list(mask))
        if len(bits) > MAX_STEPS:
            return None
        rows = self.attrs.ATTRS
        consts = bytearray()
        cdef _Plan plan = _Plan()
        cdef int i = 0
        for bit in bits:
            if bit not in self.covered:
                return None
            if bit in _PLAN_CONSTANT:
                row = rows[bit]
                start = len(consts)
                row.xdr.pack(row.get(env), consts)
                plan.kind[i] = A_CONST
                plan.off[i] = start
                plan.length[i] = len(consts) - start
            else:
                plan.kind[i] = bit
            i += 1
        if len(consts) > BUF_SIZE // 2:
            return None
        plan.nsteps = i
        plan.mask = list(mask)
        plan.consts = bytes(consts)
        return plan

    def encode(self, env, requested):
        """The fattr4 the reference `attrs.encode(env, requested)` returns, or None."""
        if type(env) is not self.env_class:
            return None
        try:
            return self._encode(env, requested)
        except Exception:
            return None             # the reference runs and raises (or not) by itself

    cdef object _encode(self, env, requested):
        minor_obj = env.minorversion
        key = (minor_obj, tuple(requested))
        plan = self.plans.get(key, self)       # self: not planned yet
        if plan is self:
            if not PyLong_CheckExact(minor_obj):
                return None
            plan = self.make_plan(env, requested, <int>minor_obj)
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            self.plans[key] = plan
        if plan is None:
            return None
        return self.write(env, <_Plan>plan)

    cdef object write(self, env, _Plan plan):
        cdef unsigned char buf[BUF_SIZE]
        cdef unsigned char *p = buf
        cdef unsigned char *end = buf + BUF_SIZE
        cdef const char *consts = plan.consts
        cdef uint64_t u64
        cdef uint32_t u32, u32b
        cdef int64_t i64
        cdef int i, kind
        cdef Py_ssize_t n
        obj = env.obj
        attr = None
        statfs = None
        for i in range(plan.nsteps):
            kind = plan.kind[i]
            if end - p < 32:                     # every fixed-size value is at most 16
                return None
            if kind == A_CONST:
                if end - p < plan.length[i]:
                    return None
                memcpy(p, consts + plan.off[i], plan.length[i])
                p += plan.length[i]
                continue
            if attr is None:
                attr = obj.attr
            if kind == A_TYPE:
                v = int(attr.type)
                if not PyLong_CheckExact(v) or v not in self.type_values:
                    return None
                p = put32(p, <uint32_t><int>v)
            elif kind == A_CHANGE:
                if not as_u64(attr.change, &u64):
                    return None
                p = put64(p, u64)
            elif kind == A_SIZE:
                if not as_u64(attr.size, &u64):
                    return None
                p = put64(p, u64)
            elif kind == A_FSID:
                exp = obj.export
                if exp:
                    if not as_u64(exp.export_id, &u64):
                        return None
                else:
                    u64 = 0
                p = put64(put64(p, u64), 0)
            elif kind == A_LEASE_TIME:
                if not as_u32(int(env.server.lease_time), &u32):
                    return None
                p = put32(p, u32)
            elif kind == A_RDATTR_ERROR:
                v = env.rdattr_error
                if not PyLong_CheckExact(v) or v not in self.status_values:
                    return None
                p = put32(p, <uint32_t><int>v)
            elif kind == A_FILEHANDLE:
                raw = obj.fh.raw
                if not PyBytes_CheckExact(raw):
                    return None
                n = PyBytes_GET_SIZE(raw)
                if n > self.fh_max or end - p < n + 8:
                    return None
                p = put_opaque(p, PyBytes_AS_STRING(raw), n)
            elif kind == A_FILEID:
                if not as_u64(attr.ino, &u64):
                    return None
                p = put64(p, u64)
            elif kind == A_MODE:
                v = attr.mode
                if not PyLong_CheckExact(v):
                    return None
                p = put32(p, <uint32_t>(PyLong_AsUnsignedLongLongMask(v) & 0o7777))
            elif kind == A_NUMLINKS:
                if not as_u32(attr.nlink, &u32):
                    return None
                p = put32(p, u32)
            elif kind == A_OWNER or kind == A_OWNER_GROUP:
                p = self.put_owner(env, attr, kind == A_OWNER, p, end)
                if p == NULL:
                    return None
            elif kind == A_RAWDEV:
                rdev = attr.rdev
                if not PyTuple_CheckExact(rdev) or len(rdev) != 2:
                    return None
                if not as_u32(rdev[0], &u32) or not as_u32(rdev[1], &u32b):
                    return None
                p = put32(put32(p, u32), u32b)
            elif kind == A_SPACE_USED:
                if not as_u64(attr.space_used, &u64):
                    return None
                p = put64(p, u64)
            elif kind == A_TIME_ACCESS:
                if not as_i64(attr.atime_ns, &i64):
                    return None
                p = put_time(p, i64)
            elif kind == A_TIME_METADATA:
                if not as_i64(attr.ctime_ns, &i64):
                    return None
                p = put_time(p, i64)
            elif kind == A_TIME_MODIFY:
                if not as_i64(attr.mtime_ns, &i64):
                    return None
                p = put_time(p, i64)
            elif kind == A_MOUNTED_ON_FILEID:
                exp = obj.export
                if exp is not None and exp.mount_fileid and attr.ino == exp.root_ino:
                    v = exp.mount_fileid
                else:
                    v = attr.ino
                if not as_u64(v, &u64):
                    return None
                p = put64(p, u64)
            else:                                    # the statfs ones
                if statfs is None:
                    statfs = env.statfs()
                if kind == A_FILES_AVAIL:
                    v = statfs.files_avail
                elif kind == A_FILES_FREE:
                    v = statfs.files_free
                elif kind == A_FILES_TOTAL:
                    v = statfs.files_total
                elif kind == A_SPACE_AVAIL:
                    v = statfs.bytes_avail
                elif kind == A_SPACE_FREE:
                    v = statfs.bytes_free
                elif kind == A_SPACE_TOTAL:
                    v = statfs.bytes_total
                else:
                    return None
                if not as_u64(v, &u64):
                    return None
                p = put64(p, u64)
        return self.fattr4(list(plan.mask), PyBytes_FromStringAndSize(<char *>buf, p - buf))

    cdef unsigned char *put_owner(self, env, attr, bint user, unsigned char *p,
                                  unsigned char *end) except? NULL:
        """owner / owner_group: the idmap's string. The default IdMapper without names is
        str(id) (written here); with names it reads passwd/group on every call, which a
        cache would make stale, so it is asked each time as the reference does."""
        cdef uint64_t u64
        idmap = env.server.exports.idmap
        ident = attr.uid if user else attr.gid
        if type(idmap) is self.idmapper_class and not idmap.reply_names and as_u64(ident, &u64):
            return put_decimal(p, u64)
        s = idmap.owner(ident) if user else idmap.group(ident)
        if not PyBytes_CheckExact(s):
            return NULL
        cdef Py_ssize_t n = PyBytes_GET_SIZE(s)
        if end - p < n + 8:
            return NULL
        return put_opaque(p, PyBytes_AS_STRING(s), n)
