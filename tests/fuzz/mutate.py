"""Byte-level mutation of RPC records (deterministic given a random.Random).

Records are the unit: `split_records` cuts a captured client stream at its record marks;
`mutate` returns one new byte string to send, made by bit flips, truncation, length-field
inflation (a 4-byte aligned word rewritten to a huge or off-by-some value: XDR lengths
and counts are such words), splices of two records, duplicated or dropped ranges and
record-mark damage (a mark announcing much more, or a non-last fragment).
"""
from __future__ import annotations

import random
import struct

LAST = 0x80000000
_INFLATE = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x10000000, 0x00FFFFFF, 0x10000, 1025, 257, 129)


def split_records(stream: bytes) -> list[bytes]:
    """Record bodies (marks removed; single-fragment records assumed, as clients send)."""
    out, pos = [], 0
    while pos + 4 <= len(stream):
        (mark,) = struct.unpack_from(">I", stream, pos)
        n = mark & 0x7FFFFFFF
        out.append(stream[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def frame(body: bytes) -> bytes:
    return struct.pack(">I", LAST | len(body)) + body


def _bitflips(rng, b: bytearray) -> None:
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)


def _inflate(rng, b: bytearray) -> None:
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(0, max(1, len(b) - 3), 4) if len(b) >= 4 else 0
        if len(b) < 4:
            return
        (old,) = struct.unpack_from(">I", b, i)
        new = rng.choice(_INFLATE) if rng.random() < 0.7 else (old + rng.randint(-4, 64)) & 0xFFFFFFFF
        struct.pack_into(">I", b, i, new)


def mutate(rng: random.Random, base: bytes, pool: list[bytes]) -> bytes:
    """One mutated input: `base` framed, damaged (splices take from `pool`)."""
    records = pool or [base]
    body = bytearray(base)
    how = rng.randrange(9)
    if how == 0 and body:
        _bitflips(rng, body)
    elif how == 1 and body:
        del body[rng.randrange(len(body)):]                         # truncate
    elif how in (2, 3):
        _inflate(rng, body)
    elif how == 4:                                                  # splice two records
        other = rng.choice(records)
        body = body[:rng.randint(0, len(body))] + other[rng.randint(0, len(other)):]
    elif how == 5 and body:                                         # duplicate a range
        i = rng.randrange(len(body))
        j = min(len(body), i + rng.randint(1, 64))
        body[i:i] = body[i:j] * rng.randint(1, 4)
    elif how == 6 and body:                                         # drop a range
        i = rng.randrange(len(body))
        del body[i:i + rng.randint(1, 64)]
    elif how == 7:                                                  # mark announces more
        return struct.pack(">I", LAST | min(0x7FFFFFFF, len(body) + rng.choice((1, 4, 4096, 1 << 20, 1 << 30)))) + bytes(body)
    elif how == 8:                                                  # split into fragments
        if len(body) > 1:
            k = rng.randrange(1, len(body))
            return struct.pack(">I", k) + bytes(body[:k]) + frame(bytes(body[k:]))
    return frame(bytes(body))
