"""The inode record codec (cache/index.py): every field survives pack/unpack, and records of
the older formats (shorter, as formats 1 and 2 wrote them) read with the later fields zero. The
decoder is positional for speed (issue 37), so a field order mistake must fail here."""
from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from cache.api import DataState, FileType
from cache.index import INODE_V1, INODE_V2, Inode

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-2**63, 2**63 - 1)

inodes = st.builds(
    Inode, type=st.sampled_from([int(t) for t in FileType]),
    state=st.sampled_from([int(s) for s in DataState]), flags=st.integers(0, 255), mode=U32,
    nlink=U32, uid=U32, gid=U32, size=U64, committed_size=U64, local_bytes=U64, atime_ns=I64,
    mtime_ns=I64, ctime_ns=I64, change=U64, parent=U64, gen=U32, next_cookie=U32, lru_ns=U64,
    ino=st.integers(1, 2**63), data_seq=U32, activity_ns=U64, rdev_major=U32, rdev_minor=U32)


@given(inodes)
def test_every_field_round_trips(rec):
    assert Inode.unpack(rec.ino, rec.pack()) == rec


@given(inodes)
def test_older_formats_read_with_the_later_fields_zero(rec):
    buf = rec.pack()
    v2 = Inode.unpack(rec.ino, buf[:INODE_V2.size])
    assert v2 == dataclasses.replace(rec, rdev_major=0, rdev_minor=0)
    v1 = Inode.unpack(rec.ino, buf[:INODE_V1.size])
    assert v1 == dataclasses.replace(rec, rdev_major=0, rdev_minor=0, activity_ns=0)


@given(inodes)
def test_attr_carries_the_enums(rec):
    attr = rec.attr()
    assert type(attr.type) is FileType and attr.type == rec.type
    assert type(attr.data_state) is DataState and attr.data_state == rec.state
    assert (attr.ino, attr.gen, attr.size, attr.data_seq, attr.rdev) == (
        rec.ino, rec.gen, rec.size, rec.data_seq, (rec.rdev_major, rec.rdev_minor))
