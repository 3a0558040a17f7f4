#!/usr/bin/env python3
"""Checkpoint save timed INSIDE the kernel-client guest (for bench/kclient_compare.py):
FILES files of FILE_MIB MiB written by PARALLEL processes into step_0.tmp/, each as name.tmp +
fsync + rename, then the directory fsynced and renamed to step_0/ and its parent fsynced.
The data is one random buffer made before the clock starts, so only the I/O is timed.

    kclient_ckpt_guest.py ROOT FILES FILE_MIB PARALLEL     -> RESULT ckpt_save_s <seconds>
"""

import multiprocessing
import os
import sys
import time

MIB = 1 << 20
BUF = b""


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_one(args: tuple[str, int, int]) -> None:
    d, i, mib = args
    tmp, final = os.path.join(d, f"rank_{i}.pt.tmp"), os.path.join(d, f"rank_{i}.pt")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(mib):
            view = memoryview(BUF)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)


def main() -> int:
    global BUF
    root, files, mib, parallel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    BUF = os.urandom(MIB)
    os.makedirs(root, exist_ok=True)
    with multiprocessing.Pool(parallel) as pool:  # workers forked before the clock starts
        pool.map(abs, range(parallel))
        t0 = time.monotonic()
        tmpdir = os.path.join(root, "step_0.tmp")
        os.mkdir(tmpdir)
        pool.map(write_one, [(tmpdir, i, mib) for i in range(files)])
        fsync_path(tmpdir)
        os.rename(tmpdir, os.path.join(root, "step_0"))
        fsync_path(root)
        secs = time.monotonic() - t0
    if sorted(os.listdir(os.path.join(root, "step_0"))) != sorted(f"rank_{i}.pt" for i in range(files)):
        print("checkpoint directory listing is wrong", file=sys.stderr)
        return 1
    print(f"RESULT ckpt_save_s {secs:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
