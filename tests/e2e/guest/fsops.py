#!/usr/bin/env python3
"""File-system workloads run INSIDE the kernel-client guest against the NFS mount (and imported by
the host tests for the expected data). Each check prints `PASS <name> ...` or `FAIL <name>: why`
and exits non-zero on failure; the shell drivers in this folder collect those lines.

    fsops.py gen SIZE_MIB SEED                   deterministic bytes to stdout (see data_block)
    fsops.py sha SIZE_MIB SEED                   sha256 of those bytes
    fsops.py checkpoint ROOT STEPS RANKS MIB     parallel tmp+fsync+rename writers, step dir renamed in
    fsops.py verify-checkpoint ROOT STEPS RANKS MIB [NAME]
    fsops.py latest-race DIR VERSIONS            reader loops over DIR/latest while a writer replaces it
    fsops.py many-entries DIR N                  create, list and remove N entries
    fsops.py mktree DIR                          a deterministic tree (sizes, modes, links, empty dirs)
    fsops.py manifest DIR                        JSON description of a tree (types, modes, data sha, links)
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import random
import stat
import struct
import sys
import time

MIB = 1 << 20
_POOL_CACHE: dict[str, bytes] = {}


def _pool(seed: str) -> bytes:
    if seed not in _POOL_CACHE:
        _POOL_CACHE[seed] = random.Random(seed).randbytes(5 * MIB)
    return _POOL_CACHE[seed]


def data_block(seed: str, index: int, size: int = MIB) -> bytes:
    """Block `index` of the deterministic stream `seed`: a header naming seed and index (so a block
    written at the wrong offset or replayed from another file is caught) + a window into a random
    pool that differs per index. Cheap to make under TCG (one copy, no hashing)."""
    head = struct.pack(">16sQ", hashlib.md5(seed.encode()).digest(), index)
    off = (index * 1_000_003) % (4 * MIB)
    return head + _pool(seed)[off:off + size - len(head)]


def stream_bytes(seed: str, total: int, block: int = MIB):
    i = 0
    while total > 0:
        chunk = data_block(seed, i, block)[:total]
        total -= len(chunk)
        i += 1
        yield chunk


def stream_sha(seed: str, total: int) -> str:
    h = hashlib.sha256()
    for chunk in stream_bytes(seed, total):
        h.update(chunk)
    return h.hexdigest()


def file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def report(ok: bool, name: str, detail: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}{' ' if ok else ': '}{detail}", flush=True)
    return ok


def drop_caches() -> None:
    """Write back and forget the guest page cache so that reads go to the NFS server. Only in the
    kernel-client guest (KCLIENT=1): on the host it would slow down everything else running."""
    os.sync()
    if os.environ.get("KCLIENT") != "1":
        return
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root (host-side use): reads may come from the page cache


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: str, chunks) -> None:
    """The checkpoint idiom: write `path`.tmp, fsync, rename over `path`."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


# ----------------------------------------------------------------------------- checkpoint pattern

def _ckpt_seed(step: int, rank: int) -> str:
    return f"ckpt-step{step}-rank{rank}"


def _ckpt_writer(args: tuple[str, int, int, int]) -> str:
    stepdir, step, rank, mib = args
    write_file_durably(os.path.join(stepdir, f"rank_{rank}.pt"), stream_bytes(_ckpt_seed(step, rank), mib * MIB))
    return f"rank_{rank}.pt"


def checkpoint(root: str, steps: int, ranks: int, mib: int) -> bool:
    """Like a training job: per step, RANKS writers in parallel each write rank_R.pt via
    tmp + fsync + rename inside step_N.tmp/, then step_N.tmp/ is renamed to step_N/."""
    os.makedirs(root, exist_ok=True)
    t0 = time.monotonic()
    with multiprocessing.Pool(ranks) as pool:
        for step in range(steps):
            tmpdir = os.path.join(root, f"step_{step}.tmp")
            os.mkdir(tmpdir)
            names = pool.map(_ckpt_writer, [(tmpdir, step, r, mib) for r in range(ranks)])
            listing = sorted(os.listdir(tmpdir))
            if listing != sorted(names):
                return report(False, "checkpoint", f"step {step}: {tmpdir} lists {listing}")
            fsync_dir(tmpdir)
            os.rename(tmpdir, os.path.join(root, f"step_{step}"))
            fsync_dir(root)
    secs = time.monotonic() - t0
    return report(True, "checkpoint", f"{steps} steps x {ranks} ranks x {mib} MiB in {secs:.1f}s")


def verify_checkpoint(root: str, steps: int, ranks: int, mib: int, name: str = "checkpoint-readback") -> bool:
    drop_caches()
    want = sorted([f"step_{s}" for s in range(steps)])
    got = sorted(n for n in os.listdir(root) if n.startswith("step_"))
    if got != want:
        return report(False, name, f"{root} has {got}, want {want}")
    for s in range(steps):
        d = os.path.join(root, f"step_{s}")
        files = sorted(os.listdir(d))
        if files != sorted(f"rank_{r}.pt" for r in range(ranks)):
            return report(False, name, f"{d} lists {files}")
        for r in range(ranks):
            p = os.path.join(d, f"rank_{r}.pt")
            if file_sha(p) != stream_sha(_ckpt_seed(s, r), mib * MIB):
                return report(False, name, f"{p}: content differs from what was written ({os.path.getsize(p)} bytes)")
    return report(True, name, f"{steps * ranks} files read back after drop_caches")


# ----------------------------------------------------------------------------- latest replaced by rename

def _latest_content(version: int) -> bytes:
    """Self-checking content: header with version, length and sha256 of the body; sizes vary so a
    torn mix of two versions cannot look right."""
    body = data_block(f"latest-{version}", version, 1024 + (version * 7919) % (32 * 1024))
    return b"v=%d len=%d sha=%s\n" % (version, len(body), hashlib.sha256(body).hexdigest().encode()) + body


def _check_latest(data: bytes) -> int:
    head, _, body = data.partition(b"\n")
    try:
        fields = dict(kv.split(b"=", 1) for kv in head.split(b" "))
        version, length = int(fields[b"v"]), int(fields[b"len"])
    except (ValueError, KeyError):
        raise ValueError(f"unparsable header {head[:80]!r} ({len(data)} bytes)")
    if len(body) != length or hashlib.sha256(body).hexdigest().encode() != fields[b"sha"]:
        raise ValueError(f"torn/mixed content: header says v={version} len={length}, body is {len(body)} bytes")
    return version


def _latest_writer(d: str, versions: int) -> None:
    for v in range(1, versions + 1):
        write_file_durably(os.path.join(d, "latest"), [_latest_content(v)])
        # A saving job pauses between checkpoints; without it a fast file system finishes all
        # versions before the reader has looked twice, and nothing races.
        time.sleep(0.01)


def latest_race(d: str, versions: int, read_pause: float = 0.05) -> bool:
    os.makedirs(d, exist_ok=True)
    write_file_durably(os.path.join(d, "latest"), [_latest_content(0)])
    writer = multiprocessing.Process(target=_latest_writer, args=(d, versions))
    writer.start()
    reads, seen, last = 0, set(), -1
    try:
        while True:
            done = not writer.is_alive()
            try:
                with open(os.path.join(d, "latest"), "rb") as f:
                    data = f.read()
            except OSError as e:
                return report(False, "latest-race", f"read {reads + 1}: {errno.errorcode.get(e.errno, e.errno)} {e}")
            try:
                v = _check_latest(data)
            except ValueError as e:
                return report(False, "latest-race", f"read {reads + 1}: {e}")
            if v < last:
                return report(False, "latest-race", f"read {reads + 1}: version went back from {last} to {v}")
            last = v
            seen.add(v)
            reads += 1
            if done:
                break
            time.sleep(read_pause)  # a busy reader would starve the writer on a 1-vCPU guest
    finally:
        writer.join()
    if writer.exitcode != 0:
        return report(False, "latest-race", f"writer failed (exit {writer.exitcode})")
    if last != versions:
        return report(False, "latest-race", f"final read saw v={last}, want v={versions}")
    if len(seen) < min(10, versions):
        return report(False, "latest-race", f"only {len(seen)} versions seen in {reads} reads: no real race")
    drop_caches()
    with open(os.path.join(d, "latest"), "rb") as f:
        final = _check_latest(f.read())
    leftovers = sorted(n for n in os.listdir(d) if n != "latest" and not n.startswith(".nfs"))
    if final != versions or leftovers:
        return report(False, "latest-race", f"after drop_caches: v={final}, other entries {leftovers}")
    return report(True, "latest-race", f"{versions} renames, {reads} clean reads, {len(seen)} versions seen")


# ----------------------------------------------------------------------------- many entries

def many_entries(d: str, n: int) -> bool:
    os.makedirs(d)
    names = [f"entry-{i:06d}-{'x' * (i % 40)}" for i in range(n)]
    t0 = time.monotonic()
    for name in names:
        os.close(os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    t1 = time.monotonic()
    drop_caches()
    listed = os.listdir(d)
    if sorted(listed) != names:
        missing, extra = set(names) - set(listed), set(listed) - set(names)
        return report(False, "many-entries", f"listing has {len(listed)} entries, {len(missing)} missing "
                      f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected (e.g. {sorted(extra)[:3]})")
    t2 = time.monotonic()
    for name in names:
        os.unlink(os.path.join(d, name))
    t3 = time.monotonic()
    left = os.listdir(d)
    if left:
        return report(False, "many-entries", f"{len(left)} entries left after removing all, e.g. {left[:3]}")
    os.rmdir(d)
    return report(True, "many-entries", f"{n} entries: create {t1 - t0:.1f}s, list {t2 - t1:.1f}s, remove {t3 - t2:.1f}s")


# ----------------------------------------------------------------------------- trees

def mktree(d: str) -> None:
    """A tree that exercises tar: odd sizes around page and block boundaries, modes, an empty
    dir, deep nesting, a symlink (file, dir, dangling), a hard link and names with spaces."""
    os.makedirs(d)
    sizes = [0, 1, 511, 4095, 4096, 4097, 65536, MIB + 7, 3 * MIB]
    for i, size in enumerate(sizes):
        sub = os.path.join(d, f"dir{i % 3}", *(["deep"] * (i % 4)))
        os.makedirs(sub, exist_ok=True)
        p = os.path.join(sub, f"file {i}.bin")
        with open(p, "wb") as f:
            for chunk in stream_bytes(f"tree-{i}", size):
                f.write(chunk)
        os.chmod(p, [0o644, 0o600, 0o755, 0o444][i % 4])
    os.makedirs(os.path.join(d, "empty dir"))
    os.chmod(os.path.join(d, "dir1"), 0o750)
    os.symlink("dir0/file 0.bin", os.path.join(d, "link-to-file"))
    os.symlink("dir2", os.path.join(d, "link-to-dir"))
    os.symlink("does/not/exist", os.path.join(d, "dangling"))
    os.link(os.path.join(d, "dir0", "deep", "deep", "deep", "file 3.bin"), os.path.join(d, "hardlink"))


def manifest(d: str) -> dict:
    """path -> [kind, mode, size/target, sha256, hard-link group]; link groups are named by the
    first path that has the inode, so inode numbers themselves do not have to match."""
    out: dict[str, list] = {}
    first_path: dict[tuple[int, int], str] = {}
    for dirpath, dirnames, filenames in os.walk(d):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, d)
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ["symlink", None, os.readlink(p), None, None]
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ["dir", oct(mode), None, None, None]
            else:
                group = first_path.setdefault((st.st_dev, st.st_ino), rel) if st.st_nlink > 1 else None
                out[rel] = ["file", oct(mode), st.st_size, file_sha(p), group]
    return out


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "gen":
        out = sys.stdout.buffer
        for chunk in stream_bytes(args[1], int(args[0]) * MIB):
            out.write(chunk)
        out.flush()
        return 0
    if cmd == "sha":
        print(stream_sha(args[1], int(args[0]) * MIB))
        return 0
    if cmd == "checkpoint":
        return 0 if checkpoint(args[0], *map(int, args[1:4])) else 1
    if cmd == "verify-checkpoint":
        name = args[4] if len(args) > 4 else "checkpoint-readback"
        return 0 if verify_checkpoint(args[0], *map(int, args[1:4]), name=name) else 1
    if cmd == "latest-race":
        return 0 if latest_race(args[0], int(args[1])) else 1
    if cmd == "many-entries":
        return 0 if many_entries(args[0], int(args[1])) else 1
    if cmd == "mktree":
        mktree(args[0])
        return 0
    if cmd == "manifest":
        json.dump(manifest(args[0]), sys.stdout, indent=0, sort_keys=True)
        print()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
