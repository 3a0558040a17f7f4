"""Where the gateway's time goes (issue 15's "profile first"): py-spy on `ckptgw serve`, its
uploader draining to moto, under the two loads furthest from their goals: the 8-client
small-file loop and 8 streams of 1 MiB durable writes. Each gives the report a busy share per
thread, the functions the samples sit in, and a flame graph. Reported, not judged: no goal."""
from __future__ import annotations

import os
import time

from .. import flame
from .. import nfsrs_throughput as tp
from ..record import MiB, Run
from ..render import slug
from ..stack import gateway, s3_server

LOADS = ("small-file saves, 8 clients", "8 streams of 1 MiB durable writes")


def run(run: Run) -> None:
    s = run.sizes
    block = os.urandom(MiB)
    per = tp.stream_share(s.stream_mib * MiB)
    with s3_server() as s3, gateway(run.workdir / "profile", s3.endpoint) as gw:
        tp.mkdir(gw.port, "prof")
        loads = {LOADS[0]: lambda: tp.small_files(gw.port, 8, s.small_seconds, "prof"),
                 LOADS[1]: lambda: _for_at_least(s.small_seconds,
                                                 lambda: tp.write_streams(gw.port, "prof/s", per, block))}
        for name, load in loads.items():
            raw = run.workdir / f"profile-{slug(name)}.txt"
            with flame.sampling(gw.pid, raw) as watched:
                load()
            stacks = flame.read_stacks(raw)
            svg = f"flame-{slug(name)}.svg"
            flame.plot(stacks, f"ckptgw serve, {name} (py-spy, {watched['seconds']:.1f} s)", run.outdir / svg)
            run.profiles.append({"load": name, "flame": svg, **flame.summary(stacks, watched["seconds"])})


def _for_at_least(seconds: float, load) -> None:
    """`load()` again until `seconds` have passed: the smoke sizes' write streams end in tens of
    milliseconds, a handful of py-spy samples, and the event loop's thread may have none (a CI
    run failed on that: 7 samples in 34 ms, none in MainThread)."""
    stop = time.monotonic() + seconds
    load()
    while time.monotonic() < stop:
        load()
