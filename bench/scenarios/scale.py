"""Scale: start-up time and LOOKUP+GETATTR p99 of `ckptgw serve` over a store of many files vs
1k (stores built with bench/store_startup.build, closed cleanly), and the gateway's RSS over
time while a large checkpoint is saved through nfs-rs with its uploader draining to moto."""
from __future__ import annotations

import logging
import random

import structlog

from .. import nfsrs_throughput as tp
from ..goals import threshold
from ..latency import lookup_getattr
from ..procs import RssSampler
from ..record import SCALE_BASE_FILES, MiB, Run, in_turn
from ..stack import gateway, s3_server
from ..stats import percentile
from ..store_startup import build

QUIET = 3600.0      # settle: the prebuilt files stay put while start-up and lookups are timed


def startup_and_lookup(run: Run) -> None:
    s = run.sizes
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    caches = {}
    for n in (SCALE_BASE_FILES, s.scale_files):
        caches[n] = run.workdir / f"scale{n}" / "cache"
        build(str(caches[n]), n, 0, crash=False, quiet=True)
    rng = random.Random(15)
    for rep in range(s.reps):
        got = {}
        for n in in_turn((SCALE_BASE_FILES, s.scale_files), rep):
            probes = [f"d{i // 1000}/f{i}" for i in (rng.randrange(n) for _ in range(s.lookup_probes))]
            with s3_server() as s3, gateway(run.workdir / f"scale{n}" / f"run{rep}", s3.endpoint, settle=QUIET,
                                            cache_dir=caches[n]) as gw:
                lat = [x * 1e3 for x in lookup_getattr(gw.port, probes)]
                got[n] = (gw.startup_s, percentile(lat, 99))
                run.samples("LOOKUP+GETATTR latency", "ms", f"{n:,} files", lat)
        many, base = got[s.scale_files], got[SCALE_BASE_FILES]
        run.add("scale.startup", many[0], base[0])
        run.add("scale.lookup_p99", many[1], base[1])
        for label, v in ((f"{SCALE_BASE_FILES:,} files", base), (f"{s.scale_files:,} files", many)):
            run.bar("scale", "s", "start-up (s)", label, v[0])
            run.bar("scale", "ms", "LOOKUP+GETATTR p99 (ms)", label, v[1])


def rss_while_saving(run: Run) -> None:
    s = run.sizes
    per = tp.stream_share(s.rss_save_mib * MiB)
    block = bytes(range(256)) * (MiB // 256)
    for rep in range(s.reps):
        with s3_server(in_memory=False) as s3, gateway(run.workdir / f"rss{rep}", s3.endpoint) as gw:
            tp.mkdir(gw.port, "rss")
            with RssSampler(gw.pid, interval=0.1) as rss:
                tp.write_streams(gw.port, "rss/shard", per, block)
            run.add("scale.rss", rss.peak / MiB, 256.0)
            run.timeline("RSS while saving", "MiB", f"ckptgw saving {tp.STREAMS * per // MiB} MiB",
                         [(t, b / MiB) for t, b in rss.samples])
    x = threshold("scale.rss")
    run.goal_line("RSS while saving", x, f"goal: peak RSS ≤ {x:g} MiB")
