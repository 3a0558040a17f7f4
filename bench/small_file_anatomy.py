"""The anatomy of one small-file save (issue 37: "fdatasyncs and COMPOUNDs per file"): what the
gateway does for each 4 KiB file of the nfs-rs small-file loop (bench/nfsrs_throughput.py
`save_small_file`: open "wb" + write + close, rename over `final`, unlink `final`).

Two ways of counting, both per file:

* `wire_counts(port, pid, ...)`: from outside, for any server (the report's rows, with
  NFS-Ganesha as the reference): the client talks through a counting TCP proxy (RPC calls,
  COMPOUNDs and their ops, decoded with nfsd's reference codec) while `strace -f -y` attached to
  the server counts its fdatasync / fsync / sync_file_range / msync calls by the file they sync
  (the LMDB index `data.mdb`, a directory, any other file: data).
* the in-process breakdown (`python -m bench.small_file_anatomy [--before TREE] [--after TREE]`):
  a real Store under the real NfsServer on uvloop in one process per tree (its directory first
  on sys.path), nfs-rs saving N files, with probes on the server:
    COMPOUNDs, ops      COMPOUND calls (NfsServer.handle_call, either engine); the ops that
                        ran, by name (the per-op observer: SEQUENCE is not among them, and
                        the ops after a COMPOUND's first error never run, as the wire's
                        count of ops sent has them)
    fdatasyncs          data files and directories (os.fdatasync / os.fsync), the index's
                        (every LMDB commit that wrote pages fdatasyncs data.mdb, sync=True:
                        the growth of Index.txnid; plus every GroupCommit env.sync)
    index commits       the same growth of Index.txnid; batches: BatchCommitter txns
    crossings           hand-offs to another thread the request waits for, each way: 2 per
                        `run_blocking` (loop -> pool -> loop), 2 per batch-committer future
                        waited on (bench/write_crossings.py's definition); since batch ops
                        answer the loop directly (cache/batch.py LoopFuture): 1 per
                        `start_blocking` (loop -> pool), 1 per op handed to the committer
                        from the loop or a worker, 1 per call of the committer into the loop
                        (one per batch and loop, however many of its ops the loop waits for)
    wall split          wall time per file; CPU of the loop thread, the client thread (nfs-rs),
                        the batch committer and the rest (pool); the time spent inside each
                        kind of durable step (data fdatasync, directory fsync, a batch's txn
                        and commit, env.sync) on whichever thread; per op, its time from start
                        to reply (awaits included: where the client waits)
  With --before and --after the two trees run in interleaved rounds (host load hits both).
  --strace also runs `wire_counts` on each tree's server (its syscall counts: a check of the
  probes, which see only the calls made from Python and the commits they infer).

    python -m bench.small_file_anatomy [--before /tmp/sf-before] [--after .] [--files 300]
                                       [--rounds 3] [--strace]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SYNC_CALLS = ("fdatasync", "fsync", "sync_file_range", "msync")
WARMUP_FILES = 10


# ---- from outside: a counting proxy and strace, for any server ------------------------------

class RpcCounter:
    """A TCP proxy on 127.0.0.1 (its own thread and loop) in front of an NFS server that counts
    the client's RPC calls: per procedure, and each COMPOUND's ops by name."""

    def __init__(self, server_port: int):
        self.server_port = server_port
        self.calls = collections.Counter()          # proc number -> calls
        self.ops = collections.Counter()            # op name -> times sent
        self.counting = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="rpc-counter", daemon=True)
        self.port = 0

    def __enter__(self) -> "RpcCounter":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def reset(self, counting: bool = True) -> None:
        with self._lock:
            self.calls.clear()
            self.ops.clear()
            self.counting = counting

    def snapshot(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self.calls), dict(self.ops)

    def _main(self) -> None:
        self._loop = loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()                              # the client is gone: end its pipes
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    async def _conn(self, creader, cwriter) -> None:
        sreader, swriter = await asyncio.open_connection("127.0.0.1", self.server_port)

        async def pipe(reader, writer, parse):
            buf = bytearray()
            try:
                while data := await reader.read(1 << 20):
                    writer.write(data)
                    if parse:
                        buf += data
                        self._records(buf)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
        try:
            await asyncio.gather(pipe(creader, swriter, True), pipe(sreader, cwriter, False))
        except asyncio.CancelledError:              # the proxy stops
            pass

    def _records(self, buf: bytearray) -> None:
        """Consume every complete record of `buf` (single-fragment records, as nfs-rs sends)."""
        while len(buf) >= 4:
            mark = int.from_bytes(buf[:4], "big")
            size = mark & 0x7FFFFFFF
            if len(buf) < 4 + size:
                return
            rec = bytes(buf[4:4 + size])
            del buf[:4 + size]
            self._call(rec)

    def _call(self, rec: bytes) -> None:
        if len(rec) < 24 or int.from_bytes(rec[4:8], "big") != 0:
            return
        proc = int.from_bytes(rec[20:24], "big")
        names: list[str] = []
        if proc == 1:
            off = 24
            for _ in range(2):                      # cred, verf: flavor, opaque body
                n = int.from_bytes(rec[off + 4:off + 8], "big")
                off += 8 + (n + 3) // 4 * 4
            from nfsd.compound import decode_compound
            from nfsd.optable import op_name
            try:
                names = [op_name(op.tag) for op in decode_compound(memoryview(rec)[off:]).ops]
            except Exception:                       # noqa: BLE001 - counted, not decoded
                names = ["(undecoded)"]
        with self._lock:
            if self.counting:
                self.calls[proc] += 1
                self.ops.update(names)


class SyncTrace:
    """strace -f -y attached to `pid` for the sync calls; `stop()` -> calls by kind of file."""

    def __init__(self, pid: int, out: Path):
        self.pid, self.out = pid, out

    def __enter__(self) -> "SyncTrace":
        self.proc = subprocess.Popen(
            ["strace", "-f", "-y", "-e", "trace=" + ",".join(SYNC_CALLS),
             "-o", str(self.out), "-p", str(self.pid)],
            stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:             # "strace: Process N attached"
            line = self.proc.stderr.readline()
            if "attached" in line or not line:
                break
        time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(10)

    def counts(self) -> dict[str, int]:
        self.__exit__()
        kinds: collections.Counter = collections.Counter()
        pat = re.compile(r"\b(" + "|".join(SYNC_CALLS) + r")\((\d+)<([^>]*)>")
        for line in self.out.read_text(errors="replace").splitlines():
            m = pat.search(line)
            if m is None:
                continue
            path = m.group(3)
            kind = ("index" if path.endswith("/data.mdb") else
                    "dir" if os.path.isdir(path) else "data")
            kinds[kind] += 1
        return dict(kinds)


def wire_counts(port: int, pid: int, files: int, workdir: Path, tag: str = "anatomy") -> dict[str, float]:
    """Per small file against the server at `port` (process `pid`): COMPOUNDs, RPC calls, ops
    by name, and the server's sync calls by kind (strace). Needs strace and ptrace rights."""
    from bench.nfsrs_throughput import save_small_file
    from testkit.nfsrs_support import connect, retrying

    payload = os.urandom(4096)
    with RpcCounter(port) as proxy:
        c = connect(proxy.port)
        try:
            retrying(c.mkdir, tag, exist_ok=True)
            for n in range(WARMUP_FILES):
                save_small_file(c, tag, n, payload)
            time.sleep(0.3)                         # lazy bookkeeping of the warm-up lands
            proxy.reset()
            with SyncTrace(pid, workdir / f"strace-{tag}-{pid}.txt") as trace:
                for n in range(WARMUP_FILES, WARMUP_FILES + files):
                    save_small_file(c, tag, n, payload)
                time.sleep(0.1)
                kinds = trace.counts()
            calls, ops = proxy.snapshot()
        finally:
            c.close()
    out = {"COMPOUNDs": calls.get(1, 0) / files, "RPC calls": sum(calls.values()) / files,
           "fdatasyncs": sum(kinds.values()) / files}
    out.update({f"syncs: {k}": v / files for k, v in sorted(kinds.items())})
    out.update({f"op {k}": v / files for k, v in sorted(ops.items())})
    return out


# ---- in process: the probes -------------------------------------------------------------------

CHILD = r'''
import asyncio, collections, glob, json, os, sys, tempfile, threading, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("CKPTGW_ENGINE", "native")
import logging, structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from concurrent.futures import Future
from cache import batch as batch_mod, commit as commit_mod
from cache.store import Store
from nfsd.exports import Exports
from nfsd.server import NfsServer
try:
    from nfsd.eventloop import new_event_loop
except ImportError:
    new_event_loop = asyncio.new_event_loop
import importlib.util                               # the save's one body: the measuring tree's
spec = importlib.util.spec_from_file_location("sf_throughput", os.path.join(sys.argv[3], "bench", "nfsrs_throughput.py"))
from testkit.nfsrs_support import connect, retrying

N = int(sys.argv[1]); STRACE = sys.argv[2] == "1"
C = collections.Counter()       # counts
T = collections.Counter()       # seconds
ops, op_s = collections.Counter(), collections.Counter()
on = [False]

def timed(key, fn):
    def wrap(*a, **k):
        if not on[0]:
            return fn(*a, **k)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[key] += time.perf_counter() - t0
            C[key] += 1
    return wrap

def fd_kind(fd):
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "data"
    return "index" if path.endswith("/data.mdb") else "dir" if os.path.isdir(path) else "data"

real_fdatasync, real_fsync = os.fdatasync, os.fsync
def sync_wrap(real):
    def wrap(fd):
        if not on[0]:
            return real(fd)
        key = "sync " + fd_kind(fd if isinstance(fd, int) else fd.fileno())
        t0 = time.perf_counter()
        try:
            return real(fd)
        finally:
            T[key] += time.perf_counter() - t0
            C[key] += 1
    return wrap
os.fdatasync, os.fsync = sync_wrap(real_fdatasync), sync_wrap(real_fsync)

batch_mod.BatchCommitter._apply = timed("batch txn+commit", batch_mod.BatchCommitter._apply)
commit_mod.GroupCommit._flush = timed("env.sync", commit_mod.GroupCommit._flush)
real_submit = batch_mod.BatchCommitter.submit
def submit(self, fn, *args, durable=True, lazy=False, **kw):
    fut = real_submit(self, fn, *args, durable=durable, lazy=lazy, **kw)
    if kw.get("loop") is not None or kw.get("into") is not None:
        if on[0]:            # answered on the loop (issue 37 point 4): the hand-off to the committer
            C["batch ops answered on the loop"] += 1
    else:
        fut._from_batch = True
    if on[0]:
        C["lazy batch ops" if lazy else "batch ops"] += 1
    return fut
batch_mod.BatchCommitter.submit = submit
if hasattr(batch_mod, "_settle"):
    real_settle = batch_mod._settle
    def settle(settled):     # one call into the loop per batch: the hand-back
        if on[0]:
            C["loop answers"] += 1
        return real_settle(settled)
    batch_mod._settle = settle
real_result = Future.result
def result(self, timeout=None):
    if on[0] and getattr(self, "_from_batch", False):
        C["batch futures waited"] += 1
    return real_result(self, timeout)
Future.result = result
real_wrap = asyncio.wrap_future
def wrap_future(fut, *, loop=None):
    if on[0] and getattr(fut, "_from_batch", False):
        C["batch futures waited"] += 1
    return real_wrap(fut, loop=loop)
asyncio.wrap_future = wrap_future

# COMPOUNDs at handle_call, whichever engine installed it (the native one replaces the class's
# handle_call and never calls _run_compound); the ops by name from the per-op observer below
real_hc = NfsServer.handle_call
async def handle_call(self, call, conn):
    if on[0] and call.proc == 1:
        C["COMPOUNDs"] += 1
    return await real_hc(self, call, conn)
NfsServer.handle_call = handle_call
real_rb = NfsServer.run_blocking
def run_blocking(self, fn, *args):
    if on[0]:
        C["run_blocking"] += 1
    return real_rb(self, fn, *args)
NfsServer.run_blocking = run_blocking
if hasattr(NfsServer, "start_blocking"):
    real_sb = NfsServer.start_blocking
    def start_blocking(self, fn, *args):
        if on[0]:
            C["start_blocking"] += 1
        return real_sb(self, fn, *args)
    NfsServer.start_blocking = start_blocking

def observer(name, status, seconds, nbytes):
    if on[0]:
        ops[name] += 1
        op_s[name] += seconds

def thread_cpu():
    out = {}
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
        try:
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(path.split("/")[-2])] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out

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

d = tempfile.mkdtemp(prefix="ckptgw-anatomy-")
store = Store.open(d + "/c")
ready, box = threading.Event(), {}
def serve():
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = NfsServer(store, Exports.single("/checkpoints", secure=False, root_squash=False))
    server.observer = observer
    loop.run_until_complete(server.start("127.0.0.1", 0))
    box.update(port=server.port, loop=loop, server=server, tid=threading.get_native_id())
    ready.set()
    loop.run_forever()
threading.Thread(target=serve, daemon=True).start()
ready.wait()
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
save_small_file = mod.save_small_file
c = connect(box["port"])
retrying(c.mkdir, "a", exist_ok=True)
payload = os.urandom(4096)
for n in range(20):
    save_small_file(c, "a", n, payload)
time.sleep(0.3)
ix = store.ix
txn0, gsync0, batches0 = ix.txnid, store.committer.syncs, store.batch.batches
cpu0, sw0, pcpu0 = thread_cpu(), ctxsw(), time.process_time()
on[0] = True
t0 = time.perf_counter()
for n in range(20, 20 + N):
    save_small_file(c, "a", n, payload)
wall = time.perf_counter() - t0
on[0] = False
cpu1, sw1, pcpu1 = thread_cpu(), ctxsw(), time.process_time()
txns, gsyncs, batches = ix.txnid - txn0, store.committer.syncs - gsync0, store.batch.batches - batches0
committer = store.batch._thread.native_id if store.batch._thread is not None else None
cpu = {tid: cpu1.get(tid, 0) - cpu0.get(tid, 0) for tid in cpu1}
main_tid = threading.get_native_id()
per = lambda x: x / N
ms = lambda x: x / N * 1e3
out = {
    "COMPOUNDs": per(C["COMPOUNDs"]),
    "ops": {k: per(v) for k, v in sorted(ops.items(), key=lambda kv: -kv[1])},
    "fdatasyncs": per(C["sync data"] + C["sync dir"] + C["sync index"] + txns + gsyncs),
    "fdatasyncs: data files": per(C["sync data"]),
    "fsyncs: directories": per(C["sync dir"]),
    "fdatasyncs: index (commits + env.sync)": per(txns + gsyncs + C["sync index"]),
    "index commits": per(txns),
    "env.syncs": per(gsyncs),
    "batches": per(batches),
    "batch ops (eager)": per(C["batch ops"]),
    "batch ops (lazy)": per(C["lazy batch ops"]),
    "crossings": per(2 * C["run_blocking"] + 2 * C["batch futures waited"] + C["start_blocking"]
                     + C["batch ops answered on the loop"] + C["loop answers"]),
    "run_blocking": per(C["run_blocking"]),
    "start_blocking": per(C["start_blocking"]),
    "batch futures waited": per(C["batch futures waited"]),
    "batch ops answered on the loop": per(C["batch ops answered on the loop"]),
    "loop answers (one per batch and loop)": per(C["loop answers"]),
    "voluntary ctxsw": per(sw1 - sw0),
    "wall ms": ms(wall),
    "CPU ms: loop thread": ms(cpu.get(box["tid"], 0)),
    "CPU ms: client (nfs-rs)": ms(cpu.get(main_tid, 0)),
    "CPU ms: batch committer": ms(cpu.get(committer, 0) if committer else 0),
    "CPU ms: other threads": ms(sum(v for t, v in cpu.items() if t not in (box["tid"], main_tid, committer))),
    "in ms: data fdatasync": ms(T["sync data"]),
    "in ms: directory fsync": ms(T["sync dir"]),
    "in ms: batch txn+commit": ms(T["batch txn+commit"]),
    "in ms: env.sync": ms(T["env.sync"]),
    "op ms": {k: ms(v) for k, v in sorted(op_s.items(), key=lambda kv: -kv[1])},
}
if STRACE:
    from pathlib import Path
    aspec = importlib.util.spec_from_file_location("sf_anatomy", os.path.join(sys.argv[3], "bench", "small_file_anatomy.py"))
    amod = importlib.util.module_from_spec(aspec); aspec.loader.exec_module(amod)
    wire_counts = amod.wire_counts
    wire = wire_counts(box["port"], os.getpid(), max(20, N // 3), Path(d), tag="wire")
    out["strace"] = {k: v for k, v in wire.items() if not k.startswith("op ")}
c.close()
print(json.dumps(out))
os._exit(0)
'''


def anatomy(tree: Path, files: int, strace: bool = False) -> dict:
    """The in-process breakdown per small file of the tree `tree` (a subprocess)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, "-c", CHILD, str(files), "1" if strace else "0", str(REPO)],
                         cwd=tree, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def _flat(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}: "))
        else:
            out[prefix + k] = v
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--before", type=Path, help="a second tree, measured in the same rounds")
    ap.add_argument("--after", type=Path, default=REPO)
    ap.add_argument("--files", type=int, default=300, help="files saved per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strace", action="store_true", help="also count sync calls with strace")
    args = ap.parse_args()
    sides = [("before", args.before), ("after", args.after)] if args.before else [("after", args.after)]
    rows: dict[str, list[dict]] = {s: [] for s, _ in sides}
    for r in range(args.rounds):                 # interleaved: host load hits both alike
        for side, tree in (sides if r % 2 == 0 else sides[::-1]):
            rows[side].append(_flat(anatomy(tree.resolve(), args.files, args.strace)))
    keys: list[str] = []
    for s in rows:
        for row in rows[s]:
            keys += [k for k in row if k not in keys]
    print(f"per small-file save (4 KiB), {args.files} files a round, median of {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'':52}" + "".join(f"{s:>12}" for s in rows))
    for k in keys:
        print(f"{k:52}" + "".join(f"{_median([row.get(k, 0.0) for row in rows[s]]):12.2f}" for s in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
