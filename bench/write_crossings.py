"""Thread crossings and CPU per UNSTABLE WRITE and per READ, for two source trees side by side
(issue 37 point 4: "a data path with no per-request thread crossing"); `measure(tree)` gives one
tree's figures to the report (bench/scenarios/request.py).

Each tree runs in a subprocess of its own (its directory first on sys.path): a real Store
under the real op handlers (testkit/ops_harness.py: no RPC, the handlers' own
`run_blocking` through a thread pool), one file opened and written once (the commit cycle's
first write, which flags the file), then N UNSTABLE WRITEs of --kib KiB at increasing
offsets, then one COMMIT, then N READs of the same ranges (in the page cache: just written).
Counted during the N WRITEs (the COMMIT is outside) and apart during the N READs:

  crossings    a hand-off to another thread that the request then waits for, each way:
               2 per `run_blocking` (loop -> pool -> loop) plus 2 per batch-committer future
               some thread waits on (`Future.result()` / awaited: -> committer -> back), plus
               1 per `start_blocking` (loop -> pool, answered from there).
               A lazy batch op nobody waits for is not one (the committer forms one batch
               for many; counted apart as "lazy ops" and "batches").
  ctxsw        voluntary context switches of every thread of the process (/proc), per WRITE:
               an independent check of the above (a wait for another thread is one).
  cpu          process CPU time (user+sys, all threads) per WRITE.

    python -m bench.write_crossings --before /tmp/wt-before [--after .] [--writes 400] [--kib 256]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import asyncio, glob, json, os, sys, tempfile, time, threading
sys.path.insert(0, os.getcwd())
import structlog, logging
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from concurrent.futures import Future
from cache import batch as batch_mod
from cache.store import Store
from nfsd.exports import Exports
from nfsd.xdr.nfs4 import *
from testkit.ops_harness import FakeServer, Fs
from testkit import ops_harness

N, KIB = int(sys.argv[1]), int(sys.argv[2])
counts = {"run_blocking": 0, "start_blocking": 0, "batch_waited": 0, "lazy_ops": 0, "eager_ops": 0}
counting = [False]

real_submit = batch_mod.BatchCommitter.submit
def submit(self, fn, *args, durable=True, lazy=False, **handoff):     # loop=, into=: passed on
    fut = real_submit(self, fn, *args, durable=durable, lazy=lazy, **handoff)
    fut._from_batch = True
    if counting[0]:
        counts["lazy_ops" if lazy else "eager_ops"] += 1
    return fut
batch_mod.BatchCommitter.submit = submit
real_result = Future.result
def result(self, timeout=None):
    if counting[0] and getattr(self, "_from_batch", False):
        counts["batch_waited"] += 1
    return real_result(self, timeout)
Future.result = result
real_wrap = asyncio.wrap_future
def wrap_future(fut, *, loop=None):
    if counting[0] and getattr(fut, "_from_batch", False):
        counts["batch_waited"] += 1
    return real_wrap(fut, loop=loop)
asyncio.wrap_future = wrap_future

def ctxsw():
    total = 0
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/status"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total

async def main():
    from pathlib import Path
    with tempfile.TemporaryDirectory(prefix="ckptgw-crossings-") as work:    # 140 MB of extents: never left behind
        await measure_in(Path(work))

async def measure_in(work):
    fs, store = ops_harness.make_fs(work)
    server = fs.server
    real_rb = server.run_blocking
    async def run_blocking(fn, *args):
        if counting[0]:
            counts["run_blocking"] += 1
        return await real_rb(fn, *args)
    server.run_blocking = run_blocking
    real_sb = server.start_blocking
    def start_blocking(fn, *args):
        if counting[0]:
            counts["start_blocking"] += 1
        return real_sb(fn, *args)
    server.start_blocking = start_blocking
    def crossings():
        return 2 * counts["run_blocking"] + 2 * counts["batch_waited"] + counts["start_blocking"]
    root = await fs.root_fh()
    fh, stateid, _ = await fs.open(root, "f")
    data = os.urandom(KIB * 1024)
    async def write(off):
        await fs.run([(OP_PUTFH, PUTFH4args(fh)),
                      (OP_WRITE, WRITE4args(stateid, off, UNSTABLE4, data))])
    await write(0)                       # the cycle's first write: the flag txn
    await asyncio.sleep(0.2)
    batches0, sw0, cpu0 = store.batch.batches, ctxsw(), time.process_time()
    t0 = time.perf_counter()
    counting[0] = True
    for i in range(1, N + 1):
        await write(i * len(data))
    counting[0] = False
    wall = time.perf_counter() - t0
    cpu, sw = time.process_time() - cpu0, ctxsw() - sw0
    await fs.run([(OP_PUTFH, PUTFH4args(fh)), (OP_COMMIT, COMMIT4args(0, 0))])
    batches = store.batch.batches - batches0
    write_crossings = crossings()
    write_counts = dict(counts)
    for k in counts:
        counts[k] = 0
    sw0, cpu0 = ctxsw(), time.process_time()
    counting[0] = True
    for i in range(1, N + 1):
        res = await fs.run([(OP_PUTFH, PUTFH4args(fh)), (OP_READ, READ4args(stateid, i * len(data), len(data)))])
        assert len(res[-1].value.data) == len(data), "a short read"
    counting[0] = False
    read_cpu, read_sw = time.process_time() - cpu0, ctxsw() - sw0
    read = {"read crossings": crossings() / N, "read run_blocking": counts["run_blocking"] / N,
            "read ctxsw": read_sw / N, "read cpu_us": read_cpu / N * 1e6}
    store.close()
    per = lambda x: x / N
    print(json.dumps({"crossings": per(write_crossings),
                      "run_blocking": per(write_counts["run_blocking"]),
                      "start_blocking": per(write_counts["start_blocking"]),
                      "batch futures waited": per(write_counts["batch_waited"]),
                      "lazy ops": per(write_counts["lazy_ops"]), "eager ops": per(write_counts["eager_ops"]),
                      "batches (incl. COMMIT)": per(batches),
                      "ctxsw": per(sw), "cpu_us": per(cpu) * 1e6, "wall_us": per(wall) * 1e6, **read}))

asyncio.run(main())
'''


def measure(tree: Path = REPO, writes: int = 200, kib: int = 256) -> dict:
    """One tree's figures (per WRITE and per READ: the keys printed by main())."""
    return run(tree.resolve(), writes, kib)


def run(tree: Path, writes: int, kib: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(writes), str(kib)], cwd=tree,
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=REPO)
    ap.add_argument("--writes", type=int, default=400)
    ap.add_argument("--kib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):                 # interleaved: host load hits both alike
        for side, tree in (("before", args.before), ("after", args.after)):
            rows[side].append(run(tree.resolve(), args.writes, args.kib))
    keys = list(rows["before"][0])
    print(f"per UNSTABLE WRITE of {args.kib} KiB ({args.writes} writes), per READ of as much (read ...), "
          f"median of {args.rounds}")
    print(f"{'':28}{'before':>12}{'after':>12}")
    for k in keys:
        med = {s: sorted(r[k] for r in rows[s])[len(rows[s]) // 2] for s in rows}
        print(f"{k:28}{med['before']:12.2f}{med['after']:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
