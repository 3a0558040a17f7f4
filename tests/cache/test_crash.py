"""Store-level crash test: a child PROCESS runs a concurrent workload of writes, commits,
renames and directory moves (crash_workload.py) and reports every acknowledged op; we
SIGKILL it at random moments, reopen the store and verify that everything acknowledged
is there byte for byte, that no file is torn, that nothing uncommitted survives past the
last committed size, and that check() finds no problem. The same store lives through all
kill points, so recovery also runs over the leftovers of earlier crashes.
30 kill points per CI run; CKPTGW_LONG=1 for 300.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cache.api import ROOT_INO, StoreError
from cache.store import Store

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.cache.crash_workload import THREADS, content  # noqa: E402

KILLS = 300 if os.environ.get("CKPTGW_LONG") == "1" else 30
EMPTY = hashlib.sha256(b"").hexdigest()


def resolve(s: Store, path: str) -> int | None:
    ino = ROOT_INO
    for part in path.split("/"):
        try:
            ino = s.lookup(ino, part.encode()).ino
        except StoreError:
            return None
    return ino


def sha_of(s: Store, ino: int) -> tuple[str, int]:
    size = s.getattr(ino).size
    data, _ = s.read(ino, 0, size)
    return hashlib.sha256(data).hexdigest(), size


def run_child(store_dir: str, run: int, rnd: random.Random) -> list[dict]:
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "crash_workload.py"),
                             store_dir, str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=HERE)
    lines = []
    if rnd.random() < 0.2:
        time.sleep(rnd.uniform(0, 0.4))      # anywhere, start-up and recovery included
    else:
        lines.append(proc.stdout.readline())  # "ready": the workload is running
        time.sleep(rnd.uniform(0.02, 0.6))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    lines.extend(out.splitlines(keepends=True))
    acks = []
    for line in lines:
        if line.endswith(b"\n") and line.startswith(b"{"):
            acks.append(json.loads(line))
    return acks


class Expectation:
    """What must be in the store, carried across kill points."""

    def __init__(self):
        self.files: dict[str, str] = {}       # path -> sha (finals and known leftovers)
        self.dirs: set[str] = set()           # entries of dirs/

    def verify(self, s: Store, run: int, acks: list[dict]) -> None:
        for t in range(THREADS):
            self._verify_thread(s, run, t, acks)
        self._verify_dirs(s, run, [a for a in acks if a["op"] == "dirmove"])

    def _verify_thread(self, s, run, t, acks):
        mine = [a for a in acks if a.get("path", "").startswith(f"t{t}/")]
        renamed = {a["path"] for a in mine if a["op"] == "rename"}
        finals = {f"t{t}/ckpt{k}": {self.files.get(f"t{t}/ckpt{k}")} for k in range(3)}
        pending = None
        for a in mine:
            if a["op"] == "rename":
                finals[a["to"]] = {a["sha"]}
            elif a["path"] not in renamed:
                pending = a
        n_commits = sum(a["op"] == "commit" for a in mine)
        if pending is not None:
            final = f"t{t}/ckpt{(n_commits - 1) % 3}"
            finals[final] = finals[final] | {pending["sha"]}
        for path, allowed in finals.items():
            ino = resolve(s, path)
            got = None if ino is None else sha_of(s, ino)[0]
            assert got in allowed, (path, got, allowed)
            if got is not None:
                self.files[path] = got
        for path in renamed:
            assert resolve(s, path) is None, f"{path} was renamed but still exists"
        if pending is not None:
            ino = resolve(s, pending["path"])
            final = f"t{t}/ckpt{(n_commits - 1) % 3}"
            if ino is not None:                # rename not applied: committed bytes, no tail
                assert sha_of(s, ino) == (pending["sha"], pending["size"]), pending
                self.files[pending["path"]] = pending["sha"]
            else:
                assert self.files.get(final) == pending["sha"], pending
        # the iteration after the last ack: never acknowledged; either nothing was
        # committed (size 0 after recovery) or its commit finished just before the kill
        nxt = f"t{t}/r{run}-{n_commits}.tmp"
        ino = resolve(s, nxt)
        if ino is not None:
            data = content(run, t, n_commits)
            got = sha_of(s, ino)
            assert got in {(EMPTY, 0), (hashlib.sha256(data).hexdigest(), len(data))}, nxt
            self.files[nxt] = got[0]
        # nothing else may appear, nothing known may change
        dir_ino = resolve(s, f"t{t}")
        if dir_ino is None:
            assert not mine
            return
        for e in s.readdir(dir_ino):
            path = f"t{t}/{e.name.decode()}"
            assert path in self.files, f"unexpected {path}"
            assert sha_of(s, e.attr.ino)[0] == self.files[path], path
        for path in list(self.files):
            if path.startswith(f"t{t}/") and path not in finals and \
                    resolve(s, path) is None:
                raise AssertionError(f"{path} vanished")

    def _verify_dirs(self, s, run, moves):
        for m in moves:
            self.dirs.discard(m["path"])
            self.dirs.add(m["to"])
        d = resolve(s, "dirs")
        entries = set() if d is None else {f"dirs/{e.name.decode()}" for e in s.readdir(d)}
        extra = entries - self.dirs
        assert self.dirs <= entries, self.dirs - entries
        assert len(extra) <= 1, extra          # the one move in flight at the kill
        for path in extra:
            i = len(moves)
            assert path in (f"dirs/r{run}-a{i}", f"dirs/r{run}-b{i}"), path
        for path in self.dirs:
            if path.startswith(f"dirs/r{run}-b"):
                assert resolve(s, path + "/x") is not None, path
        self.dirs = entries


@pytest.mark.timeout(600)
def test_kill9_at_random_moments(tmp_path):
    store_dir = str(tmp_path / "store")
    Store.open(store_dir).close()
    rnd = random.Random(os.environ.get("CKPTGW_SEED", time.time_ns()))
    expect = Expectation()
    total_acks = 0
    for run in range(KILLS):
        acks = run_child(store_dir, run, rnd)
        total_acks += len(acks)
        s = Store.open(store_dir)
        try:
            assert s.check() == [], run
            expect.verify(s, run, acks)
        finally:
            s.close()
    assert total_acks > KILLS      # the workload really ran between the kills
