#!/usr/bin/env python3
"""Micro-benchmark of the XDR layer (not a test): encode/decode rates of two typical
COMPOUNDs -- a 1 MiB WRITE (SEQUENCE, PUTFH, WRITE, GETATTR) and a GETATTR
(SEQUENCE, PUTFH, GETATTR) with its reply -- plus the time to import the nfs4 module.

Then, when the generated Cython codecs are built (nfsd.native.xdr_nfs4, issue 37), the
reference and the native codec side by side on the same inputs, in µs per call: decode of a
lookup COMPOUND4args (SEQUENCE PUTFH LOOKUP GETFH GETATTR) and of a 256 KiB WRITE, encode of
their COMPOUND4res (the native results are checked against the reference's first).

    python3 bench/xdr_bench.py [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time


def rate(fn, seconds: float) -> float:
    """Calls per second of fn, measured for about `seconds`."""
    n, batch = 0, 1
    t0 = time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        n += batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed
        batch = min(batch * 2, 10_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()

    cmd = [sys.executable, "-c",
           "import time; t=time.perf_counter(); c=time.process_time(); import nfsd.xdr.nfs4; "
           "print(time.perf_counter()-t, time.process_time()-c)"]
    runs = sorted(tuple(map(float, subprocess.check_output(cmd).split())) for _ in range(3))
    wall, cpu = runs[1]
    print(f"import nfsd.xdr.nfs4 (parse + build RFC 7863): {wall * 1000:.0f} ms wall, "
          f"{cpu * 1000:.0f} ms CPU (median of 3)")

    from nfsd.xdr import decode, encode
    from nfsd.xdr import nfs4 as n

    seq = n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(b"s" * 16, 1, 0, 0, False))
    putfh = n.nfs_argop4(n.OP_PUTFH, n.PUTFH4args(b"\x01" * 40))
    getattr_op = n.nfs_argop4(n.OP_GETATTR, n.GETATTR4args([0x0010011a, 0x00b0a23a]))
    payload = b"\xab" * (1 << 20)
    write = n.COMPOUND4args(b"", 1, [seq, putfh, n.nfs_argop4(n.OP_WRITE, n.WRITE4args(
        n.stateid4(1, b"o" * 12), 0, n.UNSTABLE4, payload)), getattr_op])
    ga = n.COMPOUND4args(b"", 1, [seq, putfh, getattr_op])
    ga_res = n.COMPOUND4res(n.NFS4_OK, b"", [
        n.nfs_resop4(n.OP_SEQUENCE, n.SEQUENCE4res(n.NFS4_OK, n.SEQUENCE4resok(
            b"s" * 16, 1, 0, 63, 63, 0))),
        n.nfs_resop4(n.OP_PUTFH, n.PUTFH4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_GETATTR, n.GETATTR4res(n.NFS4_OK, n.GETATTR4resok(
            n.fattr4([0x0010011a, 0x00b0a23a], b"\0" * 160)))),
    ])
    cases = [("WRITE 1MiB args", n.COMPOUND4args, write),
             ("GETATTR args", n.COMPOUND4args, ga),
             ("GETATTR reply", n.COMPOUND4res, ga_res)]
    for label, t, v in cases:
        wire = encode(t, v)
        enc = rate(lambda: t.pack(v, bytearray()), a.seconds)
        dec = rate(lambda: decode(t, wire), a.seconds)
        print(f"{label:18s} {len(wire):8d} B   encode {enc:10,.0f}/s   decode {dec:10,.0f}/s")

    native_vs_reference(a.seconds)


def native_vs_reference(seconds: float) -> None:
    """µs per call of the reference codec and of nfsd.native.xdr_nfs4 on the same inputs."""
    from nfsd.xdr import nfs4 as n
    try:
        from nfsd.native import xdr_nfs4 as x
    except ImportError as e:
        print(f"native codec not built ({e}): pip install -e . (or setup.py build_ext --inplace)")
        return
    fh = b"\x01" * 40
    attrs = n.fattr4([0x0010011a, 0x00b0a23a], b"\0" * 160)
    seq = n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(b"s" * 16, 1, 0, 0, False))
    seq_res = n.nfs_resop4(n.OP_SEQUENCE, n.SEQUENCE4res(n.NFS4_OK, n.SEQUENCE4resok(
        b"s" * 16, 1, 0, 63, 63, 0)))
    getattr_op = n.nfs_argop4(n.OP_GETATTR, n.GETATTR4args([0x0010011a, 0x00b0a23a]))
    getattr_res = n.nfs_resop4(n.OP_GETATTR, n.GETATTR4res(n.NFS4_OK, n.GETATTR4resok(attrs)))
    lookup = n.COMPOUND4args(b"", 1, [
        seq, n.nfs_argop4(n.OP_PUTFH, n.PUTFH4args(fh)),
        n.nfs_argop4(n.OP_LOOKUP, n.LOOKUP4args(b"checkpoint-000123.pt")),
        n.nfs_argop4(n.OP_GETFH), getattr_op])
    lookup_res = n.COMPOUND4res(n.NFS4_OK, b"", [
        seq_res, n.nfs_resop4(n.OP_PUTFH, n.PUTFH4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_LOOKUP, n.LOOKUP4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_GETFH, n.GETFH4res(n.NFS4_OK, n.GETFH4resok(fh))), getattr_res])
    write = n.COMPOUND4args(b"", 1, [
        seq, n.nfs_argop4(n.OP_PUTFH, n.PUTFH4args(fh)),
        n.nfs_argop4(n.OP_WRITE, n.WRITE4args(n.stateid4(1, b"o" * 12), 0, n.UNSTABLE4,
                                               b"\xab" * (256 << 10))), getattr_op])
    write_res = n.COMPOUND4res(n.NFS4_OK, b"", [
        seq_res, n.nfs_resop4(n.OP_PUTFH, n.PUTFH4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_WRITE, n.WRITE4res(n.NFS4_OK, n.WRITE4resok(256 << 10, n.UNSTABLE4,
                                                                         b"v" * 8))),
        getattr_res])
    A, R = n.COMPOUND4args, n.COMPOUND4res
    rows = []
    for label, t, v in (("lookup args", A, lookup), ("WRITE 256KiB args", A, write)):
        wire = bytes(_ref_encode(t, v))
        mv = memoryview(wire)
        ref_v, _ = t.unpack(mv, 0)
        nat_v, end = x.decode_COMPOUND4args(wire)
        assert end == len(wire) and nat_v == ref_v == v
        rows.append((f"decode {label}", len(wire),
                     lambda t=t, wire=wire: t.unpack(memoryview(wire), 0),
                     lambda wire=wire: x.decode_COMPOUND4args(wire)))
    for label, t, v in (("lookup reply", R, lookup_res), ("WRITE reply", R, write_res)):
        wire = _ref_encode(t, v)
        out = bytearray()
        x.encode_COMPOUND4res(v, out)
        assert out == wire
        rows.append((f"encode {label}", len(wire), lambda t=t, v=v: t.pack(v, bytearray()),
                     lambda v=v: x.encode_COMPOUND4res(v, bytearray())))
    print(f"{'':26s} {'bytes':>8s} {'reference':>11s} {'native':>9s}  speed-up  (best of 3)")
    for label, size, ref, nat in rows:
        r_us = min(1e6 / rate(ref, seconds / 3) for _ in range(3))
        n_us = min(1e6 / rate(nat, seconds / 3) for _ in range(3))
        print(f"{label:26s} {size:8d} {r_us:9.2f}µs {n_us:7.2f}µs  {r_us / n_us:6.1f}x")


def _ref_encode(t, v) -> bytearray:
    out = bytearray()
    t.pack(v, out)
    return out


if __name__ == "__main__":
    main()
