"""Client records: the opaque stable storage nfsd keeps per NFS client owner (nfsd/grace.py)."""
from __future__ import annotations

import errno

import pytest

from cache.api import StoreError
from cache.store import Store


def test_records_are_kept_by_owner_across_reopen(store_dir):
    long_owner = b"o" * 1024            # an NFS owner may be longer than an LMDB key
    s = Store.open(store_dir)
    try:
        assert s.client_records() == {}
        s.put_client_record(b"a", b"\x01\x01")
        s.put_client_record(long_owner, b"\x01\x00")
        s.put_client_record(b"a", b"\x01\x02")             # replaces
        s.delete_client_record(b"missing")                  # nothing to delete: fine
        s.sync()
    finally:
        s.close()
    s = Store.open(store_dir)
    try:
        assert s.client_records() == {b"a": b"\x01\x02", long_owner: b"\x01\x00"}
        s.delete_client_record(b"a")
        assert s.client_records() == {long_owner: b"\x01\x00"}
    finally:
        s.close()


def test_record_size_is_bounded(store):
    with pytest.raises(StoreError) as e:
        store.put_client_record(b"o" * 1024, b"x" * Store.MAX_CLIENT_RECORD)
    assert e.value.errno == errno.ENAMETOOLONG
