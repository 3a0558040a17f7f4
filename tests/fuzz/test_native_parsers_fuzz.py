"""Byte-level fuzzing of the native parsers of client bytes other than the RPC layer (issue 37
point 6): the generated XDR codec (nfsd/native/xdr_nfs4.pyx) and the COMPOUND loop's header
and op scan (nfsd/native/compound.pyx), each against its reference.

Targets (`--target`):

  xdr       a type (nfs_argop4 half the time, COMPOUND4args or any other of the codec's 400+
            types otherwise) and a valid encoding of a random value of it (the reference
            encodes it), damaged by tests/fuzz/mutate.py and by `_damage` below (bit flips,
            truncation, a length or count word set to 0, 1, 2^31, 2^32-1, the bytes left +-
            a few, splices, dropped and duplicated ranges), decoded by nfsd.native.xdr_nfs4
            at offset 0 or after a prefix, from bytes, bytearray or memoryview. The decode
            must give a value or XdrError, never anything else; every 4th input is also
            decoded by the reference and must give the same value and end, or the same
            XdrError (type, offset, message).
  compound  whole COMPOUND4args bodies (recorded nfs-rs calls, generated ones of random ops,
            minor versions 0-3, a SEQUENCE of the test session first or not) damaged the
            same way and at the header (tag length, minor version, op count, op numbers);
            nfsd.native.compound.decode_compound must give the reference's result or its
            GarbageArgs; every 16th input also goes through both run_compound loops against
            the fake server of tests/nfsd/test_compound_native.py (same reply bytes, same
            outcome, same slot state).

The point of the run is memory safety: tests/fuzz/asan.sh runs this module with the extensions
built under AddressSanitizer (`asan.sh xdr`, `asan.sh compound`). Under pytest a short
non-ASan run of each target (CKPTGW_NATIVE_FUZZ_INPUTS, default 3000; CKPTGW_LONG=1: a
million). Findings are written to $CKPTGW_FUZZ_CRASH_DIR (default: the test's tmp dir).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from nfsd import native
from nfsd.xdr import nfs4, rpc
from nfsd.xdr.core import XdrError
from tests.fuzz.mutate import mutate, split_records

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "corpus").glob("*.bin"))
LONG = os.environ.get("CKPTGW_LONG") == "1"
INPUTS = int(os.environ.get("CKPTGW_NATIVE_FUZZ_INPUTS", 1_000_000 if LONG else 3000))
TARGETS = ("xdr", "compound")
_U32 = struct.Struct(">I")


def _native_xdr():
    if native.engine("xdr_nfs4") != "native":
        return None
    from nfsd.native import xdr_nfs4
    return xdr_nfs4


def _native_compound():
    if native.engine("compound") != "native":
        return None
    from nfsd.native import compound
    return compound


# --- values of the declared types (the seeds: valid encodings) --------------------------------

_EDGE_LENGTHS = (0, 1, 3, 4, 5, 16, 127, 128, 255, 256, 1024)


def random_value(t, rng: random.Random, depth: int = 0, max_items: int = 4, max_bytes: int = 40):
    """A well-typed value of the reference type object `t` (sizes capped; past the caps is the
    mutator's job). The same attributes tests/fuzz/xdr_strategies.py reads, without hypothesis
    (a million seeds must be cheap)."""
    kind = t.xdr_kind
    leaf = depth >= 5
    if kind == "int":
        r = rng.random()
        if r < 0.5:
            return rng.randint(max(t.lo, 0), min(t.hi, 16))
        if r < 0.7:
            return rng.choice((t.lo, t.hi, max(t.lo, 0), min(t.hi, 2**31 - 1)))
        return rng.randint(t.lo, t.hi)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "enum":
        return rng.choice(t.sorted_values) if hasattr(t, "sorted_values") else rng.choice(sorted(t.values))
    if kind == "fopaque":
        return rng.randbytes(t.size)
    if kind in ("vopaque", "string"):
        n = min(t.maxlen, rng.choice(_EDGE_LENGTHS) if rng.random() < 0.2 else rng.randint(0, max_bytes))
        return rng.randbytes(n)
    if kind == "farray":
        return [random_value(t.elem, rng, depth + 1) for _ in range(t.size)]
    if kind == "varray":
        n = 0 if leaf else rng.randint(0, min(t.maxlen, max_items))
        return [random_value(t.elem, rng, depth + 1) for _ in range(n)]
    if kind == "optional":
        return None if leaf or rng.random() < 0.4 else random_value(t.elem, rng, depth + 1)
    if kind == "struct":
        fields = list(t.xdr_fields)
        if t.xdr_linked:
            head = t(*[random_value(ft, rng, depth + 1) for _n, ft in fields[:-1]], None)
            node = head
            for _ in range(0 if leaf else rng.randint(0, 3)):
                nxt = t(*[random_value(ft, rng, depth + 1) for _n, ft in fields[:-1]], None)
                setattr(node, t.xdr_linked, nxt)
                node = nxt
            return head
        return t(*[random_value(ft, rng, depth + 1) for _n, ft in fields])
    if kind == "union":
        arms = _arms(t)
        tag, at = rng.choice(arms)
        return t(tag, None if at is None else random_value(at, rng, depth + 1))
    raise TypeError(f"no value for {t!r}")


_ARMS: dict[int, list] = {}


def _arms(t) -> list:
    """[(tag, arm type)] of a union: its declared arms and, with a default, one other tag."""
    arms = _ARMS.get(id(t))
    if arms is None:
        disc = t.xdr_disc
        arms = [(bool(tag) if disc.xdr_kind == "bool" else tag, at)
                for tag, (_a, at) in sorted(t.xdr_arms.items(), key=lambda kv: int(kv[0]))]
        if isinstance(t.xdr_default, tuple):
            if disc.xdr_kind == "enum":
                others = sorted(disc.values - set(t.xdr_arms))
                if others:
                    arms.append((others[0], t.xdr_default[1]))
            elif disc.xdr_kind == "int":
                tag = next(v for v in (7777, 0, 1, 2, 3) if v not in t.xdr_arms)
                arms.append((tag, t.xdr_default[1]))
        _ARMS[id(t)] = arms
    return arms


def encoding(t, rng: random.Random) -> bytes:
    out = bytearray()
    t.pack(random_value(t, rng), out)
    return bytes(out)


# --- damage ----------------------------------------------------------------------------------

_WORDS = (0, 1, 2, 3, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0x10000, 1025, 257, 65, 64, 17)


def _damage(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """One to three damages of `data`: tests/fuzz/mutate.py's (its record mark dropped, so a
    'split fragment' leaves a mark inside the bytes), or a word set to a boundary value or to
    the bytes left after it +- a few (what a length or count must be checked against)."""
    b = bytes(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        how = rng.random()
        if how < 0.45:
            b = mutate(rng, b, pool)[4:]
        elif len(b) >= 4:
            ba = bytearray(b)
            i = rng.randrange(0, len(ba) - 3, 4) if rng.random() < 0.8 else rng.randrange(len(ba) - 3)
            if how < 0.75:
                word = rng.choice(_WORDS)
            else:
                word = (len(ba) - i - 4 + rng.randint(-5, 5)) & 0xFFFFFFFF
                if rng.random() < 0.3:
                    word = (word + 3) // 4 & 0xFFFFFFFF       # as a count of 4-byte items
            _U32.pack_into(ba, i, word)
            if rng.random() < 0.15:
                del ba[rng.randrange(len(ba) + 1):]
            b = bytes(ba)
    return b


def _container(rng: random.Random, data: bytes):
    r = rng.random()
    if r < 0.6:
        return data
    if r < 0.85:
        return bytearray(data)
    return memoryview(bytearray(data))


# --- the xdr target ----------------------------------------------------------------------------

def _corpus_bodies() -> list[tuple[bytes, int]]:
    """(record body, offset of its COMPOUND4args) of every recorded call."""
    out = []
    for path in CORPUS:
        for body in split_records(path.read_bytes()):
            try:
                _msg, pos = rpc.rpc_msg.unpack(memoryview(body), 0)
            except XdrError:
                continue
            out.append((body, pos))
    return out


def _same(a, b) -> bool:
    from tests.nfsd.test_xdr_native import same
    return same(a, b)


def _decode(fn, t, data, pos):
    try:
        v, p = fn(t, data, pos)
    except XdrError as e:
        return ("XdrError", e.type_name, e.pos, str(e))
    return ("ok", v, p)


class XdrTarget:
    name = "xdr"

    def __init__(self, rng: random.Random):
        self.xn = _native_xdr()
        self.types = list(self.xn.types())
        self.argop = nfs4.nfs_argop4
        self.compound = nfs4.COMPOUND4args
        self.corpus = _corpus_bodies()
        self.pool = [b[p:] for b, p in self.corpus]
        self.seeds: dict[int, list[bytes]] = {}
        self.rng = rng

    def _seed(self, t) -> bytes:
        """A valid encoding of t: one of up to 64 kept per type, new ones now and then."""
        kept = self.seeds.setdefault(id(t), [])
        if len(kept) < 64 or self.rng.random() < 0.02:
            try:
                enc = encoding(t, self.rng)
            except (XdrError, RecursionError):
                enc = None
            if enc is not None:
                if len(kept) < 64:
                    kept.append(enc)
                else:
                    kept[self.rng.randrange(64)] = enc
                if len(self.pool) < 4096:
                    self.pool.append(enc)
                return enc
        return self.rng.choice(kept) if kept else b""

    def one(self, i: int):
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            t = self.argop
            data = self._seed(t)
        elif r < 0.65:
            t = self.compound
            if rng.random() < 0.5 and self.corpus:
                body, pos = rng.choice(self.corpus)
                data = body[pos:]
            else:
                ops = [random_value(self.argop, rng) for _ in range(rng.randint(0, 4))]
                out = bytearray()
                try:
                    self.compound.pack(self.compound(rng.randbytes(rng.choice((0, 3, 8))),
                                                     rng.randint(0, 2), ops), out)
                except XdrError:
                    out = bytearray(b"\0\0\0\0\0\0\0\1\0\0\0\0")
                data = bytes(out)
        else:
            t = rng.choice(self.types)
            data = self._seed(t)
        data = _damage(rng, data, self.pool) if rng.random() < 0.9 else data
        pos = 0
        if rng.random() < 0.2:
            pre = rng.randint(1, 9)
            data, pos = rng.randbytes(pre) + data, pre
        buf = _container(rng, data)
        got = _decode(self.xn.decode, t, buf, pos)       # raises only on a finding
        if i % 4 == 0:
            ref = _decode(lambda t, d, p: t.unpack(memoryview(d), p), t, data, pos)
            if ref[0] == "ok" and got[0] == "ok":
                if not (_same(ref[1], got[1]) and ref[2] == got[2]):
                    return t, data, f"mismatch: reference {ref!r:.300} native {got!r:.300}"
            elif ref != got:
                return t, data, f"mismatch: reference {ref!r:.300} native {got!r:.300}"
        return None


# --- the compound target -----------------------------------------------------------------------

def _compound_bytes(rng: random.Random, argop, seq_ops) -> bytes:
    minor = rng.choice((0, 1, 1, 1, 2, 2, 3))
    ops = [random_value(argop, rng) for _ in range(rng.choice((0, 1, 1, 2, 3, 5, 8)))]
    if minor >= 1 and rng.random() < 0.7:
        ops.insert(0, rng.choice(seq_ops))
    out = bytearray()
    nfs4.COMPOUND4args.pack(nfs4.COMPOUND4args(rng.randbytes(rng.choice((0, 1, 4, 9))), minor, ops), out)
    return bytes(out)


def _header_damage(rng: random.Random, data: bytes) -> bytes:
    """A COMPOUND header word rewritten: tag length, minor version, op count or an op number."""
    b = bytearray(data)
    if len(b) < 4:
        return data
    taglen = _U32.unpack_from(b, 0)[0]
    at = 4 + taglen + (-taglen % 4)
    which = rng.randrange(4)
    if which == 0:
        _U32.pack_into(b, 0, rng.choice(_WORDS + (len(b), len(b) - 4, len(b) - 8)) & 0xFFFFFFFF)
    elif which == 1 and at + 4 <= len(b):
        _U32.pack_into(b, at, rng.choice((0, 1, 2, 3, 4, 0x7FFFFFFF, 0xFFFFFFFF)))
    elif which == 2 and at + 8 <= len(b):
        _U32.pack_into(b, at + 4, rng.choice((0, 1, 2, 4095, 4096, 4097, 0x7FFFFFFF, 0xFFFFFFFF,
                                              (len(b) - at - 8) // 4)))
    elif at + 12 <= len(b):
        _U32.pack_into(b, at + 8, rng.choice((0, 1, 2, 3, 53, 75, 76, 77, 127, 128, 10044, 0xFFFFFFFF)))
    return bytes(b)


class CompoundTarget:
    name = "compound"

    def __init__(self, rng: random.Random):
        from nfsd import compound as ref
        self.ref = ref
        self.nat = _native_compound()
        self.rng = rng
        self.argop = nfs4.nfs_argop4
        self.corpus = [body[pos:] for body, pos in _corpus_bodies()]
        from tests.nfsd import test_compound_native as tc
        self.tc = tc
        self.seq_ops = [tc.nfs_argop4(tc.OP_SEQUENCE, tc.SEQUENCE4args(
            sa_sessionid=sid, sa_sequenceid=seqid, sa_slotid=slot, sa_highest_slotid=2,
            sa_cachethis=cache)) for sid in (tc.SESSIONID, tc.SESSIONID, b"x" * 16)
            for seqid in (0, 1, 2) for slot in (0, 1, 5) for cache in (False, True)]
        self.pool = list(self.corpus)
        self.made: list[bytes] = []
        self.loop = asyncio.new_event_loop()

    def _decode(self, fn, buf):
        try:
            a = fn(buf)
        except self.ref.GarbageArgs as exc:
            return ("garbage", str(exc))
        return ("ok", bytes(a.tag), a.minorversion, a.ops, a.illegal_opnum)

    def one(self, i: int):
        rng = self.rng
        if rng.random() < 0.3 and self.corpus:
            data = rng.choice(self.corpus)
        elif len(self.made) < 512 or rng.random() < 0.05:      # new seeds now and then
            data = _compound_bytes(rng, self.argop, self.seq_ops)
            if len(self.made) < 512:
                self.made.append(data)
            else:
                self.made[rng.randrange(512)] = data
            if len(self.pool) < 4096:
                self.pool.append(data)
        else:
            data = rng.choice(self.made)
        r = rng.random()
        if r < 0.3:
            data = _header_damage(rng, data)
        if r > 0.2:
            data = _damage(rng, data, self.pool)
        buf = memoryview(bytearray(data)) if rng.random() < 0.7 else _container(rng, data)
        got = self._decode(self.nat.decode_compound, buf)
        ref = self._decode(self.ref.decode_compound, memoryview(data))
        if ref[0] != "ok" or got[0] != "ok":
            differ = ref != got
        else:
            differ = ref[1:3] != got[1:3] or ref[4] != got[4] or len(ref[3]) != len(got[3]) \
                or not all(_same(a, b) for a, b in zip(ref[3], got[3]))
        if differ:
            return None, data, f"decode mismatch: reference {ref!r:.300} native {got!r:.300}"
        if i % 16 == 0:
            tc = self.tc
            script = {num: rng.choice(tc.BEHAVIOURS) for num in tc.SCRIPTED}
            config = (rng.choice((300, 2_000, 70_000, 1 << 20)), rng.choice((0, 200, 600, 4096)),
                      rng.randint(1, 8), rng.random() < 0.5, rng.random() < 0.5, 0)
            requests = [data] + ([data] if rng.random() < 0.2 else [])
            answers = []
            for loop_fn in (self.ref.python_run_compound, self.nat.run_compound):
                server = tc.FakeServer(script, *config)
                got_ = [self.loop.run_until_complete(tc._run(loop_fn, server, raw)) for raw in requests]
                answers.append((got_, server.observed, server.slots(), server.client.revoked_flags))
            if answers[0] != answers[1]:
                return None, data, f"run mismatch: reference {answers[0]!r:.300} native {answers[1]!r:.300}"
        return None


# --- the loop ----------------------------------------------------------------------------------

def run(target: str, inputs: int, seed: int, crash_dir: Path | None = None,
        progress: bool = False) -> dict:
    """`inputs` inputs of `target` from `seed`: {"inputs", "seconds", "findings": [(i, what)]}."""
    rng = random.Random(seed)
    tgt = {"xdr": XdrTarget, "compound": CompoundTarget}[target](rng)
    findings: list[tuple[int, str]] = []
    t0 = time.monotonic()
    for i in range(inputs):
        state = rng.getstate()
        try:
            found = tgt.one(i)
        except Exception:                                 # noqa: BLE001 - any raise is a finding
            found = (None, None, f"raised: {traceback.format_exc(limit=6)}")
        if found is not None:
            t, data, what = found
            findings.append((i, what))
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                name = f"{target}-{seed}-{i}"
                (crash_dir / f"{name}.txt").write_text(
                    f"type: {getattr(t, 'xdr_name', t)}\n{what}\nrng state: {state!r}\n")
                if data is not None:
                    (crash_dir / f"{name}.bin").write_bytes(bytes(data))
        if progress and i and i % 50_000 == 0:
            print(f"{target} native fuzz: {i} inputs, {time.monotonic() - t0:.0f} s, "
                  f"{len(findings)} findings", flush=True)
    return {"inputs": inputs, "seconds": time.monotonic() - t0, "findings": findings}


def _summary(target: str, result: dict) -> str:
    return (f"{target} native fuzz: inputs={result['inputs']} seconds={result['seconds']:.1f} "
            f"findings={len(result['findings'])}")


def _available(target: str) -> bool:
    return (_native_xdr() if target == "xdr" else _native_compound()) is not None


@pytest.mark.parametrize("target", TARGETS)
def test_mutated_inputs_decode_as_the_reference_and_never_raise(target, tmp_path):
    if not _available(target):
        pytest.skip(f"the native module of {target} is not built")
    crash_dir = Path(os.environ.get("CKPTGW_FUZZ_CRASH_DIR", tmp_path / "crashes"))
    result = run(target, INPUTS, seed=int(os.environ.get("CKPTGW_NATIVE_FUZZ_SEED", 37)),
                 crash_dir=crash_dir)
    print("\n" + _summary(target, result))
    for i, what in result["findings"][:5]:
        print(f"  input {i}: {what[:1500]}")
    assert not result["findings"], f"{len(result['findings'])} findings, inputs in {crash_dir}"


@pytest.mark.skipif(not LONG, reason="AddressSanitizer build and run: CKPTGW_LONG=1")
@pytest.mark.parametrize("target", TARGETS)
def test_the_fuzz_loop_under_address_sanitizer_finds_nothing(target):
    proc = subprocess.run(["bash", str(HERE / "asan.sh"), target, str(INPUTS)],
                          capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=TARGETS, required=True)
    p.add_argument("--inputs", type=int, default=INPUTS)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--crash-dir", type=Path, default=None)
    args = p.parse_args(argv)
    import logging
    import structlog
    # the loops log each COMPOUND at debug and handler crashes at error: a million lines of noise
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    mods = [_native_xdr()] + ([_native_compound()] if args.target == "compound" else [])
    if any(m is None for m in mods):
        print(f"the native modules of {args.target} are not built", file=sys.stderr)
        return 2
    for m in mods:
        print(f"native module: {m.__file__}", flush=True)
    result = run(args.target, args.inputs, args.seed, args.crash_dir, progress=True)
    print(_summary(args.target, result), flush=True)
    for i, what in result["findings"][:10]:
        print(f"  input {i}: {what[:1500]}")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
