"""One fattr4 encoding, reference (nfsd/attrs.py) against native (nfsd/native/fattr.pyx).

`python -m bench.fattr_encode [--number 20000]` encodes the attributes of one regular file for
the bitmaps real clients send on every GETATTR/LOOKUP/OPEN (the Linux client's
nfs4_fattr_bitmap; nfs-rs's stat, which also names acl and filehandle), and the mount-time
probe, with each engine, and prints the best of 7 rounds in µs per encoding (best-of: the
host is shared and noisy; both engines are measured the same way, interleaved).

`--stat-calls LOW,HIGH` instead counts, with callgrind (as bench/instructions.py does), the
instructions of `python -m nfsd` per nfs-rs `stat()` of an existing file: two COMPOUNDs
(SEQUENCE PUTFH LOOKUP GETFH GETATTR, then SEQUENCE PUTFH GETATTR), both reaching their GETATTR,
which bench.instructions' exists("none") pair never does (its LOOKUPs fail first). Run it in
two checkouts for an A/B.
"""
from __future__ import annotations

import argparse
import timeit

from cache.api import Attr, FileType
from nfsd import attrs
from nfsd.exports import Export, Exports
from nfsd.ops._common import Obj
from nfsd.xdr.nfs4 import (
    FATTR4_ACL, FATTR4_CHANGE, FATTR4_FILEHANDLE, FATTR4_FILEID, FATTR4_FSID, FATTR4_LEASE_TIME,
    FATTR4_MAXREAD, FATTR4_MAXWRITE, FATTR4_MODE, FATTR4_MOUNTED_ON_FILEID, FATTR4_NUMLINKS,
    FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_RAWDEV, FATTR4_SIZE, FATTR4_SPACE_USED,
    FATTR4_SUPPORTED_ATTRS, FATTR4_TIME_ACCESS, FATTR4_TIME_METADATA, FATTR4_TIME_MODIFY,
    FATTR4_TYPE,
)

BITMAPS = {
    "linux getattr": [FATTR4_TYPE, FATTR4_CHANGE, FATTR4_SIZE, FATTR4_FSID, FATTR4_FILEID,
                      FATTR4_MODE, FATTR4_NUMLINKS, FATTR4_OWNER, FATTR4_OWNER_GROUP,
                      FATTR4_RAWDEV, FATTR4_SPACE_USED, FATTR4_TIME_ACCESS,
                      FATTR4_TIME_METADATA, FATTR4_TIME_MODIFY, FATTR4_MOUNTED_ON_FILEID],
    "nfs-rs stat": [FATTR4_TYPE, FATTR4_SIZE, FATTR4_FSID, FATTR4_ACL, FATTR4_FILEHANDLE,
                    FATTR4_FILEID, FATTR4_MODE, FATTR4_NUMLINKS, FATTR4_OWNER,
                    FATTR4_OWNER_GROUP, FATTR4_RAWDEV, FATTR4_SPACE_USED, FATTR4_TIME_ACCESS,
                    FATTR4_TIME_METADATA, FATTR4_TIME_MODIFY],
    "mount probe": [FATTR4_SUPPORTED_ATTRS, FATTR4_LEASE_TIME, FATTR4_MAXREAD, FATTR4_MAXWRITE],
}


class _Server:
    lease_time = 90

    def __init__(self):
        self.exports = Exports([Export(1, "/checkpoints")])


class _Fh:
    raw = bytes(range(40))


def _env() -> attrs.AttrEnv:
    attr = Attr(ino=4242, gen=1, type=FileType.REG, mode=0o644, nlink=1, uid=1000, gid=1000,
                size=123_456_789, space_used=123_457_536, atime_ns=1_764_300_000_123_456_789,
                mtime_ns=1_764_300_000_223_456_789, ctime_ns=1_764_300_000_323_456_789,
                change=77, parent=0)
    exp = _Server().exports.exports[1]
    return attrs.AttrEnv(_Server(), Obj(_Fh(), exp, None, attr), 1)


def _stat_count(calls: int) -> int:
    """Instructions of one server run that answers `calls` nfs-rs stat()s (and the set-up)."""
    from bench.instructions import count_serving
    from testkit.nfsrs_support import connect, write_file

    def workload(port: int) -> None:
        c = connect(port)
        try:
            write_file(c, "f", b"x" * 100)
            for _ in range(calls):
                c.stat("f")
        finally:
            c.close()
    return count_serving(workload)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--stat-calls", help="LOW,HIGH: callgrind instructions per nfs-rs stat()")
    args = ap.parse_args()
    if args.stat_calls:
        low, high = (int(x) for x in args.stat_calls.split(","))
        per = (_stat_count(high) - _stat_count(low)) / (high - low)
        print(f"{per:,.0f} instructions per nfs-rs stat() (2 COMPOUNDs, 2 GETATTRs)")
        return 0
    from nfsd.exports import IdMapper
    from nfsd.native.fattr import Encoder
    native = Encoder(attrs, IdMapper).encode
    env = _env()
    for name, bits in BITMAPS.items():
        req = attrs.bitmap_of(sorted(bits))
        ref, nat = attrs.encode_python(env, req), native(env, req)
        assert nat is not None and (nat.attrmask, nat.attr_vals) == (ref.attrmask, ref.attr_vals)
        best = {"python": float("inf"), "native": float("inf")}
        for _ in range(7):
            for engine, fn in (("python", attrs.encode_python), ("native", native)):
                t = timeit.timeit(lambda: fn(env, req), number=args.number)
                best[engine] = min(best[engine], t / args.number * 1e6)
        print(f"{name:14s} ({len(ref.attr_vals):3d} bytes): python {best['python']:6.2f} µs, "
              f"native {best['native']:6.2f} µs, x{best['python'] / best['native']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
