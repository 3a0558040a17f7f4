"""fattr4 encoding and decoding (RFC 8881 section 5).

One table maps each supported attribute number to its XDR type and a getter; GETATTR,
READDIR and VERIFY encode by walking the requested bitmap in bit order, SETATTR, CREATE
and OPEN decode `attr_vals` the same way. An attribute a later minor version added
(`since_minor`: 4.1's suppattr_exclcreat, RFC 7862's clone_blksize) exists only for COMPOUNDs of that minor version
or later, as in knfsd's per-minor-version supported sets: a 4.1 client neither sees it in
supported_attrs nor gets it, and naming it is NFS4ERR_ATTRNOTSUPP there (a 4.0 client
sees the RFC 7530 attributes only).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from nfsd import native
from nfsd.errors import NfsError
from nfsd.xdr import XdrError
from nfsd.xdr.nfs4 import (
    FATTR4_CANSETTIME, FATTR4_CASE_INSENSITIVE, FATTR4_CLONE_BLKSIZE, FATTR4_CASE_PRESERVING, FATTR4_CHANGE,
    FATTR4_CHOWN_RESTRICTED, FATTR4_FH_EXPIRE_TYPE, FATTR4_FILEHANDLE, FATTR4_FILEID,
    FATTR4_FILES_AVAIL, FATTR4_FILES_FREE, FATTR4_FILES_TOTAL, FATTR4_FSID,
    FATTR4_HOMOGENEOUS, FATTR4_LEASE_TIME, FATTR4_LINK_SUPPORT, FATTR4_MAXFILESIZE,
    FATTR4_MAXLINK, FATTR4_MAXNAME, FATTR4_MAXREAD, FATTR4_MAXWRITE, FATTR4_MODE,
    FATTR4_MOUNTED_ON_FILEID, FATTR4_NAMED_ATTR, FATTR4_NO_TRUNC, FATTR4_NUMLINKS,
    FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_RAWDEV, FATTR4_RDATTR_ERROR, FATTR4_SIZE,
    FATTR4_SPACE_AVAIL, FATTR4_SPACE_FREE, FATTR4_SPACE_TOTAL, FATTR4_SPACE_USED,
    FATTR4_SUPPATTR_EXCLCREAT, FATTR4_SUPPORTED_ATTRS, FATTR4_SYMLINK_SUPPORT,
    FATTR4_TIME_ACCESS, FATTR4_TIME_ACCESS_SET, FATTR4_TIME_DELTA, FATTR4_TIME_METADATA,
    FATTR4_TIME_MODIFY, FATTR4_TIME_MODIFY_SET, FATTR4_TYPE, FATTR4_UNIQUE_HANDLES,
    FATTR4_XATTR_SUPPORT, NF4DIR, NF4REG, fattr4_xattr_support,
    FH4_PERSISTENT, MAX_BITMAP_WORDS, NFS4ERR_ATTRNOTSUPP, NFS4ERR_BADXDR, NFS4ERR_INVAL, NFS4_OK,
    fattr4, fsid4, nfstime4, specdata4,
    fattr4_cansettime, fattr4_case_insensitive, fattr4_clone_blksize, fattr4_case_preserving, fattr4_change,
    fattr4_chown_restricted, fattr4_fh_expire_type, fattr4_filehandle, fattr4_fileid,
    fattr4_files_avail, fattr4_files_free, fattr4_files_total, fattr4_fsid,
    fattr4_homogeneous, fattr4_lease_time, fattr4_link_support, fattr4_maxfilesize,
    fattr4_maxlink, fattr4_maxname, fattr4_maxread, fattr4_maxwrite, fattr4_mode,
    fattr4_mounted_on_fileid, fattr4_named_attr, fattr4_no_trunc, fattr4_numlinks,
    fattr4_owner, fattr4_owner_group, fattr4_rawdev, fattr4_rdattr_error, fattr4_size,
    fattr4_space_avail, fattr4_space_free, fattr4_space_total, fattr4_space_used,
    fattr4_suppattr_exclcreat, fattr4_supported_attrs, fattr4_symlink_support,
    fattr4_time_access, fattr4_time_access_set, fattr4_time_delta, fattr4_time_metadata,
    fattr4_time_modify, fattr4_time_modify_set, fattr4_type, fattr4_unique_handles,
)

MAX_IO = 1 << 20                 # maxread / maxwrite: 1 MiB
MAX_FILESIZE = (1 << 63) - 1
MAX_LINK = 65000
MAX_NAME = 255
# CLONE's offsets and counts are multiples of this (RFC 7862 12.2.1, 15.13.3): the block
# size of the file systems reflink works on; nfsd/ops/v42.py enforces it.
CLONE_BLKSIZE = 4096
LATEST_MINOR = 2                 # the newest NFSv4 minor version served


# ---- bitmaps ---------------------------------------------------------------------------------
# A client controls a bitmap's length: decoding refuses more than MAX_BITMAP_WORDS words
# (nfsd/xdr/nfs4.py). Unknown bits are found or dropped by masking words (`unsupported`,
# `supported_part`, `known_bits`), never by expanding them, so what a request bitmap
# expands to is bounded by the attributes we support, not by its length.
def bits_of(bitmap: list[int]) -> list[int]:
    """Attribute numbers set in a bitmap4, ascending (words past MAX_BITMAP_WORDS,
    which decoding never lets through, are ignored)."""
    out = []
    for word_index, word in enumerate(bitmap[:MAX_BITMAP_WORDS]):
        base = word_index * 32
        while word:
            low = word & -word
            out.append(base + low.bit_length() - 1)
            word ^= low
    return out


def bitmap_of(bits) -> list[int]:
    words: list[int] = []
    for bit in bits:
        w = bit // 32
        while len(words) <= w:
            words.append(0)
        words[w] |= 1 << (bit % 32)
    return words


def ns_to_time(ns: int):
    seconds, nanos = divmod(ns, 1_000_000_000)
    return nfstime4(seconds=seconds, nseconds=nanos)


def time_to_ns(t) -> int:
    if t.nseconds >= 1_000_000_000:
        raise NfsError(NFS4ERR_INVAL, "nseconds out of range")
    return t.seconds * 1_000_000_000 + t.nseconds


# One fsid per export (major = export id); the pseudo-filesystem is 0.
_FSIDS: dict[int, object] = {}


# ---- the environment a getter reads --------------------------------------------------------
class AttrEnv:
    """What the getters need about one object: it, its export, the server."""

    __slots__ = ("server", "obj", "minorversion", "_statfs", "rdattr_error")

    def __init__(self, server, obj, minorversion: int, statfs=None, rdattr_error: int = NFS4_OK):
        self.server = server
        self.obj = obj
        self.minorversion = minorversion
        self._statfs = statfs
        self.rdattr_error = rdattr_error

    @property
    def attr(self):
        return self.obj.attr

    def statfs(self):
        if self._statfs is None:
            self._statfs = self.server.store.statfs()
        return self._statfs

    def fsid(self):
        exp = self.obj.export
        major = exp.export_id if exp else 0
        fsid = _FSIDS.get(major)
        if fsid is None:
            fsid = _FSIDS[major] = fsid4(major=major, minor=0)
        return fsid

    def mounted_on_fileid(self) -> int:
        exp = self.obj.export
        if exp is not None and exp.mount_fileid and self.attr.ino == exp.root_ino:
            return exp.mount_fileid
        return self.attr.ino


@dataclass(frozen=True, slots=True)
class AttrDef:
    xdr: object
    get: Callable[[AttrEnv], object] | None      # None: write-only
    writable: bool = False
    since_minor: int = 0                          # the minor version that defined it


def _idmap(env):
    return env.server.exports.idmap


def _xattr_support(env) -> bool:
    """An export's files and directories have xattrs; the pseudo-fs and the rest do not."""
    return env.obj.export is not None and int(env.attr.type) in (NF4REG, NF4DIR)


ATTRS: dict[int, AttrDef] = {
    FATTR4_SUPPORTED_ATTRS: AttrDef(fattr4_supported_attrs,
                                    lambda e: SUPPORTED_BITMAPS[e.minorversion]),
    FATTR4_TYPE: AttrDef(fattr4_type, lambda e: int(e.attr.type)),
    FATTR4_FH_EXPIRE_TYPE: AttrDef(fattr4_fh_expire_type, lambda e: FH4_PERSISTENT),
    FATTR4_CHANGE: AttrDef(fattr4_change, lambda e: e.attr.change),
    FATTR4_SIZE: AttrDef(fattr4_size, lambda e: e.attr.size, writable=True),
    FATTR4_LINK_SUPPORT: AttrDef(fattr4_link_support, lambda e: True),
    FATTR4_SYMLINK_SUPPORT: AttrDef(fattr4_symlink_support, lambda e: True),
    FATTR4_NAMED_ATTR: AttrDef(fattr4_named_attr, lambda e: False),
    FATTR4_FSID: AttrDef(fattr4_fsid, lambda e: e.fsid()),
    FATTR4_UNIQUE_HANDLES: AttrDef(fattr4_unique_handles, lambda e: True),
    FATTR4_LEASE_TIME: AttrDef(fattr4_lease_time, lambda e: int(e.server.lease_time)),
    FATTR4_RDATTR_ERROR: AttrDef(fattr4_rdattr_error, lambda e: e.rdattr_error),
    FATTR4_CANSETTIME: AttrDef(fattr4_cansettime, lambda e: True),
    FATTR4_CASE_INSENSITIVE: AttrDef(fattr4_case_insensitive, lambda e: False),
    FATTR4_CASE_PRESERVING: AttrDef(fattr4_case_preserving, lambda e: True),
    FATTR4_CHOWN_RESTRICTED: AttrDef(fattr4_chown_restricted, lambda e: True),
    FATTR4_FILEHANDLE: AttrDef(fattr4_filehandle, lambda e: e.obj.fh.raw),
    FATTR4_FILEID: AttrDef(fattr4_fileid, lambda e: e.attr.ino),
    FATTR4_FILES_AVAIL: AttrDef(fattr4_files_avail, lambda e: e.statfs().files_avail),
    FATTR4_FILES_FREE: AttrDef(fattr4_files_free, lambda e: e.statfs().files_free),
    FATTR4_FILES_TOTAL: AttrDef(fattr4_files_total, lambda e: e.statfs().files_total),
    FATTR4_HOMOGENEOUS: AttrDef(fattr4_homogeneous, lambda e: True),
    FATTR4_MAXFILESIZE: AttrDef(fattr4_maxfilesize, lambda e: MAX_FILESIZE),
    FATTR4_MAXLINK: AttrDef(fattr4_maxlink, lambda e: MAX_LINK),
    FATTR4_MAXNAME: AttrDef(fattr4_maxname, lambda e: MAX_NAME),
    FATTR4_MAXREAD: AttrDef(fattr4_maxread, lambda e: MAX_IO),
    FATTR4_MAXWRITE: AttrDef(fattr4_maxwrite, lambda e: MAX_IO),
    FATTR4_MODE: AttrDef(fattr4_mode, lambda e: e.attr.mode & 0o7777, writable=True),
    FATTR4_NO_TRUNC: AttrDef(fattr4_no_trunc, lambda e: True),
    FATTR4_NUMLINKS: AttrDef(fattr4_numlinks, lambda e: e.attr.nlink),
    FATTR4_OWNER: AttrDef(fattr4_owner, lambda e: _idmap(e).owner(e.attr.uid), writable=True),
    FATTR4_OWNER_GROUP: AttrDef(fattr4_owner_group, lambda e: _idmap(e).group(e.attr.gid),
                                writable=True),
    FATTR4_RAWDEV: AttrDef(fattr4_rawdev, lambda e: specdata4(specdata1=e.attr.rdev[0],
                                                             specdata2=e.attr.rdev[1])),
    FATTR4_SPACE_AVAIL: AttrDef(fattr4_space_avail, lambda e: e.statfs().bytes_avail),
    FATTR4_SPACE_FREE: AttrDef(fattr4_space_free, lambda e: e.statfs().bytes_free),
    FATTR4_SPACE_TOTAL: AttrDef(fattr4_space_total, lambda e: e.statfs().bytes_total),
    FATTR4_SPACE_USED: AttrDef(fattr4_space_used, lambda e: e.attr.space_used),
    FATTR4_TIME_ACCESS: AttrDef(fattr4_time_access, lambda e: ns_to_time(e.attr.atime_ns)),
    FATTR4_TIME_ACCESS_SET: AttrDef(fattr4_time_access_set, None, writable=True),
    FATTR4_TIME_DELTA: AttrDef(fattr4_time_delta, lambda e: nfstime4(seconds=0, nseconds=1)),
    FATTR4_TIME_METADATA: AttrDef(fattr4_time_metadata, lambda e: ns_to_time(e.attr.ctime_ns)),
    FATTR4_TIME_MODIFY: AttrDef(fattr4_time_modify, lambda e: ns_to_time(e.attr.mtime_ns)),
    FATTR4_TIME_MODIFY_SET: AttrDef(fattr4_time_modify_set, None, writable=True),
    FATTR4_MOUNTED_ON_FILEID: AttrDef(fattr4_mounted_on_fileid, lambda e: e.mounted_on_fileid()),
    FATTR4_SUPPATTR_EXCLCREAT: AttrDef(fattr4_suppattr_exclcreat, lambda e: EXCLCREAT_BITMAP,
                                       since_minor=1),
    FATTR4_CLONE_BLKSIZE: AttrDef(fattr4_clone_blksize, lambda e: CLONE_BLKSIZE, since_minor=2),
    # RFC 8276: the upload-state xattrs (nfsd/ops/xattr.py) of files and directories
    FATTR4_XATTR_SUPPORT: AttrDef(fattr4_xattr_support, _xattr_support, since_minor=2),
}

# Per minor version: a client sees (in supported_attrs) and may use only the attributes
# its minor version defines. RFC 7530 5 lists the NFSv4.0 ones (0-55); an attribute a
# later minor version added is, to a 4.0 client, an attribute the server does not support
# (GETATTR leaves it out, SETATTR/VERIFY answer NFS4ERR_ATTRNOTSUPP), as knfsd does.
MINOR_VERSIONS = tuple(range(LATEST_MINOR + 1))
SUPPORTED_IN = {minor: frozenset(b for b, d in ATTRS.items() if d.since_minor <= minor)
                for minor in MINOR_VERSIONS}
SUPPORTED_BITMAPS = {minor: bitmap_of(sorted(bits)) for minor, bits in SUPPORTED_IN.items()}
SUPPORTED = SUPPORTED_IN[MINOR_VERSIONS[-1]]          # every attribute of the table


def unsupported(bitmap: list[int], minorversion: int) -> bool:
    """Whether the bitmap sets any attribute `minorversion` does not support (word masks,
    no expansion)."""
    supported = SUPPORTED_BITMAPS[minorversion]
    known = len(supported)
    for i, word in enumerate(bitmap):
        if word & ~(supported[i] if i < known else 0):
            return True
    return False


def supported_part(bitmap: list[int], minorversion: int) -> tuple[int, ...]:
    """The bitmap with only `minorversion`'s supported attributes left (trailing zero
    words dropped)."""
    words = [w & s for w, s in zip(bitmap, SUPPORTED_BITMAPS[minorversion])]
    while words and not words[-1]:
        words.pop()
    return tuple(words)

def known_bits(bitmap: list[int], minorversion: int) -> list[int]:
    """The attribute numbers of the bitmap that `minorversion` supports (the others,
    unknown to us, are ignored as RFC 7530 5 / RFC 8881 5 want), ascending."""
    return bits_of(list(supported_part(bitmap, minorversion)))


WRITABLE = frozenset(b for b, d in ATTRS.items() if d.writable)
WRITE_ONLY = frozenset(b for b, d in ATTRS.items() if d.get is None)
# EXCLUSIVE4_1 creates keep the verifier in the times (RFC 8881 18.16.3), so those
# cannot be set in the same request.
EXCLCREAT = frozenset({FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_SIZE})
EXCLCREAT_BITMAP = bitmap_of(sorted(EXCLCREAT))
WRITE_ONLY_BITMAP = bitmap_of(sorted(WRITE_ONLY))


def names_write_only(bitmap: list[int], minorversion: int) -> bool:
    """Whether the bitmap asks for a write-only attribute that `minorversion` supports
    (GETATTR's NFS4ERR_INVAL): `WRITE_ONLY & set(known_bits(...))` by word masks, a tenth
    of its cost on every GETATTR."""
    for word, supported, write_only in zip(bitmap, SUPPORTED_BITMAPS[minorversion],
                                           WRITE_ONLY_BITMAP):
        if word & supported & write_only:
            return True
    return False


# ---- encode -------------------------------------------------------------------------------------
_plans: dict[tuple, tuple] = {}
_MAX_PLANS = 256


def _plan(requested: list[int], minorversion: int) -> tuple:
    """(returned bitmap, [(pack, getter)]) for a request bitmap, computed once: READDIR
    encodes the same request for thousands of entries."""
    words = supported_part(requested, minorversion)   # unknown bits are left out: one plan
    key = (minorversion, words)
    plan = _plans.get(key)
    if plan is None:
        steps, returned = [], []
        for bit in bits_of(list(words)):
            d = ATTRS.get(bit)
            if d is None or d.get is None:
                continue
            steps.append((d.xdr.pack, d.get))
            returned.append(bit)
        plan = (bitmap_of(returned), tuple(steps))
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    return plan


# "native": nfsd/native/fattr.pyx writes the attrlist4 of the attributes it knows; a request
# naming any other (or a value it leaves to us) is encoded here, so the bytes are the same.
FATTR_ENGINE = native.engine("fattr")
_native_encode = None


def encode(env: AttrEnv, requested: list[int]):
    """fattr4 with every requested, supported, readable attribute (others left out)."""
    if FATTR_ENGINE == "native":
        got = (_native_encode or _load_native())(env, requested)
        if got is not None:
            return got
    return encode_python(env, requested)


def _load_native():
    """Made at first use, when the whole table (and every row added to it) exists."""
    global _native_encode
    from nfsd.exports import IdMapper
    from nfsd.native.fattr import Encoder
    _native_encode = Encoder(sys.modules[__name__], IdMapper).encode
    return _native_encode


def encode_python(env: AttrEnv, requested: list[int]):
    """The reference encoding (the specification the native one is held to)."""
    mask, steps = _plan(requested, env.minorversion)
    out = bytearray()
    for pack, get in steps:
        pack(get(env), out)
    return fattr4(attrmask=list(mask), attr_vals=bytes(out))


def encode_rdattr_error(status: int):
    out = bytearray()
    fattr4_rdattr_error.pack(status, out)
    return fattr4(attrmask=bitmap_of([FATTR4_RDATTR_ERROR]), attr_vals=bytes(out))


# ---- decode -------------------------------------------------------------------------------------
def decode(fattr, minorversion: int, *, allowed: frozenset = WRITABLE) -> dict[int, object]:
    """{attribute number: value} from a client's fattr4. Attributes `minorversion` does
    not support: NFS4ERR_ATTRNOTSUPP; supported but not in `allowed`: NFS4ERR_INVAL
    (read-only); malformed values: NFS4ERR_BADXDR."""
    if unsupported(fattr.attrmask, minorversion):
        raise NfsError(NFS4ERR_ATTRNOTSUPP, "an attribute in the mask is not supported")
    bits = bits_of(fattr.attrmask)
    for bit in bits:
        if bit not in allowed:
            raise NfsError(NFS4ERR_INVAL, f"attribute {bit} cannot be set")
    return decode_values(fattr, bits)


def decode_values(fattr, bits: list[int]) -> dict[int, object]:
    buf = memoryview(bytes(fattr.attr_vals))
    pos = 0
    values = {}
    try:
        for bit in bits:
            values[bit], pos = ATTRS[bit].xdr.unpack(buf, pos)
    except XdrError as e:
        raise NfsError(NFS4ERR_BADXDR, f"attribute {bit}: {e}") from None
    if pos != len(buf):
        raise NfsError(NFS4ERR_BADXDR, "trailing bytes after attributes")
    return values
