"""Fuzzing the NFS server (issue 14 point 6): structured COMPOUNDs from the declared XDR
types, well-typed and mutated, and byte-level mutation of real nfs-rs traffic
(tests/fuzz/corpus, recorded by tests/fuzz/record_corpus.py), against the sans-I/O
engine and a live server. Properties: tests/fuzz/engine.py.

Budget: CI runs a short one (well under 60 s). CKPTGW_FUZZ_INPUTS=N runs N inputs in
all, CKPTGW_LONG=1 a million; the count and the crash count are printed (run with -s),
crashing inputs are written to $CKPTGW_FUZZ_CRASH_DIR (default: the test's tmp dir) and
every crash found becomes a named test in test_fuzz_regressions.py.
"""
from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import nfsd.xdr.nfs4 as n
from nfsd.context import Cred
from nfsd.rpc import encode_call
from nfsd.xdr import encode
from nfsd.xdr.rpc import AUTH_SYS
from tests.fuzz.engine import Engine, EngineSession, FuzzFailure, LiveTarget, SessionFixup, op_status
from tests.fuzz.mutate import frame, mutate, split_records
from tests.fuzz.xdr_strategies import strategy

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.bin"))
LONG = os.environ.get("CKPTGW_LONG") == "1"
TOTAL = int(os.environ.get("CKPTGW_FUZZ_INPUTS", 1_000_000 if LONG else 0))
COLLECT = TOTAL > 0                      # long runs count crashes instead of stopping
# Shares of the budget: byte-level on the engine, structured, byte-level on a live server.
BYTES_ENGINE = int(TOTAL * 0.6) if TOTAL else 2000
STRUCTURED = int(TOTAL * 0.3) if TOTAL else 300
BYTES_LIVE = int(TOTAL * 0.1) if TOTAL else 300
ROOT = Cred(AUTH_SYS, uid=0, gid=0, machinename=b"fuzz")


@pytest.fixture
def fast_dir(tmp_path):
    """A directory on tmpfs when there is one: the store fsyncs before replies, and the
    fuzzer wants inputs per second, not disk latency (durability is tested elsewhere)."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="ckptgw-fuzz-", dir="/dev/shm"))
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path


def corpus_records() -> list[bytes]:
    return [r for path in CORPUS for r in split_records(path.read_bytes())]


def captured_replies() -> dict[bytes, bytes]:
    return {r[:4]: r for path in CORPUS for r in split_records(path.with_suffix(".replies").read_bytes())}


def compound_args(record: bytes):
    from nfsd.rpc import CallReceived, Program, RpcConnection
    from nfsd.xdr import decode
    ev = RpcConnection({100003: Program(100003, 4, 4, frozenset({0, 1}))}).receive_data(frame(record))
    if len(ev) == 1 and isinstance(ev[0], CallReceived) and ev[0].proc == 1:
        return decode(n.COMPOUND4args, ev[0].args)
    return None


class Tally:
    def __init__(self, name: str, crash_dir: Path):
        self.name, self.crash_dir = name, crash_dir
        self.inputs = 0
        self.crashes: list[FuzzFailure] = []

    def run(self, target, data: bytes):
        self.inputs += 1
        try:
            return target.send(data)
        except FuzzFailure as f:
            self.crashes.append(f)
            self.crash_dir.mkdir(parents=True, exist_ok=True)
            (self.crash_dir / f"{self.name}-{len(self.crashes)}.bin").write_bytes(f.data or data)
            if not COLLECT:
                raise
            return []

    def report(self) -> None:
        print(f"\nfuzz {self.name}: inputs={self.inputs} crashes={len(self.crashes)}")
        for f in self.crashes[:10]:
            print(f"  {f}")
        assert not self.crashes, f"{len(self.crashes)} crashes, first: {self.crashes[0]}"


def replay(tally: Tally, target, records: list[bytes], rng: random.Random, count: int,
           p_mutate: float = 0.5) -> None:
    """The captured session in order, each record mutated with probability p_mutate;
    pass after pass until `count` inputs were sent."""
    captured = captured_replies()
    while tally.inputs < count:
        fix = SessionFixup(captured)
        for rec in records:
            if tally.inputs >= count:
                break
            body = fix.apply(rec)
            mutated = rng.random() < p_mutate
            data = mutate(rng, body, records) if mutated else frame(body)
            for reply in tally.run(target, data):
                if not mutated:
                    fix.learn(rec, reply)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="ckptgw-fuzz-", dir=shm or tmp_path_factory.getbasetemp()))
    e = Engine(root)
    yield e
    e.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def crash_dir(tmp_path) -> Path:
    return Path(os.environ.get("CKPTGW_FUZZ_CRASH_DIR", tmp_path / "crashes"))


def test_corpus_is_real_traffic():
    records = corpus_records()
    assert len(records) >= 30
    ops = set()
    for r in records:
        args = compound_args(r)
        ops |= {op.tag for op in (args.argarray if args else ())}
    assert {n.OP_EXCHANGE_ID, n.OP_CREATE_SESSION, n.OP_SEQUENCE, n.OP_OPEN, n.OP_WRITE,
            n.OP_READ, n.OP_READDIR, n.OP_RENAME, n.OP_REMOVE} <= ops


def test_captured_session_replays_cleanly(fast_dir, crash_dir):
    """Unmutated, the capture runs on a fresh server with its ids rewritten: the session
    part works (most calls get past SEQUENCE), so mutations reach the ops."""
    tally = Tally("replay", crash_dir)
    records = corpus_records()
    fix = SessionFixup(captured_replies())
    same = 0
    engine = Engine(fast_dir)
    for rec in records:
        for reply in tally.run(engine, frame(fix.apply(rec))):
            fix.learn(rec, reply)
            old = fix._results(fix.captured[rec[:4]])
            new = fix._results(bytes(reply)[4:])
            same += [op_status(r) for r in old] == [op_status(r) for r in new]
    engine.close()
    assert same >= len(records) * 0.8          # the same op statuses as the capture


def test_byte_mutation_of_real_traffic_on_the_engine(engine, crash_dir):
    tally = Tally("bytes-engine", crash_dir)
    replay(tally, engine, corpus_records(), random.Random(1), BYTES_ENGINE)
    tally.report()


_structured: dict = {}


@pytest.fixture
def structured(engine, crash_dir):
    _structured["tally"] = Tally("structured", crash_dir)
    _structured["session"] = EngineSession(engine, ROOT)
    yield _structured
    print(f"structured: sessions opened={_structured['session'].clients}")
    _structured["tally"].report()


@settings(max_examples=STRUCTURED, deadline=None, derandomize=not COLLECT, database=None,
          suppress_health_check=list(HealthCheck))
@given(args=strategy(n.COMPOUND4args), seed=st.integers(0, 2**32 - 1), mutated=st.booleans(),
       in_session=st.integers(0, 3))
def test_structured_compounds_well_typed_and_mutated(engine, structured, args, seed, mutated, in_session):
    """Generated COMPOUNDs, 3 in 4 of them behind a working SEQUENCE + PUTROOTFH so the ops
    run; half of them byte-mutated after encoding."""
    session = structured["session"]
    if in_session:
        args.minorversion = 1
        args.argarray = session.prefix() + args.argarray
    try:
        data = encode_call(1, 100003, 4, 1, ROOT, encode(n.COMPOUND4args, args))
    except Exception:                     # a generated value the encoder refuses
        return
    if mutated:
        data = mutate(random.Random(seed), data[4:], [])
    replies = structured["tally"].run(engine, data)
    if in_session:
        session.after(replies)


def _huge_inputs(records):
    """Real records with one aligned word at a time set to a huge length; the same records
    under a record mark announcing the maximum record; a GETATTR whose bitmap4 has 4,000
    all-ones words."""
    from nfsd.rpc import DEFAULT_MAX_RECORD, LAST_FRAGMENT
    for rec in records:
        yield struct.pack(">I", LAST_FRAGMENT | (DEFAULT_MAX_RECORD - 1)) + rec
        for i in range(0, len(rec) - 3, 4):
            for huge in (0xFFFFFFF0, 0x7FFFFFFF, 0x00800000):
                body = bytearray(rec)
                struct.pack_into(">I", body, i, huge)
                yield frame(bytes(body))
    ops = struct.pack(">III", n.OP_PUTROOTFH, n.OP_GETATTR, 4000) + b"\xff" * 16000
    yield encode_call(9, 100003, 4, 1, ROOT, struct.pack(">III", 0, 0, 2) + ops)


def test_huge_announced_lengths_keep_memory_bounded(engine, crash_dir):
    """Whatever a length field, a record mark or a bitmap announces, the peak traced
    allocation while handling it stays under 1 MiB (the inputs are a few KiB)."""
    tally = Tally("inflate", crash_dir)
    peak_max = 0
    tracemalloc.start()
    try:
        for data in _huge_inputs(corpus_records()[:8]):
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            tally.run(engine, data)
            peak_max = max(peak_max, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    print(f"\ninflate: inputs={tally.inputs} peak={peak_max >> 10} KiB")
    tally.report()
    assert peak_max < 1024 * 1024


def test_the_properties_catch_an_internal_failure(tmp_path):
    """The oracle itself: a handler that raises is reported (NFS4ERR_SERVERFAULT)."""
    e = Engine(tmp_path)
    try:
        def broken(ctx, args):
            raise RuntimeError("handler bug")
        e.server.ops.set_handler(n.OP_PUTROOTFH, broken)
        call = encode_call(3, 100003, 4, 1, ROOT, struct.pack(">IIII", 0, 0, 1, n.OP_PUTROOTFH))
        with pytest.raises(FuzzFailure, match="SERVERFAULT"):
            e.send(call)
    finally:
        e.close()


def test_byte_mutation_of_real_traffic_on_a_live_server(fast_dir, crash_dir):
    from cache.store import Store
    from nfsd.exports import Export, Exports
    from nfsd.limits import Limits
    from nfsd.server import NfsServer
    from tests.nfsd.conftest import ServerThread

    store = Store.open(str(fast_dir / "store"))
    st_ = ServerThread(lambda: NfsServer(
        store, Exports([Export(1, "/checkpoints", root_squash=False, secure=False)]),
        limits=Limits(record_timeout=0.3))).start()
    target = LiveTarget(st_.port)
    tally = Tally("bytes-live", crash_dir)
    try:
        replay(tally, target, corpus_records(), random.Random(2), BYTES_LIVE)
    finally:
        target.close()
        st_.stop()
        store.close()
    print(f"live reconnects={target.reconnects}")
    tally.report()
