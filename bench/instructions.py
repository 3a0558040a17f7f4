"""Instructions per request, counted by callgrind: the repeatable figure of a noisy shared host.

`python -m bench.instructions [--engine native --engine python] [--calls 400,2000] [--floor]` runs
`python -m nfsd` under `valgrind --tool=callgrind` once per engine and per call count, sends that
many RPC NULL calls and half as many nfs-rs `exists("request/none")` calls, one COMPOUND each (the
report's "per request" loop: SEQUENCE+PUTFH+LOOKUP+LOOKUP+GETFH+GETATTR, ending at the second
LOOKUP's NOENT; before 2026-11-29 (26) it called `exists("none")`, one shorter COMPOUND, and
divided by two as if it were two), stops the
server cleanly and reads callgrind's total. Start-up and shutdown cost the same at every count,
so the difference between two counts divided by the difference in calls is the cost of one
call. Same interpreter, same inputs, PYTHONHASHSEED fixed: the figure repeats whatever else the
host runs (seconds do not). Also prints the figure per COMPOUND. Slow (valgrind is ~50x): a few
minutes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .rpc_floor import null_calls_n

REPO = Path(__file__).resolve().parent.parent


def _total(out_file: Path) -> int:
    for line in out_file.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out_file}")


def count_serving(workload, **env_extra: str) -> int:
    """Instructions of one `python -m nfsd` run under callgrind while `workload(port)` runs
    against it (start-up and a clean stop included)."""
    work = Path(tempfile.mkdtemp(prefix="ckptgw-instr-"))
    out = work / "callgrind.out"
    port = _free_port()
    env = dict(os.environ, PYTHONHASHSEED="0", **env_extra,
               CKPTGW_INDEX_MAP_BYTES=str(256 << 20))      # valgrind cannot map the default 64 GiB
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no",
         sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir", str(work / "c"),
         "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(port, proc)
        workload(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    try:
        return _total(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _serve_and_count(engine: str, nulls: int, compounds: int, loop: str) -> int:
    """Instructions of one server run that answers `nulls` NULLs and `compounds` exists() pairs."""
    from testkit.nfsrs_support import connect

    def workload(port: int) -> None:
        if nulls:
            null_calls_n(port, nulls)
        if compounds:
            c = connect(port)
            try:
                c.mkdir("request")          # as bench/scenarios/request.py
                for _ in range(compounds):
                    c.exists("request/none")
            finally:
                c.close()
    return count_serving(workload, CKPTGW_ENGINE=engine, CKPTGW_LOOP=loop)


def _floor_count(calls: int, loop: str) -> int:
    """Instructions of one bench/rpc_floor.py run (canned replies) that answers `calls` NULLs."""
    work = Path(tempfile.mkdtemp(prefix="ckptgw-instr-"))
    out = work / "callgrind.out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no",
         sys.executable, "-m", "bench.rpc_floor", "--loop", loop],
        cwd=REPO, env=dict(os.environ, PYTHONHASHSEED="0"), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().strip().split("=")[1])
        null_calls_n(port, calls)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    try:
        return _total(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def floor_per_call(low: int, high: int, loop: str = "uvloop") -> float:
    return (_floor_count(high, loop) - _floor_count(low, loop)) / (high - low)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    import socket
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("server did not listen in time")


def per_call(engine: str, low: int, high: int, loop: str = "uvloop") -> dict[str, float]:
    """Instructions per NULL and per COMPOUND for `engine`."""
    base = _serve_and_count(engine, low, 0, loop)
    more = _serve_and_count(engine, high, 0, loop)
    null = (more - base) / (high - low)
    base_c = _serve_and_count(engine, 0, low // 2, loop)
    more_c = _serve_and_count(engine, 0, high // 2, loop)
    compound = (more_c - base_c) / (high // 2 - low // 2)      # one COMPOUND per exists()
    return {"null": null, "compound": compound}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="append", choices=("native", "python"))
    ap.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    ap.add_argument("--calls", default="400,2000", help="the two call counts (LOW,HIGH)")
    ap.add_argument("--floor", action="store_true", help="also count the canned-reply server's NULL")
    args = ap.parse_args(argv)
    low, high = (int(x) for x in args.calls.split(","))
    rows = []
    for engine in args.engine or ["python", "native"]:
        got = per_call(engine, low, high, args.loop)
        rows.append((engine, got))
        print(f"{engine:7s} {args.loop}: {got['null']:>9,.0f} instructions per NULL, "
              f"{got['compound']:>9,.0f} per COMPOUND", flush=True)
    if args.floor:
        print(f"floor   {args.loop}: {floor_per_call(low, high, args.loop):>9,.0f} instructions per NULL "
              "(bench/rpc_floor.py: a canned reply, nothing decoded)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
