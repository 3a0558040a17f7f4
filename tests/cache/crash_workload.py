"""Child process for the crash test: a concurrent checkpoint-like workload on the store.

Run as `python crash_workload.py STORE RUN`. Prints one JSON line per ACKNOWLEDGED op (only
after commit()/sync() returned) on stdout, flushed at once, so the parent knows exactly
what the store promised before it was killed with SIGKILL.

File threads (t0..t{N-1}), iteration i, each:
  create  t{t}/r{RUN}-{i}.tmp; write content(RUN, t, i) in chunks, some out of order;
  commit  -> ack {"op": "commit", "path": tmp, "sha": ..., "size": ...}
  write   an UNCOMMITTED tail past the end (must never survive a crash)
  rename  tmp -> t{t}/ckpt{i % 3} (replacing the previous checkpoint); sync
          -> ack {"op": "rename", "from": tmp, "to": final, "sha": ..., "size": ...}
Directory thread: mkdir dirs/r{RUN}-a{i}, create x inside, rename the directory to
  dirs/r{RUN}-b{i}, sync -> ack {"op": "dirmove", "from": ..., "to": ...}
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
import threading

from cache.api import ROOT_INO, StoreError
from cache.store import Store

THREADS = 3
_out = threading.Lock()


def content(run: int, t: int, i: int) -> bytes:
    rnd = random.Random(f"{run}/{t}/{i}")
    return rnd.randbytes(rnd.choice([1, 4095, 70_000, 300_000]))


def ack(**kw) -> None:
    line = json.dumps(kw) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def ensure_dir(s: Store, parent: int, name: bytes) -> int:
    try:
        return s.mkdir(parent, name, 0o755, 0, 0)[0].ino
    except StoreError:
        return s.lookup(parent, name).ino


def file_worker(s: Store, run: int, t: int) -> None:
    d = ensure_dir(s, ROOT_INO, b"t%d" % t)
    s.sync()
    for i in range(10 ** 6):
        tmp = b"r%d-%d.tmp" % (run, i)
        final = b"ckpt%d" % (i % 3)
        data = content(run, t, i)
        ino = s.create(d, tmp, 0o644, 0, 0)[0].ino
        chunks = [(o, data[o:o + 65536]) for o in range(0, len(data), 65536)]
        random.Random(i).shuffle(chunks)
        for off, chunk in chunks:       # as nfsd's WRITE: answered before its record (I5)
            if not s.write_nowait(ino, off, chunk):
                s.write(ino, off, chunk)
        s.commit(ino)
        sha = hashlib.sha256(data).hexdigest()
        path = f"t{t}/{tmp.decode()}"
        ack(op="commit", path=path, sha=sha, size=len(data))
        if not s.write_nowait(ino, len(data), b"UNCOMMITTED-TAIL" * 100):
            s.write(ino, len(data), b"UNCOMMITTED-TAIL" * 100)
        s.rename(d, tmp, d, final)
        s.sync()
        ack(op="rename", path=path, to=f"t{t}/{final.decode()}", sha=sha, size=len(data))


def dir_worker(s: Store, run: int) -> None:
    d = ensure_dir(s, ROOT_INO, b"dirs")
    s.sync()
    for i in range(10 ** 6):
        a, b = b"r%d-a%d" % (run, i), b"r%d-b%d" % (run, i)
        sub = s.mkdir(d, a, 0o755, 0, 0)[0].ino
        s.create(sub, b"x", 0o644, 0, 0)
        s.rename(d, a, d, b)
        s.sync()
        ack(op="dirmove", path=f"dirs/{a.decode()}", to=f"dirs/{b.decode()}")


def main() -> None:
    path, run = sys.argv[1], int(sys.argv[2])
    s = Store.open(path)
    ack(op="ready")
    threads = [threading.Thread(target=file_worker, args=(s, run, t), daemon=True)
               for t in range(THREADS)]
    threads.append(threading.Thread(target=dir_worker, args=(s, run), daemon=True))
    for th in threads:
        th.start()
    for th in threads:
        th.join()


if __name__ == "__main__":
    import logging

    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
