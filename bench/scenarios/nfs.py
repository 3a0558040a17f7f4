"""nfs-rs over loopback against `ckptgw serve` (uploader draining to moto, SCHED_IDLE, its
temporary files on tmpfs: bench/stack.py) vs
NFS-Ganesha (VFS), plus FILE_SYNC ack latency and the cores goal (issue 37: the gateway on all
CPUs against the bound of two independent gateways, one per CPU; issue 15's ratio to one core reported).

Per repetition, fresh servers each: the gateway on all CPUs, the gateway on CPU 0 only (the
'one process' baseline: whatever the gateway's process layout, confined to one core), two
independent gateways one per CPU with the 8 clients split over them (the bound of the cores goal:
shared-nothing servers, what no layout of one gateway can beat), NFS-Ganesha;
their order alternates between repetitions so a drift in the host's load hits each side alike.
"""
from __future__ import annotations

import os

from .. import nfsrs_throughput as tp
from ..latency import LocalSyncWrites, file_sync_writes
from ..procs import CpuMeter, RssSampler, quiesce_disk
from ..goals import BY_ID, threshold
from ..record import MiB, Run, in_turn
from ..stack import BUCKET, ganesha, ganesha_missing, gateway, s3_client, s3_server
from ..stats import percentile

GOAL_OF = {tp.WRITE1: "nfsrs.write1", tp.WRITE8: "nfsrs.write8", tp.READ1: "nfsrs.read1",
           tp.SMALL1: "nfsrs.small1", tp.SMALL8: "nfsrs.small8"}
CORES_OF = {tp.WRITE8: "cores.write8", tp.SMALL8: "cores.small8"}
BOUND_OF = {tp.WRITE8: "cores.bound_write8", tp.SMALL8: "cores.bound_small8"}
OF_BOUND = {tp.WRITE8: "cores.write8_of_bound", tp.SMALL8: "cores.small8_of_bound"}    # issue 37's
ACK_SIZE = 256 * 1024
SCENARIO = "nfs-rs throughput"


def _measure(run: Run, server: str, rep: int, pids: dict[str, int], port: int, only=tp.FIGURES,
             rss_plot: str | None = None) -> dict[str, float]:
    """tp.measure() with the CPU seconds of each process in pids (the first is the server)."""
    s = run.sizes
    meter = CpuMeter(pids).start()
    with RssSampler(next(iter(pids.values()))) as rss:
        figures = tp.measure(port, s.stream_mib * MiB, s.small_seconds, only)
    cpu = meter.stop()
    run.cpu.append({"scenario": SCENARIO, "server": server, "rep": rep, "wall_s": meter.wall, "cpu_s": cpu})
    if rss_plot and rep == 0:
        run.timeline(rss_plot, "MiB", server, [(t, b / MiB) for t, b in rss.samples])
    return figures


def _gateway_side(run: Run, rep: int, cpus=None) -> tuple[dict, list[float], list[float]]:
    wd = run.workdir / f"nfs-gw{'-1cpu' if cpus else ''}{rep}"
    with s3_server() as s3, gateway(wd, s3.endpoint, cpus=cpus) as gw:
        if rep == 0 and not cpus:
            run.notes.append(f"test S3: moto at SCHED_IDLE and nice 19, its temporary files (every part "
                             f"and object over about 5 MiB) on {s3.extra['spill']} (bench/stack.py)")
        pids = {"ckptgw": gw.pid, "moto": s3.pid}
        if cpus:
            return _measure(run, "ckptgw on 1 CPU", rep, pids, gw.port, tuple(CORES_OF)), [], []
        figures = _measure(run, "ckptgw", rep, pids, gw.port, rss_plot="RSS during nfs-rs throughput")
        # the reference interleaved, write by write: both under whatever the uploader's drain
        # of the phases before still costs (measured after, it ran on a quieter host)
        with LocalSyncWrites(str(gw.handle.cache_dir), ACK_SIZE) as local:
            lat = file_sync_writes(gw.port, run.sizes.acklat_writes, ACK_SIZE, between=local.one)
        return figures, lat, local.seconds


def _two_gateways_side(run: Run, rep: int, cpus: list[int]) -> dict:
    """The bound of the cores goal on this host: two gateways sharing nothing (own stores, own
    buckets), each confined to its own CPU, the clients split over them. No process layout of
    one gateway can beat it: it has no shared state to coordinate."""
    wd = run.workdir / f"nfs-gw2-{rep}"
    with s3_server() as s3:
        s3_client(s3.endpoint).create_bucket(Bucket=BUCKET + "-2")
        with gateway(wd / "a", s3.endpoint, cpus={cpus[0]}) as a, \
                gateway(wd / "b", s3.endpoint, bucket=BUCKET + "-2", cpus={cpus[1]}) as b:
            s = run.sizes
            meter = CpuMeter({"ckptgw a": a.pid, "ckptgw b": b.pid, "moto": s3.pid}).start()
            figures = tp.measure([a.port, b.port], s.stream_mib * MiB, s.small_seconds, tuple(BOUND_OF))
            cpu = meter.stop()
            run.cpu.append({"scenario": SCENARIO, "server": "two ckptgw, one per CPU", "rep": rep,
                            "wall_s": meter.wall, "cpu_s": cpu})
            if rep == 0:
                run.notes.append(
                    "cores bound: with every CPU taken by one of the two gateways, moto (SCHED_IDLE) gets "
                    "little CPU, so that side's uploads wait (its moto CPU seconds in the CPU table against "
                    "the one-CPU side's): the bound does less upload work than the baseline and so "
                    "over-estimates what a layout of one gateway can reach on this host")
            return figures


def _ganesha_side(run: Run, rep: int) -> tuple[dict, list[float]]:
    with ganesha(run.workdir / f"nfs-ganesha{rep}") as g:
        figures = _measure(run, "ganesha", rep, {"ganesha": g.pid}, g.port)
        try:
            lat = file_sync_writes(g.port, run.sizes.acklat_writes, ACK_SIZE)
        except Exception as e:                 # the CDF's extra line only; the goal is vs local
            run.notes.append(f"ack latency against Ganesha not measured: {e!r}")
            lat = []
        return figures, lat


def run(run: Run) -> None:
    missing = ganesha_missing()
    if missing:
        run.reference_missing(GOAL_OF.values(), f"not run: {missing}")
    one_cpu = len(os.sched_getaffinity(0)) < 2
    if one_cpu:
        run.mark([*CORES_OF.values(), *OF_BOUND.values()], "not run", "this host gives the benchmark one CPU")
    for rep in range(run.sizes.reps):
        got: dict[str, dict] = {}
        for side in in_turn(["gw", "gw1", "gw2", "ganesha"], rep):
            quiesce_disk()
            if side == "gw":
                got["gw"], lat, local = _gateway_side(run, rep)
                ms = [x * 1e3 for x in lat]
                lms = [x * 1e3 for x in local]
                run.add("acklat.p99", percentile(ms, 99), percentile(lms, 99))
                run.samples("ack latency", "ms", "ckptgw FILE_SYNC 256 KiB", ms)
                run.samples("ack latency", "ms", "local write+fdatasync 256 KiB", lms)
            elif side == "gw1" and not one_cpu:
                got["gw1"], _, _ = _gateway_side(run, rep, cpus={min(os.sched_getaffinity(0))})
            elif side == "gw2" and not one_cpu:
                got["gw2"] = _two_gateways_side(run, rep, sorted(os.sched_getaffinity(0))[:2])
            elif side == "ganesha" and not missing:
                got["ganesha"], glat = _ganesha_side(run, rep)
                run.samples("ack latency", "ms", "NFS-Ganesha FILE_SYNC 256 KiB", [x * 1e3 for x in glat])
        for fig, gid in GOAL_OF.items():
            ref = got.get("ganesha", {}).get(fig)
            run.add(gid, got["gw"][fig], ref)
            run.bar("nfs-rs throughput", BY_ID[gid].unit, fig, "ckptgw", got["gw"][fig])
            if ref is not None:
                run.bar("nfs-rs throughput", BY_ID[gid].unit, fig, "NFS-Ganesha", ref)
        for fig, gid in CORES_OF.items():
            if "gw1" in got:
                run.add(gid, got["gw"][fig], got["gw1"][fig])
                run.bar("cores", BY_ID[gid].unit, fig, "ckptgw, all CPUs", got["gw"][fig])
                run.bar("cores", BY_ID[gid].unit, fig, "ckptgw, 1 CPU", got["gw1"][fig])
        for fig, gid in BOUND_OF.items():
            if "gw2" in got and "gw1" in got:
                run.add(gid, got["gw2"][fig], got["gw1"][fig])
                run.bar("cores", BY_ID[gid].unit, fig, "two gateways, one per CPU", got["gw2"][fig])
        for fig, gid in OF_BOUND.items():
            if "gw2" in got:
                run.add(gid, got["gw"][fig], got["gw2"][fig])
    _goal_lines(run)


def _goal_lines(run: Run) -> None:
    """Each goal's bar drawn into its plot, from the medians of its reference."""
    for fig, gid in GOAL_OF.items():
        run.ratio_goal_line("nfs-rs throughput", gid, "NFS-Ganesha", fig)
    for fig, gid in OF_BOUND.items():
        run.ratio_goal_line("cores", gid, "two gateways, one per CPU", fig)
    local = run.series.get("ack latency", {}).get("data", {}).get("local write+fdatasync 256 KiB")
    if local:
        x = threshold("acklat.p99")
        run.goal_line("ack latency", percentile(local, 99) + x, f"goal: p99 ≤ local p99 + {x:g} ms")
