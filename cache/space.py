"""Capacity, watermarks and the admission policy for new local bytes.

`used` = local bytes of all files, `dirty` = local bytes S3 lacks (both kept exact by the
index). Dirty data can only leave through the uploader, so a write that would push dirty
bytes past the capacity is refused with EAGAIN (nfsd: NFS4ERR_DELAY, the client retries);
clean data can always be evicted, so when only used bytes would overflow, the store
evicts clean files first. The disk itself running full is a different failure (ENOSPC),
raised where it happens (pwrite/ftruncate/LMDB) and never damages what is stored.
"""
from __future__ import annotations

import errno
import os

from .api import StoreError


class Space:
    def __init__(self, root: str, capacity: int | None, reserve: int,
                 high_watermark: float, low_watermark: float):
        if not 0 < low_watermark <= high_watermark <= 1:
            raise StoreError(errno.EINVAL, "watermarks need 0 < low <= high <= 1")
        self.root = root
        if capacity is None:
            st = os.statvfs(root)
            capacity = max(st.f_blocks * st.f_frsize - reserve, 0)
        if capacity <= 0:
            raise StoreError(errno.EINVAL, f"store capacity {capacity} must be positive "
                             "(is the reserve larger than the filesystem?)")
        self.capacity = capacity
        self.set_watermarks(high_watermark, low_watermark)
        # set once usage passed the high watermark, until it is down to the low one: a round
        # that found too little clean data (dirty files not uploaded yet) is finished later
        self._evicting = False

    def set_watermarks(self, high_watermark: float, low_watermark: float) -> None:
        """(Re)set the watermarks as fractions of the capacity (at open, and on a reload)."""
        if not 0 < low_watermark <= high_watermark <= 1:
            raise StoreError(errno.EINVAL, "watermarks need 0 < low <= high <= 1")
        self.high, self.low = int(self.capacity * high_watermark), int(self.capacity * low_watermark)

    def admit(self, used: int, dirty: int, growth: int) -> int:
        """Check `growth` new local bytes; returns how many clean bytes must be evicted
        first (0: none). Raises StoreError(EAGAIN) when dirty data would overflow."""
        if growth <= 0:
            return 0
        if dirty + growth > self.capacity:
            raise StoreError(errno.EAGAIN, f"dirty data would exceed capacity "
                             f"({dirty + growth} > {self.capacity}); retry after upload")
        return max(0, used + growth - self.capacity)

    def eviction_target(self, used: int) -> int:
        """Bytes to evict now: once above the high watermark, whatever is above the low one,
        round after round, until usage is down to it."""
        if used > self.high:
            self._evicting = True
        if self._evicting and used > self.low:
            return used - self.low
        self._evicting = False
        return 0

    def disk_free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize
