"""Crash consistency of the whole server process (issue 4).

`python -m nfsd` runs as a child process while several NFSv4.1 sessions save files the way
checkpoints are saved (tmp + UNSTABLE writes + COMMIT + rename over the final name, FILE_SYNC
writes, mkdir + rename of directories, removes). The test kill -9s the server at random
moments, restarts it on the same store and checks every acknowledged operation against the
model in crash_workload.py, plus the store's own consistency check.

CKPTGW_LONG=1 runs hundreds of kill points instead of 30; CKPTGW_CRASH_SEED replays a run.
"""
from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nfsd.xdr.nfs4 import FILE_SYNC4, OPEN4_SHARE_ACCESS_WRITE, UNSTABLE4  # noqa: E402
from testkit.crash_server import ServerProcess, store_check  # noqa: E402
from tests.e2e.crash_workload import DIR, FileExp, Workload  # noqa: E402
from testkit.nfsclient import NfsClient  # noqa: E402

LONG = os.environ.get("CKPTGW_LONG") == "1"
KILL_POINTS = 300 if LONG else 30
WORKERS = 4
STORE_CHECK_EVERY = 10          # also open the crashed store directly every N kill points
KILL_IN_STARTUP_EVERY = 4       # and kill a restarting server during start-up every N


def _seed() -> int:
    return int(os.environ.get("CKPTGW_CRASH_SEED") or random.SystemRandom().randrange(1 << 30))


async def _run_until_killed(wl: Workload, srv: ServerProcess, delay: float) -> None:
    """Run the workload and SIGKILL the server `delay` seconds in (from the test's loop, so
    every reply counted as acknowledged really arrived before the kill)."""
    async def killer():
        await asyncio.sleep(delay)
        srv.send_kill()
    k = asyncio.create_task(killer())
    try:
        await asyncio.wait_for(wl.run(srv.port), timeout=delay + 60)
    finally:
        await k
    srv.kill9()                     # reap


@pytest.mark.timeout(3600 if LONG else 400)
def test_kill9_during_checkpoint_workload(tmp_path):
    seed = _seed()
    rng = random.Random(seed)
    srv = ServerProcess(tmp_path / "cache", tmp_path / "server.log")
    wl = Workload(WORKERS, seed)
    store_problems: list[str] = []
    startup_kills = 0
    srv.start()
    try:
        for point in range(1, KILL_POINTS + 1):
            asyncio.run(_run_until_killed(wl, srv, rng.uniform(0.05, 1.2)))
            if point % STORE_CHECK_EVERY == 0:
                store_problems += [f"after kill {point}: {p}" for p in store_check(srv.cache_dir)]
            elif point % KILL_IN_STARTUP_EVERY == 0:
                # a crash during start-up (store open, crash recovery): recovery must be
                # idempotent, whatever it had done when it died
                srv.start(wait=False)
                time.sleep(rng.uniform(0.0, 0.6))
                srv.kill9()
                startup_kills += 1
            srv.start()
            asyncio.run(wl.verify(srv.port))
            if wl.failures:
                break
        # a last stretch of work, then a clean stop: nothing acknowledged may be lost either
        asyncio.run(wl.run(srv.port, stop_after=0.5))
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill9()
    store_problems += [f"after clean stop: {p}" for p in store_check(srv.cache_dir)]
    srv.start()
    try:
        asyncio.run(wl.verify(srv.port))
    finally:
        srv.stop()

    s = wl.stats
    print(f"\ncrash figures (seed {seed}): kill points {srv.kills} ({startup_kills} during "
          f"start-up), acknowledged ops {s.acked}, "
          f"verified {s.verified}, in-flight namespace ops applied/not {s.unacked_applied}/"
          f"{s.unacked_absent}, uncommitted bytes dropped by recovery "
          f"{s.uncommitted_bytes_dropped}, episodes {s.episodes}, failures {len(wl.failures)}")
    assert not wl.failures, f"seed {seed}:\n" + "\n".join(wl.failures[:20])
    assert not store_problems, f"seed {seed}: Store.check():\n" + "\n".join(store_problems[:20])
    assert len(set(wl.verifiers)) == len(wl.verifiers), \
        f"a write verifier repeated across restarts: {[v.hex() for v in wl.verifiers]}"
    assert srv.kills - startup_kills >= KILL_POINTS
    assert s.verified == s.acked and s.acked > KILL_POINTS, "the workload barely ran"
    faults = [ln for ln in srv.log_errors() if "Traceback" in ln or "SERVERFAULT" in ln]
    assert not faults, "\n".join(faults[:10])


@pytest.mark.timeout(120)
def test_write_verifier_changes_and_uncommitted_data_is_absent_or_correct(tmp_path):
    """RFC 8881 18.32.3: a new verifier after a restart tells clients to resend UNSTABLE data;
    what was written but not committed before the crash is absent or correct, never garbage."""
    rng = random.Random(_seed())
    unstable = rng.randbytes(5 * 32768 + 123)
    committed = rng.randbytes(100_000)
    synced = rng.randbytes(40_000)
    srv = ServerProcess(tmp_path / "cache", tmp_path / "server.log")
    srv.start()

    async def before_crash():
        c = await NfsClient.connect("127.0.0.1", srv.port)
        await c.setup_session()
        d = await c.lookup_path("/checkpoints")
        verfs = set()
        fh, sid = await c.open_create(d, "unstable", access=OPEN4_SHARE_ACCESS_WRITE)
        for off in range(0, len(unstable), 32768):
            res = await c.write(fh, sid, off, unstable[off:off + 32768], UNSTABLE4)
            assert res.committed == UNSTABLE4
            verfs.add(bytes(res.writeverf))
        fh2, sid2 = await c.open_create(d, "committed", access=OPEN4_SHARE_ACCESS_WRITE)
        verfs.add(bytes((await c.write(fh2, sid2, 0, committed, UNSTABLE4)).writeverf))
        verfs.add(bytes(await c.commit(fh2)))
        fh3, sid3 = await c.open_create(d, "synced", access=OPEN4_SHARE_ACCESS_WRITE)
        res = await c.write(fh3, sid3, 0, synced, FILE_SYNC4)
        assert res.committed == FILE_SYNC4
        verfs.add(bytes(res.writeverf))
        assert len(verfs) == 1, "one server instance, one verifier"
        return verfs.pop()

    async def after_crash():
        c = await NfsClient.connect("127.0.0.1", srv.port)
        await c.setup_session()
        d = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(d, "probe", access=OPEN4_SHARE_ACCESS_WRITE)
        verf = bytes((await c.write(fh, sid, 0, b"x", UNSTABLE4)).writeverf)
        assert bytes(await c.commit(fh)) == verf
        contents = {name: await Workload._read_whole(c, d, name.encode())
                    for name in ("unstable", "committed", "synced")}
        await c.close()
        return verf, contents

    try:
        old = asyncio.run(before_crash())
        srv.restart_after_crash()
        new, contents = asyncio.run(after_crash())
    finally:
        srv.stop()
    assert new != old, "the write verifier must change when unstable data may have been lost"
    assert contents["committed"] == committed
    assert contents["synced"] == synced
    got = contents["unstable"]
    assert got == unstable[:len(got)], "uncommitted data came back as garbage"
    print(f"\nuncommitted file after kill -9: {len(got)} of {len(unstable)} bytes kept")
    assert store_check(srv.cache_dir) == []


# ---- the checker itself: it must catch what the crash test looks for -------------------------
def _judged(state: dict, pending: dict | None, actual: dict) -> tuple[list[str], Workload]:
    wl = Workload(1, 0)
    w = wl.workers[0]
    w.state, w.pending = dict(state), pending
    wl.judge(w, actual)
    return wl.failures, wl


def test_checker_accepts_each_side_of_an_inflight_rename_and_rejects_half():
    data = b"new checkpoint" * 100
    new, old = FileExp(data, len(data), len(data)), FileExp(b"old", 3, 3)
    state = {"w0": DIR, "w0/tmp1": new, "w0/final0": old}
    rename = {"w0/tmp1": None, "w0/final0": new}
    assert _judged(state, rename, {"w0": DIR, "w0/tmp1": data, "w0/final0": b"old"})[0] == []
    failures, wl = _judged(state, rename, {"w0": DIR, "w0/final0": data})
    assert failures == [] and wl.stats.unacked_applied == 1
    assert _judged(state, rename, {"w0": DIR, "w0/tmp1": data, "w0/final0": data})[0]  # both names
    assert _judged(state, rename, {"w0": DIR, "w0/final0": b"old"})[0]                # source lost
    assert _judged(state, None, {"w0": DIR, "w0/final0": data})[0]   # not sent, yet applied


def test_checker_rejects_lost_torn_and_garbage_data():
    data = bytes(range(256)) * 40
    committed = {"w0": DIR, "w0/f": FileExp(data, 4096, len(data))}
    assert _judged(committed, None, {"w0": DIR, "w0/f": data[:5000]})[0] == []
    assert _judged(committed, None, {"w0": DIR, "w0/f": data[:4000]})[0]         # acked bytes lost
    assert _judged(committed, None, {"w0": DIR, "w0/f": data + b"\0"})[0]   # past what was sent
    torn = data[:4096] + bytes(1000)
    assert _judged(committed, None, {"w0": DIR, "w0/f": torn})[0]                 # zeros, not data
    assert _judged(committed, None, {"w0": DIR})[0]                               # acked file gone
    assert _judged(committed, None, {"w0": DIR, "w0/f": data, "w0/x": b""})[0]    # a stray name
    uncommitted = {"w0": DIR, "w0/u": FileExp(data, 0, len(data))}
    _, wl = _judged(uncommitted, None, {"w0": DIR, "w0/u": b""})
    assert wl.failures == [] and wl.workers[0].state["w0/u"].hi == 0   # tightened to what is there
