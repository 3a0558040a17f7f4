"""Guest side of the power-cut test: checkpoint saves through the NFS mount, and a scan after reboot.

Runs inside the Debian guest with its system python3 (stdlib only); the host imports it too, for
`content()`, so both sides agree on every file's bytes.

  save --mnt DIR --seed S --first-step N --steps M --shards K
      for each step: mkdir step_N (fsync the parent), then per shard write step_N/shard_K.tmp,
      fsync, rename to step_N/shard_K, fsync the directory, and only then print
      `ACK step_N/shard_K SIZE SHA256` (flushed): the host reads these lines live over SSH, so
      it knows exactly what the client was told is durable before the power was cut.
  scan --mnt DIR
      `FILE RELPATH SIZE SHA256` for every regular file under DIR, then `END COUNT`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys

BLOCK = 65536
MIN_SIZE, MAX_SIZE = 1, 384 * 1024        # small files and multi-page ones, never page-aligned on purpose


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def shard_path(step: int, shard: int) -> str:
    return f"{step_name(step)}/shard_{shard}"


def content(seed: int, step: int, shard: int) -> bytes:
    """The deterministic bytes of one shard: a per-file random block, each 64 KiB chunk stamped
    with its file and offset, so a chunk of another file or another offset is recognised."""
    rng = random.Random(f"{seed}:{step}:{shard}")
    size = rng.randint(MIN_SIZE, MAX_SIZE)
    base = rng.randbytes(BLOCK)
    out = bytearray()
    for i in range(0, size, BLOCK):
        stamp = f"{seed}:{step}:{shard}:{i}|".encode()
        out += stamp + base[len(stamp):]
    del out[size:]
    return bytes(out)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(mnt: str, seed: int, first_step: int, steps: int, shards: int) -> None:
    for step in range(first_step, first_step + steps):
        d = os.path.join(mnt, step_name(step))
        os.makedirs(d, exist_ok=True)
        _fsync_dir(mnt)
        for shard in range(shards):
            data = content(seed, step, shard)
            final = os.path.join(mnt, shard_path(step, shard))
            with open(final + ".tmp", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(final + ".tmp", final)
            _fsync_dir(d)
            print(f"ACK {shard_path(step, shard)} {len(data)} {hashlib.sha256(data).hexdigest()}", flush=True)
        print(f"STEP {step_name(step)}", flush=True)
    print("DONE", flush=True)


def scan(mnt: str) -> None:
    count = 0
    for root, dirs, files in os.walk(mnt):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            h = hashlib.sha256()
            size = 0
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
            print(f"FILE {os.path.relpath(path, mnt)} {size} {h.hexdigest()}")
            count += 1
    print(f"END {count}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("--mnt", required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--first-step", type=int, required=True)
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--shards", type=int, required=True)
    c = sub.add_parser("scan")
    c.add_argument("--mnt", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "save":
        save(a.mnt, a.seed, a.first_step, a.steps, a.shards)
    else:
        scan(a.mnt)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
