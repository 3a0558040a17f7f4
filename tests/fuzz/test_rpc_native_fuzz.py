"""Byte-level fuzzing of nfsd.native.rpc (issue 37) against its reference nfsd/rpc.py.

Inputs are recorded nfs-rs traffic (tests/fuzz/corpus/*.bin) cut into records and damaged by
tests/fuzz/mutate.py (bit flips, truncation, inflated length words, splices, duplicated and
dropped ranges, record marks announcing more, split fragments), a few per input, sometimes
with an intact record after them (does the stream resynchronise the same way?). Each input
goes to a fresh reference and a fresh native connection, under the default limits or small
ones, in the same random chunks (receive_data, or get_buffer/buffer_updated partial fills),
and must give the same events and states (tests/nfsd/test_rpc_native.py `feed_both`). The
native connection must never raise.

Budget: CKPTGW_RPC_FUZZ_INPUTS=N inputs; default 20,000 (a few seconds), CKPTGW_LONG=1 a
million. Findings are written to $CKPTGW_FUZZ_CRASH_DIR (default: the test's tmp dir).
tests/fuzz/asan_rpc.sh runs the same loop (`python -m tests.fuzz.test_rpc_native_fuzz`)
with the extension built under AddressSanitizer; the test of that runs only when CKPTGW_LONG=1.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

import nfsd.rpc as ref
from tests.fuzz.mutate import frame, mutate, split_records
from tests.nfsd.test_rpc_native import Mismatch, feed_both, make_pair, native

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.bin"))
LONG = os.environ.get("CKPTGW_LONG") == "1"
INPUTS = int(os.environ.get("CKPTGW_RPC_FUZZ_INPUTS", 1_000_000 if LONG else 20_000))
HERE = Path(__file__).resolve().parent


def corpus_records() -> list[bytes]:
    return [r for path in CORPUS for r in split_records(path.read_bytes())]


def _config(rng: random.Random) -> dict:
    if rng.random() < 0.6:
        return dict(pooled=rng.random() < 0.2)
    return dict(max_record=rng.choice([0, 28, 64, 200, 256, 1024, 4096, ref.DEFAULT_MAX_RECORD]),
                max_fragments=rng.choice([1, 2, 3, 4, 64, ref.DEFAULT_MAX_FRAGMENTS]),
                direct_threshold=rng.choice([0, 1, 16, 100, 256, 1024, ref.DIRECT_RECEIVE_THRESHOLD]),
                scratch_size=rng.choice([4, 7, 64, 1024, ref.SCRATCH_SIZE]),
                pooled=rng.random() < 0.3)


def _plan(rng: random.Random, size: int) -> list:
    how = rng.randrange(4)
    if how == 0:
        return []                                            # one receive_data
    steps = []
    for _ in range(rng.randint(1, 24)):
        if how == 1 or (how == 3 and rng.random() < 0.5):
            steps.append(("recv", rng.choice([1, 2, 3, 4, 5, rng.randint(1, max(1, size))])))
        else:
            steps.append(("buf", rng.choice([-1, 0, 65536]), rng.choice([1, 3, 4, rng.randint(1, max(1, size))])))
    return steps


def one_input(rng: random.Random, records: list[bytes]) -> bytes:
    data = b"".join(mutate(rng, rng.choice(records), records) for _ in range(rng.choice((1, 1, 1, 2, 3, 6))))
    if rng.random() < 0.3:
        data += frame(rng.choice(records))                   # does it resynchronise the same way?
    if rng.random() < 0.1:
        data = frame(rng.choice(records)) + data
    return data


def run(inputs: int, seed: int, crash_dir: Path | None = None, progress: bool = False) -> dict:
    """`inputs` inputs from `seed`; returns {"inputs", "seconds", "findings": [(i, what)]}."""
    records = corpus_records()
    rng = random.Random(seed)
    findings: list[tuple[int, str]] = []
    t0 = time.monotonic()
    for i in range(inputs):
        data = one_input(rng, records)
        cfg, plan, peek = _config(rng), _plan(rng, len(data)), rng.random() < 0.3
        try:
            a, b = make_pair(**cfg)
            feed_both(a, b, data, plan, peek)
        except Mismatch as exc:
            what = f"mismatch ({cfg}, plan {plan[:6]}...): {exc}"
        except Exception:                                     # noqa: BLE001 - any raise is a finding
            what = f"raised ({cfg}, plan {plan[:6]}...): {traceback.format_exc(limit=4)}"
        else:
            what = None
        if what is not None:
            findings.append((i, what))
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                (crash_dir / f"rpc-native-{seed}-{i}.bin").write_bytes(data)
        if progress and i and i % 100_000 == 0:
            print(f"rpc native fuzz: {i} inputs, {time.monotonic() - t0:.0f} s, {len(findings)} findings",
                  flush=True)
    return {"inputs": inputs, "seconds": time.monotonic() - t0, "findings": findings}


def _summary(result: dict) -> str:
    return (f"rpc native fuzz: inputs={result['inputs']} seconds={result['seconds']:.1f} "
            f"findings={len(result['findings'])}")


@pytest.mark.skipif(native is None, reason="nfsd.native.rpc is not built")
def test_mutated_traffic_gives_the_reference_events_and_never_raises(tmp_path):
    assert len(corpus_records()) >= 30
    crash_dir = Path(os.environ.get("CKPTGW_FUZZ_CRASH_DIR", tmp_path / "crashes"))
    result = run(INPUTS, seed=int(os.environ.get("CKPTGW_RPC_FUZZ_SEED", 37)), crash_dir=crash_dir)
    print("\n" + _summary(result))
    for i, what in result["findings"][:5]:
        print(f"  input {i}: {what[:1500]}")
    assert not result["findings"], f"{len(result['findings'])} findings, inputs in {crash_dir}"


@pytest.mark.skipif(not LONG, reason="AddressSanitizer build and run: CKPTGW_LONG=1")
def test_the_fuzz_loop_under_address_sanitizer_finds_nothing():
    proc = subprocess.run(["bash", str(HERE / "asan_rpc.sh"), str(INPUTS)], capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=INPUTS)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--crash-dir", type=Path, default=None)
    args = p.parse_args(argv)
    if native is None:
        print("nfsd.native.rpc is not built", file=sys.stderr)
        return 2
    print(f"native module: {native.__file__}", flush=True)
    result = run(args.inputs, args.seed, args.crash_dir, progress=True)
    print(_summary(result), flush=True)
    for i, what in result["findings"][:10]:
        print(f"  input {i}: {what[:1500]}")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
