"""Answers of read-only index lookups, valid until the next index commit.

A compound resolves its current file handle once per op (PUTFH, then GETATTR, LOOKUP, ...),
and every resolve was a read txn and an LMDB get: about 35 of the 58 inode reads of one
small-file save, each 12-15 us on the event loop with a GIL release around it. Between two
commits the index cannot change, so an answer read at commit id T is the answer for as long
as `Index.txnid` is still T.

Why a hit is never stale: an entry is tagged with the txnid read *before* its read txn began,
so its data is at least as new as its tag, and a hit needs tag == the current txnid. The only
window is between an LMDB commit and the committer's `txnid` update that follows it in the
same thread (Index.write); no reply that depends on that commit is sent before the update,
so a hit there answers as a read taken just before the commit would have.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol


class _Committed(Protocol):
    txnid: int          # Index.txnid: the newest commit that wrote pages

MAX_ENTRIES = 4096      # one commit interval's working set; past it, answers are just not kept


class ReadCache:
    __slots__ = ("_index", "_tagged")

    def __init__(self, index: _Committed):
        self._index = index
        # (txnid, answers): replaced as a whole when the txnid moves, so a thread holding an
        # older pair only ever fills a dict nobody will hit
        self._tagged: tuple[int, dict[Hashable, Any]] = (-1, {})

    def get(self, key: Hashable, read: Callable[..., Any], *args) -> Any:
        """The cached answer for `key`, or `read(*args)` (which may raise: nothing is kept)."""
        txnid = self._index.txnid
        tag, answers = self._tagged
        if tag == txnid:
            hit = answers.get(key)
            if hit is not None:
                return hit
        else:
            answers = {}
            self._tagged = (txnid, answers)
        value = read(*args)
        if len(answers) < MAX_ENTRIES:
            answers[key] = value
        return value
