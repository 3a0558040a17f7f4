"""Per request: what one COMPOUND costs the server, the cause behind the nfs-rs rows. One nfs-rs
client calls `exists()` of a missing name in a loop (2 COMPOUNDs: SEQUENCE+PUTFH+LOOKUP+GETFH+GETATTR
and SEQUENCE+PUTFH+LOOKUP, the second failing with NOENT), against `ckptgw serve` and NFS-Ganesha:
the round trip the client sees and the server's CPU seconds (user + system, /proc) per COMPOUND.
Then RPC NULL calls (nothing to do but answer) against the same two servers and against the floor of
any CPython event-loop server, on the stdlib loop and on uvloop, the gateway's (bench/rpc_floor.py: a
canned reply to every record, nothing decoded):
what the transport and RPC layers cost before any NFS work. Reported, no bar: the issue sets none;
the nfs-rs goals ask for Ganesha's pace request for request.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

from ..procs import CpuMeter, quiesce_disk
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
    compounds = 2 * calls
    return meter.wall / compounds * 1e6, cpu / compounds * 1e6


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
    for rep in range(run.sizes.reps):
        got: dict[str, tuple] = {}
        for side in in_turn(["gw", "ganesha", "floor", "uvloop_floor"], rep):
            quiesce_disk()
            if side == "gw":
                with s3_server() as s3, gateway(run.workdir / f"request-gw{rep}", s3.endpoint) as gw:
                    got["gw"] = (*_exists_loop(gw.port, gw.pid, seconds), _null_loop(gw.port, gw.pid, seconds))
            elif side == "ganesha" and not missing:
                with ganesha(run.workdir / f"request-ganesha{rep}") as g:
                    got["ganesha"] = (*_exists_loop(g.port, g.pid, seconds), _null_loop(g.port, g.pid, seconds))
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
        bars = {"COMPOUND (exists() loop)": {"ckptgw": gw[1]},
                "RPC NULL": {"ckptgw": gw[2], "CPython loop, canned reply": got["floor"],
                             "uvloop, canned reply": got["uvloop_floor"]}}
        if ref is not None:
            bars["COMPOUND (exists() loop)"]["NFS-Ganesha"] = ref[1]
            bars["RPC NULL"]["NFS-Ganesha"] = ref[2]
        for group, values in bars.items():
            for label, value in values.items():
                run.bar(PLOT, "µs of server CPU per request", group, label, value)
