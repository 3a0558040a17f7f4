"""A checkpoint-like NFSv4.1 workload with a model of what the server acknowledged.

Each worker (one NFS session, its own directory `w<i>/`) runs one RPC at a time (except
pipelined UNSTABLE writes to one file, which promise nothing until the COMMIT), so at most
one of its namespace operations is in flight when the server dies. The model keeps:

* `state`: every path the worker's acknowledged operations left, as DIR or a FileExp;
* `pending`: the one namespace operation sent but not answered, as the paths it would
  change (`after`); after a crash it either happened completely or not at all.

A FileExp says what a file may hold: `data[:L]` for some lo <= L <= hi. `lo` is what was
acknowledged durable (a COMMIT reply, or a FILE_SYNC WRITE reply: RFC 8881 18.32/18.3);
`hi` is everything sent. Anything else (other bytes, a longer file, a half-done rename) is
a failure. After each verification the model is tightened to what was observed, because
recovery makes that durable (so the same model keeps checking across kill points).
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from testkit.nfsclient import NfsClient, NfsStatusError, check, op
from nfsd.xdr.nfs4 import (
    CREATE4args, FATTR4_SIZE, FATTR4_TYPE, FILE_SYNC4, GETATTR4args, LOOKUP4args, NF4DIR,
    NF4REG, OP_CREATE, OP_GETATTR, OP_GETFH, OP_LOOKUP, OP_PUTFH, OP_READ, OPEN4_SHARE_ACCESS_WRITE,
    PUTFH4args, READ4args, UNSTABLE4, createtype4, fattr4, stateid4,
)
from testkit.nfsclient import bitmap, decode_attrs

DIR = "dir"
ANON_STATEID = stateid4(0, bytes(12))
CHUNK = 32 * 1024
MAX_FILE = 192 * 1024            # every file fits in one READ (the server's MAX_IO is 1 MiB)
PIPELINE = 4                     # UNSTABLE writes in flight at once (pipelined episodes)
FINAL_NAMES = 4                  # renames land on a small set of names: most replace a file


@dataclass(eq=False)
class FileExp:
    data: bytes
    lo: int = 0                  # acknowledged durable length
    hi: int = 0                  # length sent so far

    def accepts(self, content: bytes) -> bool:
        return self.lo <= len(content) <= self.hi and content == self.data[:len(content)]

    def describe(self, content: bytes | None = None) -> str:
        got = "" if content is None else f" got {len(content)} bytes" + (
            "" if content == self.data[:len(content)] else " (NOT a prefix of the written data)")
        return f"file of {len(self.data)} bytes, acked {self.lo}, sent {self.hi}{got}"


@dataclass
class Stats:
    acked: int = 0               # acknowledged operations since the start
    verified: int = 0            # acknowledged operations whose effect a verification checked
    unacked_applied: int = 0     # in-flight namespace ops found applied after a crash
    unacked_absent: int = 0      # ... and found not applied
    uncommitted_bytes_dropped: int = 0
    episodes: int = 0


@dataclass
class Worker:
    index: int
    rng: random.Random
    state: dict = field(default_factory=dict)       # path -> DIR | FileExp (present paths)
    pending: dict | None = None                     # path -> DIR | FileExp | None (absent)
    acked_since_verify: int = 0
    counter: int = 0

    @property
    def root(self) -> str:
        return f"w{self.index}"

    def new_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def new_data(self) -> bytes:
        size = self.rng.choice([0, 1, 100, 4096, CHUNK, CHUNK + 1, 3 * CHUNK + 17,
                                self.rng.randrange(1, MAX_FILE)])
        return self.rng.randbytes(size)


class Workload:
    """The model for `nworkers` workers plus the code that drives and verifies them."""

    def __init__(self, nworkers: int, seed: int):
        self.rng = random.Random(seed)
        self.workers = [Worker(i, random.Random(seed * 1000 + i)) for i in range(nworkers)]
        self.stats = Stats()
        self.failures: list[str] = []
        self.verifiers: list[bytes] = []     # the write verifier seen in each server run

    # ---- driving ----------------------------------------------------------------------
    async def run(self, port: int, *, stop_after: float | None = None) -> None:
        """Run every worker until the server goes away (or stop_after seconds pass)."""
        seen_verifier: set[bytes] = set()
        tasks = [asyncio.create_task(self._run_worker(w, port, seen_verifier))
                 for w in self.workers]
        try:
            if stop_after is None:
                await asyncio.gather(*tasks)
            else:
                done, _ = await asyncio.wait(tasks, timeout=stop_after)
                for t in done:
                    t.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if len(seen_verifier) > 1:
            self.failures.append(f"one server run answered with several write verifiers: "
                                 f"{sorted(v.hex() for v in seen_verifier)}")
        self.verifiers.extend(seen_verifier)

    async def _run_worker(self, w: Worker, port: int, verifiers: set) -> None:
        try:
            c = await NfsClient.connect("127.0.0.1", port)
        except OSError:
            return                                  # the server is already gone
        # Race the work against the connection's end: a call the test client starts after
        # it saw the connection close would wait for a reply forever.
        session = asyncio.ensure_future(self._session(c, w, verifiers))
        try:
            await asyncio.wait({session, c.closed}, return_when=asyncio.FIRST_COMPLETED)
            if session.done():
                session.result()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            return                                  # killed: the pending op stays unknown
        except NfsStatusError as e:
            self.failures.append(f"worker {w.index}: unexpected NFS error {e}")
        finally:
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)
            await c.close()

    async def _session(self, c: NfsClient, w: Worker, verifiers: set) -> None:
        await c.setup_session()
        base = await c.lookup_path("/checkpoints")
        if w.root not in w.state:
            await self._namespace(w, {w.root: DIR}, self._mkdir(c, base, w.root))
        while True:
            self.stats.episodes += 1
            await self._episode(c, w, verifiers)

    async def _episode(self, c: NfsClient, w: Worker, verifiers: set) -> None:
        base = await c.lookup_path("/checkpoints")
        wdir = await self._lookup(c, base, w.root)
        kind = w.rng.choices(["ckpt", "filesync", "unstable", "dir", "remove"],
                             weights=[5, 2, 1, 1, 2])[0]
        if kind == "ckpt":
            await self._checkpoint(c, w, wdir, verifiers)
        elif kind == "filesync":
            name = w.new_name("s")
            await self._write_file(c, w, wdir, name, f"{w.root}/{name}", FILE_SYNC4, verifiers)
        elif kind == "unstable":
            name = w.new_name("u")
            await self._write_file(c, w, wdir, name, f"{w.root}/{name}", UNSTABLE4, verifiers,
                                   commit=False)
        elif kind == "dir":
            await self._dir_episode(c, w, wdir, verifiers)
        else:
            await self._remove_one(c, w, wdir)

    # ---- episodes -------------------------------------------------------------------------
    async def _checkpoint(self, c, w, wdir, verifiers) -> None:
        """tmp + UNSTABLE writes + COMMIT + rename over a final name (the save pattern)."""
        tmp = w.new_name("tmp")
        path = f"{w.root}/{tmp}"
        await self._write_file(c, w, wdir, tmp, path, UNSTABLE4, verifiers, commit=True)
        final = f"final{w.rng.randrange(FINAL_NAMES)}"
        exp = w.state[path]
        await self._namespace(w, {path: None, f"{w.root}/{final}": exp},
                              c.rename(wdir, tmp, wdir, final))

    async def _dir_episode(self, c, w, wdir, verifiers) -> None:
        """mkdir a tmp dir, a FILE_SYNC file in it, rename the dir to its final name."""
        tmp = w.new_name("dtmp")
        dpath = f"{w.root}/{tmp}"
        dfh = await self._namespace(w, {dpath: DIR}, self._mkdir(c, wdir, tmp))
        await self._write_file(c, w, dfh, "f", f"{dpath}/f", FILE_SYNC4, verifiers)
        final = w.new_name("dir")
        moved = {p: None for p in w.state if p == dpath or p.startswith(dpath + "/")}
        moved.update({f"{w.root}/{final}" + p[len(dpath):]: w.state[p] for p in list(moved)})
        await self._namespace(w, moved, c.rename(wdir, tmp, wdir, final))

    async def _remove_one(self, c, w, wdir) -> None:
        top = sorted(p for p in w.state if p.count("/") == 1)
        if not top:
            return
        path = w.rng.choice(top)
        name = path.split("/", 1)[1]
        if w.state[path] is DIR:                       # empty it first (REMOVE of a dir needs it)
            dfh = await self._lookup(c, wdir, name)
            for child in sorted(p for p in w.state if p.startswith(path + "/")):
                await self._namespace(w, {child: None}, c.remove(dfh, child.rsplit("/", 1)[1]))
        await self._namespace(w, {path: None}, c.remove(wdir, name))

    async def _write_file(self, c, w, dfh, name, path, stable, verifiers, *, commit=False) -> None:
        """OPEN(create) a new file, write it in chunks, COMMIT if asked, CLOSE."""
        data = w.new_data()
        exp = FileExp(data)
        create = c.open_create(dfh, name, access=OPEN4_SHARE_ACCESS_WRITE)
        fh, stateid = await self._namespace(w, {path: exp}, create)
        pipelined = stable == UNSTABLE4 and commit and w.rng.random() < 0.5
        if pipelined:
            await self._write_pipelined(c, w, fh, stateid, exp, verifiers)
        for off in range(0, 0 if pipelined else len(data), CHUNK):
            chunk = data[off:off + CHUNK]
            exp.hi = off + len(chunk)                  # may be there from now on
            res = await c.write(fh, stateid, off, chunk, stable)
            verifiers.add(bytes(res.writeverf))
            self._ack(w)
            if res.committed != UNSTABLE4:
                exp.lo = exp.hi                        # FILE_SYNC reply: durable
        if commit and data:
            verifiers.add(bytes(await c.commit(fh)))
            self._ack(w)
            exp.lo = exp.hi
        await c.close_file(fh, stateid)

    async def _write_pipelined(self, c, w, fh, stateid, exp: FileExp, verifiers) -> None:
        """UNSTABLE chunks with up to PIPELINE in flight at once, as the Linux client sends
        them; they may land in any order, so nothing of the file is durable until COMMIT."""
        exp.hi = len(exp.data)
        window = asyncio.Semaphore(PIPELINE)

        async def send(off: int) -> None:
            async with window:
                res = await c.write(fh, stateid, off, exp.data[off:off + CHUNK], UNSTABLE4)
            verifiers.add(bytes(res.writeverf))
            self._ack(w)
        await asyncio.gather(*(send(off) for off in range(0, len(exp.data), CHUNK)))

    # ---- helpers ------------------------------------------------------------------------
    def _ack(self, w: Worker) -> None:
        self.stats.acked += 1
        w.acked_since_verify += 1

    async def _namespace(self, w: Worker, after: dict, call):
        """Send one namespace op; until its reply arrives it is `pending`."""
        w.pending = after
        result = await call
        for path, exp in after.items():
            if exp is None:
                w.state.pop(path, None)
            else:
                w.state[path] = exp
        w.pending = None
        self._ack(w)
        return result

    async def _mkdir(self, c, dfh, name: str) -> bytes:
        res = check(await c.compound([op(OP_PUTFH, PUTFH4args(dfh)),
                                      op(OP_CREATE, CREATE4args(createtype4(NF4DIR), name.encode(),
                                                                fattr4([], b""))),
                                      op(OP_GETFH)]))
        return res.resarray[2].value.value.object

    @staticmethod
    async def _lookup(c, dfh, name: str) -> bytes:
        res = check(await c.compound([op(OP_PUTFH, PUTFH4args(dfh)),
                                      op(OP_LOOKUP, LOOKUP4args(name.encode())), op(OP_GETFH)]))
        return res.resarray[2].value.value.object

    # ---- verification -----------------------------------------------------------------------
    async def verify(self, port: int) -> None:
        """Compare what the server holds with the model; tighten the model to what it holds."""
        c = await NfsClient.connect("127.0.0.1", port)
        try:
            await c.setup_session()
            base = await c.lookup_path("/checkpoints")
            top = {bytes(n).decode() for n, _, _ in await c.readdir(base)}
            strays = top - {w.root for w in self.workers}
            if strays:
                self.failures.append(f"unexpected names in the export: {sorted(strays)}")
            await asyncio.gather(*(self._verify_worker(c, base, w) for w in self.workers))
        finally:
            await c.close()

    async def _verify_worker(self, c, base, w: Worker) -> None:
        actual: dict = {}
        if w.root in {bytes(n).decode() for n, _, _ in await c.readdir(base)}:
            actual[w.root] = DIR
            await self._walk(c, await self._lookup(c, base, w.root), w.root, actual)
        self.judge(w, actual)

    def judge(self, w: Worker, actual: dict) -> None:
        """Check `actual` (path -> DIR | file bytes, the worker's tree as the server holds it)
        against the worker's acknowledged history; record failures; go on from `actual`."""
        candidates = [dict(w.state)]
        if w.pending is not None:
            applied = dict(w.state)
            for path, exp in w.pending.items():
                if exp is None:
                    applied.pop(path, None)
                else:
                    applied[path] = exp
            candidates.append(applied)
        problems = [self._compare(cand, actual) for cand in candidates]
        best = min(range(len(candidates)), key=lambda i: len(problems[i]))
        if problems[best]:
            self.failures.append(f"worker {w.index}: server state matches no acknowledged "
                                 f"history (pending={sorted(w.pending or {})}): "
                                 + "; ".join(problems[best][:8]))
            w.state = {p: (DIR if v is DIR else FileExp(v, len(v), len(v)))
                       for p, v in actual.items()}     # go on from what is there
        else:
            if w.pending is not None:
                if best == 1:
                    self.stats.unacked_applied += 1
                else:
                    self.stats.unacked_absent += 1
            w.state = candidates[best]
            for path, exp in w.state.items():
                if exp is not DIR:
                    self.stats.uncommitted_bytes_dropped += exp.hi - len(actual[path])
                    exp.lo = exp.hi = len(actual[path])    # recovery made this durable
        w.pending = None
        self.stats.verified += w.acked_since_verify
        w.acked_since_verify = 0

    @staticmethod
    def _compare(expected: dict, actual: dict) -> list[str]:
        out = []
        for path in sorted(set(expected) | set(actual)):
            exp, got = expected.get(path), actual.get(path)
            if exp is None:
                out.append(f"{path}: should not exist, found a " +
                           ("dir" if got is DIR else f"file of {len(got)} bytes"))
            elif got is None:
                out.append(f"{path}: acknowledged but missing")
            elif (exp is DIR) != (got is DIR):
                out.append(f"{path}: wrong type")
            elif exp is not DIR and not exp.accepts(got):
                out.append(f"{path}: {exp.describe(got)}")
        return out

    async def _walk(self, c, dfh, path: str, out: dict) -> None:
        for name, attrs, _ in await c.readdir(dfh, attrs=(FATTR4_TYPE,)):
            child = f"{path}/{bytes(name).decode()}"
            if attrs.get("type") == NF4DIR:
                out[child] = DIR
                await self._walk(c, await self._lookup(c, dfh, child.rsplit("/", 1)[1]), child, out)
            else:
                out[child] = await self._read_whole(c, dfh, bytes(name))

    @staticmethod
    async def _read_whole(c, dfh, name: bytes) -> bytes:
        res = check(await c.compound([
            op(OP_PUTFH, PUTFH4args(dfh)), op(OP_LOOKUP, LOOKUP4args(name)),
            op(OP_GETATTR, GETATTR4args(bitmap(FATTR4_TYPE, FATTR4_SIZE))),
            op(OP_READ, READ4args(ANON_STATEID, 0, MAX_FILE + 1))]))
        attrs = decode_attrs(res.resarray[2].value.value.obj_attributes)
        ok = res.resarray[3].value.value
        data = bytes(ok.data)
        if attrs["type"] != NF4REG or len(data) != attrs["size"] or not ok.eof:
            raise AssertionError(f"{name!r}: size {attrs['size']} but READ gave {len(data)} bytes "
                                 f"(eof={ok.eof}, type={attrs['type']})")
        return data
