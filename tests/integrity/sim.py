"""The simulation the integrity model test drives: the real Store and the real Uploader's
job code against testkit.fakes3, with every S3 request held until the test grants it.

No thread decides an interleaving here. The uploader's scheduler pass (`_enqueue_ready`,
`_dispatch`) is called by the test; each job it starts runs as a task on the simulation's
own event loop, and every S3 request of that task (a PUT, one multipart part, a copy, a
delete) stops at `StepGate.call` until the test grants exactly that request. Store calls the
uploader would send to a thread run inline. So the test chooses, request by request, how
uploads, namespace jobs, client operations, faults, evictions, read-throughs and kill -9
interleave, and a failing sequence replays exactly.

A reference model (plain objects) holds what the clients were told: every byte written
(cut to the committed size by a kill -9, as tests/cache/test_model.py does), the names,
links and symlinks. `check()` states the integrity invariants of issue 13 against the store
and the fake bucket's full history; `drain()` runs every job to the end and `check_drained()`
states that the bucket equals the namespace.
"""
from __future__ import annotations

import asyncio
import contextvars
import errno
import hashlib
import logging
import random
import shutil
import stat
import tempfile
from dataclasses import dataclass, field

import structlog

from cache.api import DataState, FileType, ROOT_INO, SetAttr, StoreError
from cache.replies import REMOVE, RENAME, ReplyNote
from cache.store import Store
from uploader.jobs import NS, UPLOAD
from uploader.keys import DIR_CONTENT_TYPE, INO_META
from uploader.objectclient import NotFoundError, ObjectClientError, TransientError, classify, may_have_applied
from uploader.service import Uploader
from uploader.settings import UploadSettings

from tests.cache.storehelp import crash
from tests.integrity import counters
from testkit.fakes3 import FakeS3

SCRATCH = "/dev/shm"
SETTLE_SECONDS = 3600.0      # the settle window: nothing written during a test run is ever quiet that long
MODEL_CLIENT = b"model-client"  # the NFS client whose renames and removes keep reply records
REPLY_KEEP = 2                  # its records kept: few, so the bound is exercised
MODEL_NOTE = ReplyNote(MODEL_CLIENT, b"verifier", b"instance", REPLY_KEEP)
AUTO_ATTEMPTS = 3            # a client-side request (read-through, import) gives up after this many faults
JOB = contextvars.ContextVar("sim_job", default=None)
GRAVEYARD: list = []         # tasks of killed simulated processes (see Sim._abandon_loop)


def is_temp(path: str) -> bool:
    """A temporary name: any component ending in .tmp (save-then-rename checkpoints)."""
    return any(p.endswith(".tmp") for p in path.strip("/").split("/"))


async def _inline_to_thread(fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


# ---- the gate that holds every request ------------------------------------------------
@dataclass(eq=False)
class Pending:
    op: str
    what: str
    job: int | None
    fut: asyncio.Future


class _Limiter:            # what status() reads of a RequestGate
    limit = 1.0
    in_flight = 0


class StepGate:
    """RequestGate's interface; each attempt of each request waits for `Sim.grant`. With
    auto=True requests go at once (a client's own read: read-through, import) and transient
    errors are retried AUTO_ATTEMPTS times, then given back (the NFS server answers DELAY)."""

    def __init__(self, sim: "Sim", auto: bool = False):
        self.sim = sim
        self.auto = auto
        self.limiter = _Limiter()
        self.waiting_retry = 0

    def close(self) -> None:
        pass

    async def call(self, op, fn, *, nbytes=0, what="", retry_not_found=False, priority=0, max_attempts=0,
                   on_send=None, on_done=None, recheck=None, recheck_op="HeadObject"):
        attempt = 0
        unsure = False           # as the real gate: recheck (a request of its own) only after
        while True:              # a failure S3 may have applied with its reply lost
            if unsure and recheck is not None:
                found = await self.call(recheck_op, recheck, what=what, priority=priority,
                                        max_attempts=max_attempts)
                if found is not None:
                    return found
            unsure = False
            if not self.auto:
                req = Pending(op, what, JOB.get(), asyncio.get_running_loop().create_future())
                self.sim.pending.append(req)
                await req.fut
            if on_send:
                on_send()
            try:
                result = fn()
            except Exception as exc:      # noqa: BLE001 - classified as the real gate does
                err = classify(exc)
            else:
                self.sim.granted_ok += 1
                return result
            finally:
                if on_done:
                    on_done()
            if isinstance(err, NotFoundError):
                if not retry_not_found:
                    raise err
            elif not isinstance(err, TransientError):
                raise err
            unsure = may_have_applied(err)
            attempt += 1
            if (max_attempts and attempt >= max_attempts) or (self.auto and attempt >= AUTO_ATTEMPTS):
                raise err


# ---- the reference model --------------------------------------------------------------
class MFile:
    def __init__(self, ino: int):
        self.ino = ino
        self.data = bytearray()
        self.committed = 0
        self.durable = bytearray()      # the bytes as of the last durable point (len == committed)
        self.nlink = 1

    def made_durable(self) -> None:
        self.committed = len(self.data)
        self.durable = bytearray(self.data)


class MLink:
    def __init__(self, ino: int, target: bytes):
        self.ino = ino
        self.target = target


class MDir:
    def __init__(self, ino: int):
        self.ino = ino
        self.entries: dict[str, object] = {}


@dataclass
class Violation(AssertionError):
    what: str

    def __str__(self) -> str:
        return self.what


@dataclass
class Stats:
    steps: int = 0
    grants: int = 0
    drains: int = 0
    kills: int = 0
    evictions: int = 0
    read_throughs: int = 0
    imports: int = 0
    job_errors: list = field(default_factory=list)


class Sim:
    def __init__(self, *, seed: int = 0, multipart_threshold: int = 4096, part_size: int = 1024,
                 check_settle: bool = True, check_held: bool = True, check_temp_dirs: bool = True):
        self.dir = tempfile.mkdtemp(prefix="ckptgw-integ-", dir=SCRATCH)
        self.fake = FakeS3(seed=seed)
        self.fake.origin_of = self._origin_of
        self.settings = UploadSettings(settle_seconds=SETTLE_SECONDS, part_size_min=part_size,
                                       multipart_threshold=multipart_threshold, allow_small_parts=True,
                                       max_concurrency=4, abort_orphan_uploads=True)
        self.check_settle = check_settle
        self.check_held = check_held
        self.check_temp_dirs = check_temp_dirs
        self.rng = random.Random(seed)
        self.stats = Stats()
        self.root = MDir(ROOT_INO)
        self.contents: dict[bytes, set] = {}     # sha256 of a whole file content -> {(ino, data_seq)}
        self.names: dict[tuple, set] = {}        # (ino, data_seq) -> every path it was seen under
        self.held: dict[str, int] = {}           # paths S3 must keep an object at -> the file (see check)
        self.unimported: set[str] = set()        # external objects an import failed to bring in
        self.flush_windows: list[tuple[int, int]] = []   # version seqs stored during drains
        self.pending: list[Pending] = []
        self.granted_ok = 0
        self._seen_seq = 0
        self._saved_to_thread = asyncio.to_thread
        self._saved_logging = structlog.get_config()
        # thousands of uploads per run: only errors are worth printing
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        asyncio.to_thread = _inline_to_thread
        self.store = Store.open(self.dir)
        # the client's renames and removes record their answers (cache/replies.py, issue 38):
        # `replies` is what the store must hold for it, through kills, the newest REPLY_KEEP
        self.store.put_client_record(MODEL_CLIENT, b"\x01\x01")
        self.replies: list[tuple] = []
        self._boot()

    # ---- process lifecycle -------------------------------------------------------------
    def _boot(self) -> None:
        """Start the uploader as a fresh process would (Uploader.start without its timers)."""
        # the stdlib loop whatever the policy (tests/conftest.py sets uvloop's): settle()
        # tells idle from busy by its ready queue, which uvloop does not expose
        self.loop = asyncio.SelectorEventLoop()
        self.pending = []
        self.tasks: dict[int, asyncio.Task] = {}
        self.up = self.loop.run_until_complete(self._make_uploader())
        jobs = self.store.queue_list(1 << 30)
        self.up._upload_inos = {j["ino"] for _, j in jobs if j.get("kind") == UPLOAD}
        self.up._started = True
        self.sweeper = self.loop.create_task(self.up._orphan_sweeper(jobs))
        self.settle()

    async def _make_uploader(self) -> Uploader:
        up = Uploader(self.store, self.fake, self.settings, prefix="")
        for g in (up.gate, up.readthrough.gate):
            g.close()
        up.gate = up.worker.gate = StepGate(self)
        up.readthrough.gate = StepGate(self, auto=True)
        run = up._run

        async def tagged_run(job_id, job):
            JOB.set(job_id)
            try:
                await run(job_id, job)
            finally:
                self.tasks.pop(job_id, None)

        def start(job_id, job):
            up._running_jobs[job_id] = job
            task = self.loop.create_task(tagged_run(job_id, job))
            up._running[job_id] = task
            self.tasks[job_id] = task
        up._start = start
        self._wrap_job_errors(up)
        return up

    def _wrap_job_errors(self, up) -> None:
        """A job that failed with an unexpected exception (the service logs job_failed) is a
        bug: remember it so check() reports it."""
        import uploader.service as service
        sim = self
        self._saved_log = getattr(self, "_saved_log", service.log)

        class Log:
            def __getattr__(self, name):
                return getattr(sim._saved_log, name)

            def exception(self, event, **kw):
                import sys
                sim.stats.job_errors.append((event, kw, repr(sys.exc_info()[1])))
        service.log = Log()

    def close(self) -> None:
        self._abandon_loop()
        if not self.store._closed:
            self.store.close()
        asyncio.to_thread = self._saved_to_thread
        structlog.configure(**self._saved_logging)
        counters.add(self.stats)
        import uploader.service as service
        service.log = self._saved_log
        shutil.rmtree(self.dir, ignore_errors=True)

    def _abandon_loop(self) -> None:
        """The process is gone: its tasks never run again. They are kept referenced for the
        session (GRAVEYARD) so the garbage collector never closes their coroutines, which
        would run their cleanup handlers, something a killed process never does."""
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t._log_destroy_pending = False
        GRAVEYARD.append((self.loop, tasks, self.up))
        self.loop.close()

    def kill9(self) -> None:
        """The gateway process dies: no final sync, no orderly close, tasks never run again;
        S3 keeps what it applied. Then it restarts and recovers."""
        self.stats.kills += 1
        self._abandon_loop()
        crash(self.store)
        self.store = Store.open(self.dir)
        for f in self.files():
            if len(f.data) > f.committed:
                del f.data[f.committed:]
            self._crashed_overwrites(f)
            f.made_durable()
            self._register(f)
        self._boot()

    def _crashed_overwrites(self, f: MFile) -> None:
        """An UNSTABLE overwrite of durable bytes may or may not outlive a crash (nothing was
        promised for it): the data file has it (the page cache outlives the process) unless the
        range had been evicted and its record was still pending, where the index says ABSENT
        again and the object's bytes, the durable ones, come back. Either is right; anything
        else is a violation. The model takes what the store kept."""
        changed = [i for i in range(len(f.data)) if f.data[i] != f.durable[i]]
        if not changed:
            return
        for e in self.store.extents(f.ino):
            span = [i for i in changed if e.offset <= i < e.offset + e.length]
            if not span:
                continue
            if e.state == DataState.ABSENT:
                for i in span:
                    f.data[i] = f.durable[i]
                continue
            got, _ = self.store.read(f.ino, e.offset, e.length)
            got = bytes(got)
            for i in span:
                b = got[i - e.offset]
                if b not in (f.data[i], f.durable[i]):
                    raise Violation(f"ino {f.ino}: byte {i} after a crash is {b}, neither the written "
                                    f"{f.data[i]} nor the durable {f.durable[i]}")
                f.data[i] = b

    def run(self, coro, timeout: float = 30.0):
        """Run a client-side call to its end; one that waits for ever is a bug (a hang)."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))
        except TimeoutError:
            raise Violation(f"{coro!r} did not finish within {timeout} s (hang)") from None

    def settle(self) -> None:
        """Run the loop until every task waits for a grant (or is done), with every op queued
        to the store's batch committer applied (queue_done is not waited for by the uploader):
        hypothesis replays an example and needs the same state at each draw, not one that
        depends on how far that thread got (and a kill must not race it)."""
        async def idle():
            for _ in range(10_000):
                await asyncio.sleep(0)
                if not self.loop._ready:
                    return
        self.loop.run_until_complete(idle())
        self.store.batch.applied()
        self.loop.run_until_complete(idle())
        self.pending = [p for p in self.pending if not p.fut.done()]

    # ---- model helpers ------------------------------------------------------------------
    def walk(self):
        """(path, node) of everything in the model namespace (dirs before their entries)."""
        out, todo = [], [("", self.root)]
        while todo:
            path, d = todo.pop()
            for name, node in d.entries.items():
                p = f"{path}/{name}" if path else name
                out.append((p, node))
                if isinstance(node, MDir):
                    todo.append((p, node))
        return out

    def files(self) -> list[MFile]:
        seen = {}
        for _, n in self.walk():
            if isinstance(n, MFile):
                seen[n.ino] = n
        return list(seen.values())

    def paths(self, kind=None) -> list[str]:
        return [p for p, n in self.walk() if kind is None or isinstance(n, kind)]

    def node(self, path: str):
        cur = self.root
        for part in [p for p in path.split("/") if p]:
            if not isinstance(cur, MDir) or part not in cur.entries:
                return None
            cur = cur.entries[part]
        return cur

    def _parent(self, path: str) -> tuple[MDir, str]:
        head, _, name = path.rpartition("/")
        parent = self.node(head) if head else self.root
        assert isinstance(parent, MDir), path
        return parent, name

    def _register(self, f: MFile) -> None:
        seq = self.store.getattr(f.ino).data_seq
        self.contents.setdefault(hashlib.sha256(f.data).digest(), set()).add((f.ino, seq))
        self._note_names()

    def _note_names(self) -> None:
        """Every file version's current paths (invariant 6): after each op that changes a file's
        bytes or names, so a state between two checks counts too."""
        for p, n in self.walk():
            if isinstance(n, MFile):
                self.names.setdefault((n.ino, self.store.getattr(n.ino).data_seq), set()).add(p)

    def _origin_of(self, body: bytes, metadata: dict) -> frozenset:
        return frozenset(self.contents.get(hashlib.sha256(body).digest(), ()))

    def payload(self, n: int) -> bytes:
        """Bytes that occur nowhere else (so an object's bytes name the file version)."""
        return self.rng.randbytes(n)

    def _drop_held_under(self, path: str) -> None:
        self.held = {p: i for p, i in self.held.items() if p != path and not p.startswith(path + "/")}

    def _expect(self, code, fn, *args):
        try:
            fn(*args)
        except StoreError as e:
            assert e.errno == code, (fn.__name__, args, e)
            return
        raise AssertionError(f"{fn.__name__}{args} did not fail with {errno.errorcode[code]}")

    # ---- client operations (by path) -----------------------------------------------------
    def create(self, path: str) -> None:
        parent, name = self._parent(path)
        cur = parent.entries.get(name)
        if cur is not None:
            if isinstance(cur, MFile):
                self.store.create(parent.ino, name.encode(), 0o644, 0, 0)
            else:
                self._expect(errno.EISDIR if isinstance(cur, MDir) else errno.EEXIST,
                             self.store.create, parent.ino, name.encode(), 0o644, 0, 0, )
            return
        a, _, created = self.store.create(parent.ino, name.encode(), 0o644, 0, 0)
        assert created
        f = MFile(a.ino)
        parent.entries[name] = f
        self._register(f)

    def mkdir(self, path: str) -> None:
        parent, name = self._parent(path)
        if name in parent.entries:
            self._expect(errno.EEXIST, self.store.mkdir, parent.ino, name.encode(), 0o755, 0, 0)
            return
        a, _ = self.store.mkdir(parent.ino, name.encode(), 0o755, 0, 0)
        parent.entries[name] = MDir(a.ino)

    def symlink(self, path: str, target: bytes) -> None:
        parent, name = self._parent(path)
        if name in parent.entries:
            self._expect(errno.EEXIST, self.store.symlink, parent.ino, name.encode(), target, 0o777, 0, 0)
            return
        a, _ = self.store.symlink(parent.ino, name.encode(), target, 0o777, 0, 0)
        parent.entries[name] = MLink(a.ino, target)

    def write(self, path: str, offset: int, data: bytes, stable: bool = False) -> None:
        """An UNSTABLE write, or (stable) a FILE_SYNC one: durable with every byte written
        before it, as a WRITE then a COMMIT. An UNSTABLE one as nfsd's WRITE does it: answered
        before its index record when it can (cache/store.py I5), else write()."""
        f = self.node(path)
        if stable:
            self.store.write_stable(f.ino, offset, data)
        elif not self.store.write_nowait(f.ino, offset, data):
            self.store.write(f.ino, offset, data)
        if len(f.data) < offset:
            f.data.extend(bytes(offset - len(f.data)))
        f.data[offset:offset + len(data)] = data
        if stable:
            f.made_durable()
        self._register(f)

    def commit(self, path: str) -> None:
        f = self.node(path)
        self.store.commit(f.ino)
        f.made_durable()

    def save(self, path: str, data: bytes) -> None:
        """create + write + commit: a checkpoint file saved whole."""
        self.create(path)
        self.write(path, 0, data)
        self.commit(path)

    def truncate(self, path: str, size: int) -> None:
        f = self.node(path)
        self.store.setattr(f.ino, SetAttr(size=size))
        if size < len(f.data):
            del f.data[size:]
        else:
            f.data.extend(bytes(size - len(f.data)))
        f.made_durable()                 # SETATTR(size) is durable whatever the size (README)
        self._register(f)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        self.store.setattr(self.node(path).ino, SetAttr(mtime_ns=mtime_ns))

    def rename(self, src: str, dst: str) -> None:
        sd, sname = self._parent(src)
        dd, dname = self._parent(dst)
        s, d = sd.entries.get(sname), dd.entries.get(dname)
        args = (sd.ino, sname.encode(), dd.ino, dname.encode())
        code = None
        if s is None:
            code = errno.ENOENT
        elif s is d:
            self._noted("rename", s.ino, *args)
            return
        elif d is not None and isinstance(s, MDir) and not isinstance(d, MDir):
            code = errno.ENOTDIR
        elif d is not None and isinstance(s, MDir) and d.entries:
            code = errno.ENOTEMPTY
        elif d is not None and not isinstance(s, MDir) and isinstance(d, MDir):
            code = errno.EISDIR
        elif isinstance(s, MDir) and (dst == src or dst.startswith(src + "/")):
            code = errno.EINVAL
        if code is not None:
            self._expect(code, self._noted, "rename", 0, *args)
            return
        self._noted("rename", s.ino, *args)
        if d is not None:
            del dd.entries[dname]
            if isinstance(d, MFile):
                d.nlink -= 1
        del sd.entries[sname]
        dd.entries[dname] = s
        self._drop_held_under(src)
        if isinstance(s, MDir):
            self._drop_held_under(dst)
        self._note_names()

    def _noted(self, op: str, ino: int, *args):
        """The client's RENAME or REMOVE with its reply record; the model's record once it
        succeeded (a failed op records nothing)."""
        result = self.store.submit_noted(op, MODEL_NOTE, *args).result()
        if op == "rename":
            self.replies.append((RENAME, *args, ino))
        else:
            self.replies.append((REMOVE, *args, 0, b"", ino))
        del self.replies[:-REPLY_KEEP]
        return result

    def link(self, src: str, dst: str) -> None:
        f = self.node(src)
        dd, dname = self._parent(dst)
        if dname in dd.entries:
            self._expect(errno.EEXIST, self.store.link, f.ino, dd.ino, dname.encode())
            return
        self.store.link(f.ino, dd.ino, dname.encode())
        dd.entries[dname] = f
        f.nlink += 1
        self._note_names()

    def remove(self, path: str) -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            self._expect(errno.ENOENT, self._noted, "remove", 0, parent.ino, name.encode())
            return
        if isinstance(node, MDir) and node.entries:
            self._expect(errno.ENOTEMPTY, self._noted, "remove", 0, parent.ino, name.encode())
            return
        self._noted("remove", node.ino, parent.ino, name.encode())
        del parent.entries[name]
        if isinstance(node, MFile):
            node.nlink -= 1
        self._drop_held_under(path)

    # ---- cache operations ----------------------------------------------------------------
    def evict(self, path: str) -> None:
        f = self.node(path)
        if self.store.evict(f.ino):
            self.stats.evictions += 1

    def read_through(self, path: str) -> bytes | None:
        """Read the whole file as the NFS server does: fetch ABSENT ranges (read-through),
        then read. Returns the bytes, or None when S3 could not be reached (the client is told
        to retry: NFS4ERR_DELAY). Wrong bytes or a lost object fail."""
        f = self.node(path)
        self.stats.read_throughs += 1
        for _ in range(4):
            try:
                got, _eof = self.store.read(f.ino, 0, len(f.data) + 1)
            except StoreError as e:
                if e.errno != errno.EAGAIN:
                    raise
                try:
                    self.run(self.up.readthrough.fetch_missing(f.ino, e.missing))
                except TransientError:
                    return None            # S3 unreachable: NFS4ERR_DELAY, nothing learned
                except StoreError as fe:
                    if fe.errno == errno.EIO and self.faults_on():
                        return None
                    raise Violation(f"read-through of {path} (ino {f.ino}) failed: {fe}") from fe
                finally:
                    self.settle()
                continue
            if bytes(got) != bytes(f.data):
                raise Violation(f"read of {path} (ino {f.ino}) returned other bytes than were written "
                                f"({len(got)} vs {len(f.data)} bytes; first difference at "
                                f"{next((i for i, (a, b) in enumerate(zip(got, f.data)) if a != b), None)})")
            return bytes(got)
        raise Violation(f"read-through of {path} never completed")

    # ---- S3 side -----------------------------------------------------------------------------
    def faults_on(self) -> bool:
        return self.fake.outage or self.fake.slowdown > 0 or self.fake.lost_reply > 0

    def set_faults(self, outage: bool = False, slowdown: float = 0.0, lost_reply: float = 0.0) -> None:
        self.fake.outage, self.fake.slowdown, self.fake.lost_reply = outage, slowdown, lost_reply

    def import_external(self, key: str, data: bytes) -> None:
        """Somebody writes an object into the bucket directly; `ckptgw import` brings it in."""
        self.fake.put_external(key, data)
        before = {p for p in self.paths()}
        self.stats.imports += 1
        # never the gateway's until imported: S3 unreachable, or a key a queued job of the
        # gateway still names (Store.owned_keys) is skipped until a later import
        self.unimported.add(key)
        try:
            self.up.gate = self.up.readthrough.gate        # the operator's command: no grants
            self.run(self.up.import_bucket())
        except ObjectClientError:
            pass
        finally:
            self.up.gate = self.up.worker.gate
            self.settle()
        self._adopt_imports(before)

    def _adopt_imports(self, before: set[str]) -> None:
        """Mirror what import added to the namespace into the model (import never replaces
        a local name, so only new names appear)."""
        def walk(ino: int, prefix: str):
            for ent in self.store.readdir(ino):
                p = f"{prefix}/{ent.name.decode()}" if prefix else ent.name.decode()
                yield p, ent.attr
                if ent.attr.type == FileType.DIR:
                    yield from walk(ent.attr.ino, p)
        for p, attr in walk(ROOT_INO, ""):
            if p in before:
                continue
            self.unimported.discard(p)
            parent, name = self._parent(p)
            if attr.type == FileType.DIR:
                parent.entries[name] = MDir(attr.ino)
            elif attr.type == FileType.LNK:
                parent.entries[name] = MLink(attr.ino, self.store.readlink(attr.ino))
            else:
                f = MFile(attr.ino)
                f.data = bytearray(self.fake.current(p).data)
                f.made_durable()
                parent.entries[name] = f
                self._register(f)

    # ---- uploader steps ------------------------------------------------------------------------
    def enqueue(self, flush: bool, prefix: str | None = None) -> list[int]:
        """One enqueue pass of the scheduler; flush=True: as `ckptgw flush [PREFIX]` (no settle
        window; with a prefix, for the files under it alone). Returns the inodes it queued.
        Without flush nothing may be queued: the settle window (an hour) runs on the gateway's
        clock, and nothing in a test run is quiet that long."""
        before = {j["ino"] for _, j in self.store.queue_list(1 << 30) if j.get("kind") == UPLOAD}
        held = self.up._flush_prefixes
        self.up._flush_prefixes = [prefix] if flush else held
        try:
            self.run(self.up._enqueue_ready())
        finally:
            self.up._flush_prefixes = held
        queued = [j["ino"] for _, j in self.store.queue_list(1 << 30)
                  if j.get("kind") == UPLOAD and j["ino"] not in before]
        for f in self.files():               # the uploader committed what it queued
            if f.ino in queued:
                f.made_durable()
        if not flush and queued and self.check_settle:
            raise Violation(f"files {queued} ({[self.store.path_of(i) for i in queued]}) were queued for "
                            f"upload inside their settle window ({SETTLE_SECONDS:.0f} s on the gateway's clock)")
        return queued

    def dispatch(self) -> None:
        """One dispatch pass: start every job the ordering rules allow (time passes enough for
        any backoff to be over)."""
        self.up._not_before.clear()
        self.run(self.up._dispatch())
        self.settle()

    def grant(self, req: Pending) -> None:
        """Let one held S3 request go out (it may fail if faults are on)."""
        if req.fut.done():
            return
        req.fut.set_result(None)
        self.stats.grants += 1
        self.settle()

    def grant_job(self, job_id: int, limit: int = 200) -> bool:
        """Grant the requests of one job until it finishes; False if it did not (faults)."""
        for _ in range(limit):
            task = self.tasks.get(job_id)
            if task is None or task.done():
                return True
            mine = [p for p in self.pending if p.job == job_id]
            if not mine:
                self.settle()
                if not [p for p in self.pending if p.job == job_id]:
                    return job_id not in self.tasks
                continue
            self.grant(mine[0])
        return False

    def grant_all(self, limit: int = 2000) -> None:
        for _ in range(limit):
            if not self.pending:
                return
            self.grant(self.pending[0])

    def drain(self, rounds: int = 60) -> None:
        """Faults off; flush; run every job to the end. The queue must empty."""
        self.stats.drains += 1
        self.set_faults()
        lo = self.fake.last_seq
        try:
            self._drain(rounds)
        finally:
            self.flush_windows.append((lo, self.fake.last_seq))

    def _drain(self, rounds: int) -> None:
        # as `ckptgw flush --wait`: the flush holds for the whole drain, so held directory
        # markers (which settle on the uploader's own clock) go too
        self.up._flush_prefixes = [None]
        try:
            self._drain_rounds(rounds)
        finally:
            self.up._flush_prefixes = []

    def _drain_rounds(self, rounds: int) -> None:
        for _ in range(rounds):
            self.grant_all()
            self.enqueue(flush=True)
            self.dispatch()
            self.grant_all()
            # done when nothing is queued, running or left to queue (an upload that found its
            # file changed leaves it DIRTY for the next pass, as `flush --wait` waits for it)
            if (not self.store.queue_list(1) and not self.tasks and not self.pending
                    and not self.store.ready_for_upload(None, 0, 1)):
                return
        left = [(jid, j) for jid, j in self.store.queue_list(20)]
        states = {f.ino: self.store.getattr(f.ino).data_state.name for f in self.files()}
        raise Violation(f"drain did not finish after {rounds} rounds: queue {left}, running "
                        f"{sorted(self.tasks)}, file states {states}")

    # ---- invariants ------------------------------------------------------------------------------
    def _findable_keys(self, f: MFile) -> set[str]:
        """Keys the gateway may find this file's object at: its paths, the key the store
        recorded, and their earlier names along pending rename jobs (the journal still has to
        move the object there)."""
        keys = {p for p, n in self.walk() if n is f}
        try:
            rk = self.store.remote_info(f.ino).key
        except StoreError:
            rk = None
        if rk:
            keys.add(rk)
        jobs = [j for _, j in self.store.queue_list(1 << 30) if j.get("kind") == NS and j.get("op") == "rename"]
        for j in reversed(jobs):
            old, new = j["old_path"].rstrip("/"), j["new_path"].rstrip("/")
            for k in list(keys):
                if j.get("type") == "dir" and k.startswith(new + "/"):
                    keys.add(old + k[len(new):])
                elif k == new:
                    keys.add(old)
        return keys

    def check(self) -> None:
        self.stats.steps += 1
        if self.stats.job_errors:
            raise Violation(f"an uploader job failed unexpectedly: {self.stats.job_errors[0]}")
        s = self.store
        # 1. every acknowledged byte reads back (locally present ranges; absent ones: 2.)
        for f in self.files():
            a = s.getattr(f.ino)
            if a.size != len(f.data):
                raise Violation(f"ino {f.ino}: size {a.size}, the clients wrote {len(f.data)} bytes")
            for e in s.extents(f.ino):
                if e.state == DataState.ABSENT:
                    continue
                got, _ = s.read(f.ino, e.offset, e.length)
                if bytes(got) != bytes(f.data[e.offset:e.offset + e.length]):
                    raise Violation(f"ino {f.ino}: bytes {e.offset}+{e.length} read back differ")
        # 2. every CLEAN (or evicted) file has an object with exactly its bytes where the gateway finds it
        for f in self.files():
            st = s.getattr(f.ino).data_state
            if st not in (DataState.CLEAN, DataState.ABSENT):
                continue
            keys = self._findable_keys(f)
            if not any((v := self.fake.current(k)) is not None and v.data == bytes(f.data) for k in keys):
                raise Violation(f"{st.name} file ino {f.ino} ({len(f.data)} bytes) has no object with its "
                                f"bytes at any of {sorted(keys)}; bucket: "
                                f"{ {k: len(self.fake.current(k).data) for k in self.fake.keys()} }")
        # 3. no object version ever held bytes of two file versions (nor any bytes no file held),
        # 6. nor bytes its file never held under that name (a rename's copy of an object the
        #    file had since written again put old bytes under the new name: tests/ha, issue 38)
        self._note_names()
        for v in self.fake.versions(self._seen_seq):
            if not v.deleted and self._is_file_object(v) and not v.origin:
                raise Violation(f"object {v.key!r} version {v.version_id} ({v.op}, {len(v.data)} bytes) "
                                f"holds bytes no file version ever held (torn)")
            if (not v.deleted and self._is_file_object(v) and v.origin
                    and not any(v.key in self.names.get(o, ()) for o in v.origin)):
                raise Violation(f"object {v.key!r} version {v.version_id} ({v.op}, {len(v.data)} bytes) "
                                f"holds bytes its file never held under that name (only under "
                                f"{sorted(set().union(*(self.names.get(o, set()) for o in v.origin)))})")
            # 7. exactly once (issue 38): no upload or move stores at a key the very object the
            #    key holds already (same bytes, same metadata: the same file version of the same
            #    store sent again), e.g. a PUT repeated after a kill -9 before its record, or
            #    after a lost reply; a move's CopyObject (a file's, a directory's, a move to a
            #    hard link's next name, an upload by copy) replayed after a kill -9 between the
            #    copy and the re-key, or retried after a lost reply. (A multipart copy is a
            #    CompleteMultipartUpload here; the fake's storage-class change, a copy onto the
            #    key itself, is also a CopyObject, but the model never runs retention.)
            if (v.op in ("PutObject", "CompleteMultipartUpload", "CopyObject") and not v.deleted
                    and self._is_file_object(v)):
                hist = self.fake.history[v.key]
                i = hist.index(v)
                prev = hist[i - 1] if i else None
                if (prev is not None and not prev.deleted and prev.data == v.data
                        and prev.metadata == v.metadata and INO_META in v.metadata):
                    raise Violation(f"object {v.key!r} version {v.version_id} ({v.op}) repeats version "
                                    f"{prev.version_id} ({prev.op}): the same bytes and metadata sent twice")
        self._seen_seq = max(self._seen_seq, self.fake.last_seq)
        # 4. once S3 held a good object at a path, it keeps one while that path names a file
        #    (a rename over it must leave the old or the new object, never neither)
        for p, n in self.walk():
            if isinstance(n, MFile) and s.getattr(n.ino).data_state == DataState.CLEAN:
                v = self.fake.current(p)
                if v is not None and v.data == bytes(n.data):
                    self.held[p] = n.ino
        if self.check_held:
            for p, ino in sorted(self.held.items()):
                n = self.node(p)
                if not isinstance(n, MFile):
                    # the promise ends with the file at p: a symlink or nothing there now, and
                    # a file renamed there later starts anew (its object, or the symlink's)
                    del self.held[p]
                    continue
                # hard links share one object, under one of the file's names, or where the gateway
                # finds it while a queued job moves it to one (the unlink of the name it was at)
                names = self._findable_keys(n)
                if not any((v := self.fake.current(q)) is not None and v.origin for q in names):
                    raise Violation(f"S3 holds no good object at {p!r}, which held one and still names a file")
                if n.ino == ino and self.fake.current(p) is None:
                    # the same file's object moved to another of its names (a rename of the name it
                    # was at, the file still linked here): this name holds no object any more, and a
                    # file renamed over it later has no old object here to keep
                    del self.held[p]
        # 5. dir markers of temporary directories never reach S3 (but for a flush of them)
        if self.check_temp_dirs:
            for k, hist in self.fake.history.items():
                for v in hist:
                    if (k.endswith("/") and is_temp(k) and not v.deleted
                            and not any(lo < v.seq <= hi for lo, hi in self.flush_windows)):
                        raise Violation(f"directory marker of a temporary directory reached S3: {k!r}")
        # 6. the reply records of the client's acknowledged renames and removes are all there,
        # its newest REPLY_KEEP, through kills and recovery
        got = [(r.op, r.src_dir, r.old, r.dst_dir, r.new, r.ino)
               for r in s.reply_records(MODEL_CLIENT)]
        if got != self.replies:
            raise Violation(f"reply records {got}, the client was answered {self.replies}")
        problems = s.check()
        if problems:
            raise Violation(f"store check: {problems}")

    @staticmethod
    def _is_file_object(v) -> bool:
        if v.content_type == DIR_CONTENT_TYPE or v.op == "external":
            return False
        try:
            mode = int(v.metadata.get("mode", ""))
        except ValueError:
            return INO_META in v.metadata
        return stat.S_ISREG(mode)

    def check_drained(self) -> None:
        """After drain(): the bucket equals the namespace, each file with the bytes it holds now,
        committed by a client or not (the uploader commits a closed, settled file's current
        bytes before it uploads them: README "What is durable when"). Keys: every file under the name the
        store calls its path (hard links share one object), every symlink, a marker per
        directory; no other key. Temporary names may be absent (they may also be there while
        they still exist: a flush uploads what is there)."""
        self.check()
        want: dict[str, bytes | None] = {}
        have = self.fake.snapshot()
        names: dict[int, list[str]] = {}
        for p, n in self.walk():
            if isinstance(n, MDir):
                want[p + "/"] = b""
            elif isinstance(n, MLink):
                want[p] = n.target
            else:
                names.setdefault(n.ino, []).append(p)
        for f in self.files():
            # hard links share one object: under any one of the file's names
            held = [p for p in names[f.ino] if p in have]
            for p in held or [self.store.path_of(f.ino)]:
                want[p] = bytes(f.data)
        for k, data in want.items():
            if k not in have:
                if is_temp(k):
                    continue
                raise Violation(f"after a drain S3 has no object for {k!r}; bucket keys {sorted(have)}")
            if have[k] != data:
                raise Violation(f"after a drain the object {k!r} holds {len(have[k])} bytes other than the "
                                f"file's {len(data)}")
        # an external object no import brought in is not the gateway's to mirror or delete
        extra = sorted(k for k in set(have) - set(want)
                       if not (k in self.unimported and self.fake.current(k).op == "external"))
        if extra:
            raise Violation(f"after a drain S3 holds keys the namespace does not have: {extra}")
        for p, n in self.walk():
            if isinstance(n, MLink) and self.fake.current(p) is not None:   # a temp name may lack one
                meta = self.fake.current(p).metadata
                if not stat.S_ISLNK(int(meta.get("mode", "0"))):
                    raise Violation(f"symlink {p!r} is not marked as one in S3: {meta}")
