"""Differential tests of the native fattr4 encoder (nfsd/native/fattr.pyx, issue 37 point 3)
against the reference in nfsd/attrs.py, which is the specification.

Hypothesis draws attribute records (every file type and invalid ones, sizes and ids at and past
their XDR bounds, times at the edges of int64 and of a second, rdev of every shape), exports and
file handles, idmaps with and without names, statfs figures, rdattr_error values, minor versions
and request bitmaps (every subset of the table, write-only and unknown bits, long bitmaps), and
demands the same fattr4 bytes or the same exception from `attrs.encode` on the native engine and
`attrs.encode_python`. Separate tests pin that the native encoder really does the common
requests itself (the differential test alone would pass if it always fell back) and that it falls
back for rows it does not know.

CKPTGW_LONG=1 runs many more examples.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache.api import Attr, FileType
from nfsd import attrs, native
from nfsd.exports import IdMapper
from nfsd.xdr.nfs4 import (
    FATTR4_CHANGE, FATTR4_FILEID, FATTR4_FSID, FATTR4_MODE, FATTR4_MOUNTED_ON_FILEID,
    FATTR4_NUMLINKS, FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_RAWDEV, FATTR4_SIZE,
    FATTR4_SPACE_USED, FATTR4_SUPPORTED_ATTRS, FATTR4_TIME_ACCESS, FATTR4_TIME_METADATA,
    FATTR4_TIME_MODIFY, FATTR4_TYPE, NFS4ERR_NOENT, NFS4ERR_STALE, NFS4_OK,
)

if native.engine("fattr") != "native":       # CKPTGW_ENGINE=native makes a missing build fail
    pytest.skip("nfsd.native.fattr is not built (pip install -e . / setup.py build_ext)",
                allow_module_level=True)

from nfsd.native.fattr import Encoder  # noqa: E402

LONG = os.environ.get("CKPTGW_LONG") == "1"
EXAMPLES = 3000 if LONG else 300

# What the Linux client asks on every GETATTR/LOOKUP/OPEN (nfs4_fattr_bitmap, fs/nfs/nfs4proc.c)
LINUX_GETATTR = attrs.bitmap_of([
    FATTR4_TYPE, FATTR4_CHANGE, FATTR4_SIZE, FATTR4_FSID, FATTR4_FILEID, FATTR4_MODE,
    FATTR4_NUMLINKS, FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_RAWDEV, FATTR4_SPACE_USED,
    FATTR4_TIME_ACCESS, FATTR4_TIME_METADATA, FATTR4_TIME_MODIFY, FATTR4_MOUNTED_ON_FILEID])


# --- the objects an AttrEnv reads ----------------------------------------------------------------
@dataclass
class FakeExport:
    export_id: int
    mount_fileid: int
    root_ino: int

    def __bool__(self):        # AttrEnv.fsid tests `if exp`: the reference's truthiness counts
        return self.export_id != -7


@dataclass
class FakeFh:
    raw: object


@dataclass
class FakeObj:
    fh: FakeFh
    export: FakeExport | None
    attr: Attr


@dataclass
class FakeStatfs:
    files_avail: int
    files_free: int
    files_total: int
    bytes_avail: int
    bytes_free: int
    bytes_total: int


class FakeStore:
    def __init__(self, statfs, fail):
        self._statfs, self._fail = statfs, fail

    def statfs(self):
        if self._fail:
            raise OSError("statfs failed")
        return self._statfs


class NamedIdMapper:
    """An idmap of another class (a test fake, a future LDAP one): asked through its methods."""

    def __init__(self, names):
        self.names = names

    def owner(self, uid):
        return self.names.get(uid, str(uid).encode())

    def group(self, gid):
        return self.names.get(gid, str(gid).encode())


@dataclass
class FakeExports:
    idmap: object


@dataclass
class FakeServer:
    exports: FakeExports
    lease_time: object
    store: FakeStore


# --- strategies ----------------------------------------------------------------------------------
EDGES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1,
         -2**63, -2**63 - 1, 2**100]
# Mostly in range (the native path), often at or past a bound (the reference's errors and the
# native encoder's fall-backs).
ints = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 1000),
                 st.integers(0, 1000), st.sampled_from(EDGES), st.integers(-2**70, 2**70))
small = st.one_of(st.integers(0, 70000), st.integers(0, 70000), st.sampled_from(EDGES))
NS = 10**9
times = st.one_of(st.sampled_from([0, -1, NS - 1, NS, -NS, -NS - 1, 2**63 - 1, -2**63, 2**63,
                                   -2**63 - 1, 2**70]),
                  st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1),
                  st.integers(-2**64, 2**64))
file_types = st.one_of(st.sampled_from(list(FileType)), st.sampled_from(list(FileType)),
                       st.integers(1, 9), st.sampled_from([0, 10, -1, 2**40]))
rdevs = st.one_of(st.tuples(small, small), st.just((0, 0)),
                  st.lists(small, min_size=2, max_size=2), st.tuples(small))
mode_values = st.one_of(st.integers(0, 0o7777), st.integers(-2**65, 2**65))
not_ints = st.sampled_from([None, 1.0, "7", b"7"])


@st.composite
def records(draw):
    def maybe_bad(strategy):
        return draw(st.one_of(strategy, not_ints) if draw(st.integers(0, 30)) == 0 else strategy)

    return Attr(ino=maybe_bad(ints), gen=0, type=maybe_bad(file_types), mode=maybe_bad(mode_values),
                nlink=maybe_bad(small), uid=maybe_bad(small), gid=maybe_bad(small),
                size=maybe_bad(ints), space_used=maybe_bad(ints), atime_ns=maybe_bad(times),
                mtime_ns=maybe_bad(times), ctime_ns=maybe_bad(times), change=maybe_bad(ints),
                parent=0, rdev=draw(rdevs))


@st.composite
def envs(draw):
    attr = draw(records())
    export = draw(st.one_of(
        st.none(),
        st.builds(FakeExport, export_id=st.one_of(small, st.just(-7)),
                  mount_fileid=st.one_of(st.just(0), ints),
                  root_ino=st.one_of(st.just(attr.ino), ints))))
    raw = draw(st.one_of(st.binary(max_size=130), st.just(b"\x01" * 128), not_ints))
    idmap = draw(st.one_of(
        st.just(IdMapper()),
        st.just(IdMapper(domain="example.org", reply_names=True)),   # root: root@example.org
        st.just(IdMapper(domain="example.org", reply_names=False)),
        st.builds(NamedIdMapper, st.dictionaries(small, st.one_of(st.binary(max_size=600),
                                                                  st.just("text")),
                                                 max_size=3)),
    ))
    statfs = FakeStatfs(*(draw(ints) for _ in range(6)))
    server = FakeServer(FakeExports(idmap), draw(st.one_of(st.just(90), st.just(90.5), small)),
                        FakeStore(statfs, draw(st.integers(0, 20)) == 0))
    minor = draw(st.sampled_from([0, 1, 1, 2, 2, 2, 2, 2, 3]))
    rdattr_error = draw(st.sampled_from([NFS4_OK] * 6 + [NFS4ERR_NOENT, NFS4ERR_STALE, 99999,
                                                     True]))
    return server, FakeObj(FakeFh(raw), export, attr), minor, rdattr_error


every_bit = sorted(attrs.ATTRS)
requests = st.one_of(
    st.just(LINUX_GETATTR),
    st.lists(st.sampled_from(every_bit), max_size=12).map(lambda bits: attrs.bitmap_of(sorted(bits))),
    st.lists(st.integers(0, 2**32 - 1), max_size=4),
    st.lists(st.integers(0, 2**32 - 1), min_size=5, max_size=64),
    st.just([2**32 - 1] * 3),
)


def outcome(encode, env_args, requested):
    server, obj, minor, rdattr_error = env_args
    env = attrs.AttrEnv(server, obj, minor, rdattr_error=rdattr_error)
    try:
        got = encode(env, requested)
    except Exception as e:  # noqa: BLE001 - the comparison is the point
        return ("raised", type(e), str(e))
    return ("ok", type(got), got.attrmask, bytes(got.attr_vals))


@pytest.fixture(scope="module")
def encoder():
    return Encoder(attrs, IdMapper)


def native_then_reference(encoder):
    def encode(env, requested):
        got = encoder.encode(env, requested)
        return got if got is not None else attrs.encode_python(env, requested)
    return encode


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(env_args=envs(), requested=requests)
def test_native_is_the_reference(encoder, env_args, requested):
    assert (outcome(native_then_reference(encoder), env_args, requested)
            == outcome(attrs.encode_python, env_args, requested))


def test_attrs_encode_uses_the_native_engine():
    assert attrs.FATTR_ENGINE == "native"


def plain_env(minor=1, idmap=None, export=FakeExport(1, 0, 2)):
    attr = Attr(ino=5, gen=1, type=FileType.REG, mode=0o644, nlink=1, uid=1000, gid=100,
                size=123, space_used=4096, atime_ns=1_700_000_000_123_456_789,
                mtime_ns=1_700_000_000_000_000_001, ctime_ns=-1, change=42, parent=0)
    server = FakeServer(FakeExports(idmap or IdMapper()), 90,
                        FakeStore(FakeStatfs(1, 2, 3, 4, 5, 6), False))
    return attrs.AttrEnv(server, FakeObj(FakeFh(b"\x07" * 40), export, attr), minor)


@pytest.mark.parametrize("minor", [0, 1, 2])
def test_common_requests_are_native(encoder, minor):
    """Every readable attribute of the table today, and the Linux client's GETATTR, are written
    natively (not left to the reference), with the reference's bytes."""
    readable = sorted(b for b in attrs.SUPPORTED_IN[minor] - attrs.WRITE_ONLY
                      if b in encoder.covered)
    for requested in (LINUX_GETATTR, attrs.bitmap_of(readable), [1 << FATTR4_SUPPORTED_ATTRS]):
        env = plain_env(minor)
        got = encoder.encode(env, requested)
        assert got is not None, requested
        want = attrs.encode_python(plain_env(minor), requested)
        assert (got.attrmask, got.attr_vals) == (want.attrmask, want.attr_vals)


def test_covers_what_clients_ask_every_time(encoder):
    assert set(attrs.bits_of(LINUX_GETATTR)) <= encoder.covered
    # of today's table, only rows added after the native encoder are left to the reference
    readable = {b for b, d in attrs.ATTRS.items() if d.get is not None}
    assert readable - encoder.covered <= {82}         # FATTR4_XATTR_SUPPORT (RFC 8276)


def test_idmap_with_names_is_asked_each_time(encoder):
    names = NamedIdMapper({1000: b"alice@example.org"})
    env = plain_env(idmap=names)
    got = encoder.encode(env, attrs.bitmap_of([FATTR4_OWNER, FATTR4_OWNER_GROUP]))
    assert got.attr_vals == b"\0\0\0\x11alice@example.org\0\0\0" + b"\0\0\0\x03100\0"
    names.names[1000] = b"bob"                  # renamed: no stale cache
    got = encoder.encode(plain_env(idmap=names), attrs.bitmap_of([FATTR4_OWNER]))
    assert got.attr_vals == b"\0\0\0\x03bob\0"


def test_an_unknown_row_falls_back(monkeypatch):
    """A row the native encoder was not written against (new, or a getter rewritten) is the
    reference's: a request naming it falls back, the others stay native."""
    monkeypatch.setitem(attrs.ATTRS, FATTR4_SIZE,
                        attrs.AttrDef(attrs.fattr4_size, lambda e: e.attr.size + 1, writable=True))
    encoder = Encoder(attrs, IdMapper)
    assert FATTR4_SIZE not in encoder.covered
    assert encoder.encode(plain_env(), attrs.bitmap_of([FATTR4_SIZE])) is None
    assert encoder.encode(plain_env(), attrs.bitmap_of([FATTR4_MODE])) is not None


def test_another_env_class_falls_back(encoder):
    class OtherEnv(attrs.AttrEnv):
        pass
    env = plain_env()
    other = OtherEnv(env.server, env.obj, env.minorversion)
    assert encoder.encode(other, LINUX_GETATTR) is None


@settings(max_examples=EXAMPLES, deadline=None)
@given(requested=requests, minor=st.sampled_from([0, 1, 2]))
def test_names_write_only_is_the_bit_expansion(requested, minor):
    """GETATTR's write-only check by word masks is the expansion it replaced."""
    expanded = bool(set(attrs.known_bits(requested, minor)) & attrs.WRITE_ONLY)
    assert attrs.names_write_only(requested, minor) is expanded
