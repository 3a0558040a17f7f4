"""Per request: what one COMPOUND costs the server, the cause behind the nfs-rs rows. One nfs-rs
client calls `exists("request/none")` in a loop: one COMPOUND, SEQUENCE+PUTFH+LOOKUP+LOOKUP+GETFH+GETATTR,
ending at the second LOOKUP's NOENT (seen in the server's debug log; before 2026-11-29 (26) this
counted two COMPOUNDs a call and so halved both servers' figures, not their ratio), against
`ckptgw serve` and NFS-Ganesha:
the round trip the client sees and the server's CPU seconds (user + system, /proc) per COMPOUND.
Then RPC NULL calls (nothing to do but answer) against the same two servers and against the floor of
any CPython event-loop server, on the stdlib loop and on uvloop, the gateway's (bench/rpc_floor.py: a
canned reply to every record, nothing decoded):
what the transport and RPC layers cost before any NFS work. Then one nfs-rs stream of 1 MiB
durable writes against both servers: the server's user CPU per MiB. Issue 37 judges CPU per
COMPOUND, per NULL and per MiB against Ganesha's (≤ 1.0x); the floors are reported. And the
thread crossings per UNSTABLE WRITE and per READ of the engine (bench/write_crossings.py: the op
handlers on a real store, in process, every hand-off to another thread counted): issue 37 asks 0.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from .. import write_crossings
from ..nfsrs_throughput import MiB, mkdir, write_stream
from ..procs import CpuMeter, quiesce_disk, user_seconds
from ..record import Run, in_turn
from ..rpc_floor import null_calls
from ..stack import ganesha, ganesha_missing, gateway, s3_server

PLOT = "per request"
WARMUP_CALLS = 200


def _exists_loop(port: int, pid: int, seconds: float) -> tuple[float, float]:
    """(round trip, server CPU) per COMPOUND in microseconds."""
    from testkit.nfsrs_support import connect

    c = connect(port)
    try:
        c.mkdir("request", exist_ok=True)
        for _ in range(WARMUP_CALLS):
            c.exists("request/none")
        meter = CpuMeter({"server": pid}).start()
        calls, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop:
            c.exists("request/none")
            calls += 1
        cpu = meter.stop()["server"]
    finally:
        c.close()
    return meter.wall / calls * 1e6, cpu / calls * 1e6        # one COMPOUND a call


MIN_USER_CPU_S = 0.1        # user CPU comes in 10 ms clock ticks: at least 10 of them
MAX_CPU_MIB = 1024


def _write_user_cpu(port: int, pid: int, mib: int) -> float:
    """Server user CPU milliseconds per MiB of one nfs-rs stream of 1 MiB durable writes (after
    a warm-up file of 8 MiB): files of `mib` MiB until the server has spent MIN_USER_CPU_S of
    user CPU (a fast server spent under one tick on 64 MiB once) or MAX_CPU_MIB were written."""
    block = os.urandom(MiB)
    mkdir(port, "cpu")
    write_stream(port, "cpu/warm", 8 * MiB, block)
    u0, written = user_seconds(pid), 0
    while user_seconds(pid) - u0 < MIN_USER_CPU_S and written < MAX_CPU_MIB:
        write_stream(port, f"cpu/one{written // mib}", mib * MiB, block)
        written += mib
    return (user_seconds(pid) - u0) / written * 1e3


def _null_loop(port: int, pid: int, seconds: float) -> float:
    """Server CPU microseconds per RPC NULL call."""
    null_calls(port, 0.2)
    meter = CpuMeter({"server": pid}).start()
    calls = null_calls(port, seconds)
    return meter.stop()["server"] / calls * 1e6


def _python_floor(seconds: float, loop: str = "asyncio") -> float:
    """CPU microseconds per request of bench/rpc_floor.py's canned-reply server on `loop`."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.rpc_floor", "--loop", loop],
                            stdout=subprocess.PIPE, text=True)
    try:
        match = re.search(r"port=(\d+)", proc.stdout.readline())
        if match is None:
            raise RuntimeError("bench.rpc_floor did not say its port")
        return _null_loop(int(match.group(1)), proc.pid, seconds)
    finally:
        proc.kill()
        proc.wait()


def run(run: Run) -> None:
    missing = ganesha_missing()
    if missing:
        run.reference_missing(run.goals_of("request."), f"not run: {missing}")
    seconds = max(1.0, run.sizes.small_seconds)
    mib = max(64, 2 * run.sizes.stream_mib)    # per file; as many files as enough clock ticks take
    for rep in range(run.sizes.reps):
        got: dict[str, tuple] = {}
        for side in in_turn(["gw", "ganesha", "floor", "uvloop_floor"], rep):
            quiesce_disk()
            if side == "gw":
                with s3_server() as s3, gateway(run.workdir / f"request-gw{rep}", s3.endpoint) as gw:
                    got["gw"] = (*_exists_loop(gw.port, gw.pid, seconds), _null_loop(gw.port, gw.pid, seconds),
                                 _write_user_cpu(gw.port, gw.pid, mib))
            elif side == "ganesha" and not missing:
                with ganesha(run.workdir / f"request-ganesha{rep}") as g:
                    got["ganesha"] = (*_exists_loop(g.port, g.pid, seconds), _null_loop(g.port, g.pid, seconds),
                                      _write_user_cpu(g.port, g.pid, mib))
            elif side == "floor":
                got["floor"] = _python_floor(seconds)
            elif side == "uvloop_floor":
                got["uvloop_floor"] = _python_floor(seconds, "uvloop")
        gw, ref = got["gw"], got.get("ganesha")
        run.add("request.compound_rtt", gw[0], ref and ref[0])
        run.add("request.compound_cpu", gw[1], ref and ref[1])
        run.add("request.null_cpu", gw[2], ref and ref[2])
        run.add("request.python_floor", got["floor"], ref and ref[2])
        run.add("request.uvloop_floor", got["uvloop_floor"], ref and ref[2])
        if ref is not None and ref[3] <= 0:      # under one tick: no ratio to take
            run.reference_missing(["request.user_cpu_per_mib"], f"NFS-Ganesha's user CPU for "
                                  f"{MAX_CPU_MIB} MiB was under one clock tick")
        run.add("request.user_cpu_per_mib", gw[3], ref[3] if ref is not None and ref[3] > 0 else None)
        crossings = write_crossings.measure(writes=max(50, int(seconds * 100)))
        run.add("request.crossings_write", crossings["crossings"], 0.0)
        run.add("request.crossings_read", crossings["read crossings"], 0.0)
        if rep == 0:
            run.notes.append("per request: bench/write_crossings.py on this tree, per UNSTABLE WRITE / per "
                             "READ of 256 KiB: " + ", ".join(f"{k} {v:.2f}" for k, v in crossings.items()))
        bars = {"COMPOUND (exists() loop)": {"ckptgw": gw[1]},
                "RPC NULL": {"ckptgw": gw[2], "CPython loop, canned reply": got["floor"],
                             "uvloop, canned reply": got["uvloop_floor"]}}
        if ref is not None:
            bars["COMPOUND (exists() loop)"]["NFS-Ganesha"] = ref[1]
            bars["RPC NULL"]["NFS-Ganesha"] = ref[2]
        for group, values in bars.items():
            for label, value in values.items():
                run.bar(PLOT, "µs of server CPU per request", group, label, value)
        run.bar(PLOT, "ms of server user CPU per MiB", "1 MiB durable writes", "ckptgw", gw[3])
        if ref is not None:
            run.bar(PLOT, "ms of server user CPU per MiB", "1 MiB durable writes", "NFS-Ganesha", ref[3])
