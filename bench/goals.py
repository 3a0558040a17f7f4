"""Every performance goal of issues 15 and 37, as data: what is compared with what, and the bar.
Where issue 37 (the native engine) restates a goal of issue 15 with another bar, issue 37's bar is
the one judged (ack latency, the cores goal, CPU per request).

A goal's figure is computed per repetition from the ckptgw value and the reference value
measured in the same repetition (side by side), so the load of the moment hits both; the
report gives min / median / max of that figure and judges the median.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Goal:
    id: str
    scenario: str                    # groups rows and names the plot
    title: str
    unit: str                        # of the ckptgw and reference values
    reference: str                   # what the reference column is
    figure: Callable[[float, float | None], float]     # (ckptgw, reference) -> the judged figure
    figure_name: str                 # "ratio", "difference (ms)", ...
    bar: str                         # the goal as the issue states it
    met: Callable[[float], bool] | None     # None: the issue sets no bar; reported only


def _ratio(a, b):
    return a / b


def _inverse_ratio(a, b):
    return b / a


def _at_least(x):
    met = lambda v: v >= x              # noqa: E731
    met.threshold, met.sign = x, "≥"    # drawn as the goal's line in its plot
    return met


def _at_most(x):
    met = lambda v: v <= x              # noqa: E731
    met.threshold, met.sign = x, "≤"
    return met


def threshold(gid: str) -> float:
    """The number of a goal's bar (≥ x or ≤ x), for the line the plots draw."""
    return BY_ID[gid].met.threshold


def sign(gid: str) -> str:
    """"≥" or "≤": which side of threshold(gid) the goal wants."""
    return BY_ID[gid].met.sign


def _g(id, scenario, title, unit, reference, bar, met, figure=_ratio, figure_name="ratio"):
    return Goal(id, scenario, title, unit, reference, figure, figure_name, bar, met)


GE1 = "≥ 1.0x"
GOALS: tuple[Goal, ...] = (
    _g("nfsrs.write1", "nfs-rs throughput", "1 stream of 1 MiB durable writes", "MB/s", "NFS-Ganesha (VFS)",
       GE1, _at_least(1.0)),
    _g("nfsrs.write8", "nfs-rs throughput", "8 streams of 1 MiB durable writes", "MB/s", "NFS-Ganesha (VFS)",
       GE1, _at_least(1.0)),
    _g("nfsrs.read1", "nfs-rs throughput", "1 read stream", "MB/s", "NFS-Ganesha (VFS)", GE1, _at_least(1.0)),
    _g("nfsrs.small1", "nfs-rs throughput", "small-file saves (4 KiB write+close+rename+unlink), 1 client",
       "files/s", "NFS-Ganesha (VFS)", GE1, _at_least(1.0)),
    _g("nfsrs.small8", "nfs-rs throughput", "small-file saves, 8 clients", "files/s", "NFS-Ganesha (VFS)",
       GE1, _at_least(1.0)),
    _g("kclient.dd_write", "kernel client", "dd write conv=fsync (qemu guest)", "MB/s", "NFS-Ganesha (VFS)",
       GE1, _at_least(1.0)),
    _g("kclient.dd_read", "kernel client", "dd read after drop_caches (qemu guest)", "MB/s",
       "NFS-Ganesha (VFS)", GE1, _at_least(1.0)),
    _g("kclient.ckpt_save", "kernel client", "sharded checkpoint save (qemu guest)", "MB/s",
       "NFS-Ganesha (VFS)", GE1, _at_least(1.0)),
    _g("acklat.p99", "ack latency", "p99 of 256 KiB FILE_SYNC writes", "ms",
       "local 256 KiB write+fdatasync p99", "≤ 1 ms over local (issue 37; issue 15: 2 ms)", _at_most(1.0),
       figure=lambda a, b: a - b, figure_name="difference (ms)"),
    _g("s3indep.faulty_over_clean", "save vs S3 faults", "3 consecutive checkpoint saves, S3 at +35 ms and 20% 503s",
       "s", "the same save, clean S3", "≤ 1.05", _at_most(1.05)),
    _g("s3indep.boto3_over_gateway", "save vs S3 faults",
       "direct boto3 upload of the shards through the faulty S3 (ckptgw: gateway save through it)", "s",
       "boto3 TransferManager, faulty S3", "≥ 3x", _at_least(3.0), figure=_inverse_ratio,
       figure_name="boto3 ÷ gateway"),
    _g("drain.rate", "drain", "uploader drain rate", "MB/s", "boto3 TransferManager (same part size, concurrency)",
       "≥ 0.9x", _at_least(0.9)),
    _g("drain.amplification", "drain", "bytes PUT ÷ bytes saved (tmp + fsync + rename saves)", "MiB",
       "bytes saved", "= 1.00", lambda v: round(v, 2) == 1.0),
    _g("restart.read", "restart read", "read of the last checkpoint through from S3 at +35 ms", "MB/s",
       "the same read from the local cache", "reported (no bar in the issue)", None),
    _g("scale.startup", "scale", "start-up (spawn to READY) with many files in the store", "s",
       "the same with 1k files", "reported (no bar in the issue)", None),
    _g("scale.lookup_p99", "scale", "LOOKUP+GETATTR p99 with many files in the store", "ms",
       "the same with 1k files", "reported (no bar in the issue)", None),
    _g("scale.rss", "RSS while saving", "gateway peak RSS while saving (uploader draining)", "MiB",
       "the bar: 256 MiB", "≤ 256 MiB", _at_most(256.0), figure=lambda a, b: a, figure_name="peak MiB"),
    # issue 37's cores goal: one gateway on all CPUs against the bound below, of the same run
    _g("cores.write8_of_bound", "cores", "8 nfs-rs write streams, all cores, ÷ the two-gateway bound", "MB/s",
       "two independent gateways, one per CPU", "≥ 0.9x (issue 37)", _at_least(0.9)),
    _g("cores.small8_of_bound", "cores", "small-file saves, 8 clients, all cores, ÷ the two-gateway bound",
       "files/s", "two independent gateways, one per CPU", "≥ 0.9x (issue 37)", _at_least(0.9)),
    _g("cores.write8", "cores", "8 nfs-rs write streams, all cores", "MB/s", "the gateway on one core",
       "reported (issue 15's ≥ 1.6x; issue 37 judges the bound ratio above)", None),
    _g("cores.small8", "cores", "small-file saves, 8 clients, all cores", "files/s", "the gateway on one core",
       "reported (issue 15's ≥ 1.6x; issue 37 judges the bound ratio above)", None),
    # what the goal's bar can be on this host: no gateway layout beats shared-nothing servers
    # one per CPU, and the benchmark's own clients run on those CPUs too
    _g("cores.bound_write8", "cores", "bound of any layout: 8 write streams split over two independent "
       "gateways, one per CPU", "MB/s", "the gateway on one core", "reported (the bound of the cores goal here)",
       None),
    _g("cores.bound_small8", "cores", "bound of any layout: 8-client small files split over two independent "
       "gateways, one per CPU", "files/s", "the gateway on one core", "reported (the bound of the cores goal here)",
       None),
    # the cause behind the nfs-rs rows, per request (bench/scenarios/request.py)
    _g("request.compound_rtt", "per request", "round trip per COMPOUND, one nfs-rs client (exists() loop)", "µs",
       "NFS-Ganesha (VFS)", "reported (the cause of the nfs-rs rows)", None),
    _g("request.compound_cpu", "per request", "server CPU (user + system) per COMPOUND, same loop", "µs",
       "NFS-Ganesha (VFS)", "≤ 1.0x (issue 37: CPU per LOOKUP COMPOUND)", _at_most(1.0)),
    _g("request.null_cpu", "per request", "server CPU per RPC NULL call (transport and RPC layers alone)", "µs",
       "NFS-Ganesha (VFS)", "≤ 1.0x (issue 37)", _at_most(1.0)),
    _g("request.user_cpu_per_mib", "per request", "server user CPU per MiB of 1 MiB durable writes, one nfs-rs "
       "stream (the gateway's whole process, its uploader included)", "ms", "NFS-Ganesha (VFS)",
       "≤ 1.0x (issue 37)", _at_most(1.0)),
    _g("request.crossings_write", "per request", "thread crossings per UNSTABLE WRITE of 256 KiB (waits for "
       "another thread, each way)", "crossings", "the bar: 0", "= 0 (issue 37)", _at_most(0.0),
       figure=lambda a, b: a, figure_name="crossings"),
    _g("request.crossings_read", "per request", "thread crossings per READ of 256 KiB in the page cache (a "
       "read that would wait for the disk goes to the worker pool: 2)", "crossings", "the bar: 0",
       "= 0 (issue 37)", _at_most(0.0), figure=lambda a, b: a, figure_name="crossings"),
    _g("request.python_floor", "per request", "floor of any CPython event-loop server: CPU per NULL call answered "
       "with a canned reply, nothing decoded (ckptgw column)", "µs", "NFS-Ganesha's CPU per NULL call",
       "reported (the cause of the nfs-rs rows)", None),
    # issue 37: what one small-file save costs in durable steps and round trips
    # (bench/scenarios/anatomy.py; strace on the server, a counting proxy before it)
    _g("anatomy.fdatasyncs", "small-file anatomy", "fdatasyncs per file (fdatasync + fsync calls of the server, "
       "one nfs-rs client saving 4 KiB files)", "calls", "NFS-Ganesha (VFS)",
       "reported (issue 37 asks for the figure)", None),
    _g("anatomy.compounds", "small-file anatomy", "COMPOUNDs per file (the same saves)", "COMPOUNDs",
       "NFS-Ganesha (VFS)", "reported (issue 37 asks for the figure)", None),
    # issue 37 point 1: the headroom a native engine on uvloop has against Ganesha
    _g("request.uvloop_floor", "per request", "floor of a uvloop server (the gateway's loop): CPU per NULL call "
       "answered with a canned reply, nothing decoded (ckptgw column)", "µs", "NFS-Ganesha's CPU per NULL call",
       "reported (the headroom of the native engine)", None),
)
BY_ID = {g.id: g for g in GOALS}
