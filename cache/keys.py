"""The fixed-width big-endian packers of the index's keys (inode numbers, offsets, times):
big-endian so that LMDB's byte order is numeric order. Shared by the index and the tables
it writes (extents.py), which is why they live apart from both."""
from __future__ import annotations

import struct

U64 = struct.Struct(">Q")
U64x2 = struct.Struct(">QQ")
