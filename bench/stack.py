"""The servers a benchmark runs, each as a context manager that yields a `Running` handle:

  s3_server()      moto's S3 server on loopback, every thread SCHED_IDLE and at nice 19 (the test
                   S3 is not the product: its CPU must not be taken from the gateway), over TLS
                   unless tls=False, as S3 is reached in production (over plain http boto3 signs
                   a SHA-256 of every uploaded byte, ~0.6 ms of CPU per MiB that a gateway talking
                   to S3 over https does not spend: uploader/objectclient._tls); moto spills
                   every value over its key buffer size (about 5 MiB) to a temporary file, which
                   is on tmpfs unless in_memory=False, so the test S3's writes do not queue on the
                   gateway's disk ahead of its fdatasyncs (a real S3 is not on that disk)
  gateway(...)     `ckptgw serve` (testkit/appliance_live.LiveDaemon) with its uploader
                   draining to an S3 endpoint, optionally started on a subset of the CPUs
  ganesha(...)     NFS-Ganesha (VFS FSAL) exporting a scratch directory (testkit/kclient/ganesha)

All listen on 127.0.0.1 only and are stopped (their own pid only) when the block ends.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from testkit.motoserver import MotoServer

from .procs import idle_all, renice_all

S3_NICE = 19
SPILL_ROOT = "/dev/shm"             # tmpfs: moto's temporary files in memory
SPILL_MIN_FREE = 8 << 30            # else on disk (Running.extra["spill"] says which)
BUCKET = "bench"
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@dataclass
class Running:
    name: str
    pid: int
    port: int = 0
    endpoint: str = ""
    startup_s: float = 0.0
    handle: object = None
    extra: dict = field(default_factory=dict)


# the certificate to trust for each test S3 over TLS that s3_server() runs, by endpoint
_CA_BUNDLES: dict[str, str] = {}


def ca_bundle(endpoint: str) -> str | None:
    """The CA bundle of a test S3 that s3_server() runs over TLS at `endpoint`, else None."""
    return _CA_BUNDLES.get(endpoint)


def s3_client(endpoint: str, **config):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, config=Config(**config) if config else None,
                        verify=ca_bundle(endpoint), **CREDS)


def _spill_dir() -> str | None:
    """A fresh directory on tmpfs for moto's temporary files, or None (no tmpfs with room)."""
    try:
        st = os.statvfs(SPILL_ROOT)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < SPILL_MIN_FREE:
        return None
    return tempfile.mkdtemp(prefix="bench-moto-", dir=SPILL_ROOT)


@contextmanager
def s3_server(*, nice: int = S3_NICE, bucket: str | None = BUCKET, in_memory: bool = True,
              tls: bool = True):
    """in_memory: moto's temporary files on tmpfs, if SPILL_ROOT has SPILL_MIN_FREE bytes free
    (False for a scenario whose objects do not fit in a few GiB: the 8 GiB RSS save). tls=False:
    plain http (a fault proxy in front of it speaks http)."""
    spill = _spill_dir() if in_memory else None
    moto = MotoServer(spill_dir=spill, tls=tls)
    if moto.ca_bundle:
        _CA_BUNDLES[moto.endpoint] = moto.ca_bundle
    try:
        renice_all(moto.proc.pid, nice)
        idle_all(moto.proc.pid)
        if bucket:
            s3_client(moto.endpoint).create_bucket(Bucket=bucket)
        yield Running("moto", moto.proc.pid, moto.port, moto.endpoint, handle=moto,
                      extra={"spill": "tmpfs" if spill else "disk", "tls": tls})
    finally:
        _CA_BUNDLES.pop(moto.endpoint, None)
        moto.stop()
        if spill:
            shutil.rmtree(spill, ignore_errors=True)


def gateway_args(s3_endpoint: str, bucket: str = BUCKET, *, settle: float = 2.0) -> list[str]:
    """`ckptgw serve` flags for an S3 endpoint on loopback (moto or a fault proxy in front of it)."""
    return ["--s3-endpoint", s3_endpoint, "--s3-bucket", bucket, "--s3-access-key", "testing",
            "--s3-secret-key", "testing", "--s3-addressing-style", "path", "--upload-settle", str(settle)]


@contextmanager
def gateway(workdir: Path, s3_endpoint: str, *, bucket: str = BUCKET, settle: float = 2.0,
            extra: tuple[str, ...] = (), cpus: set[int] | None = None, cache_dir: Path | None = None):
    """`ckptgw serve` in the product's setting: NFS on 127.0.0.1, its uploader draining to
    s3_endpoint after the default settle time. cpus: CPU affinity of the daemon (inherited by
    every thread and child process it starts); None: all CPUs."""
    from testkit.appliance_live import LiveDaemon

    workdir.mkdir(parents=True, exist_ok=True)
    ca = ca_bundle(s3_endpoint)
    d = LiveDaemon(workdir, *gateway_args(s3_endpoint, bucket, settle=settle), *extra, cache_dir=cache_dir,
                   env={"AWS_CA_BUNDLE": ca} if ca else None)
    mask = os.sched_getaffinity(0)
    t0 = time.perf_counter()
    try:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)     # this thread only: the child inherits it at fork
        try:
            d.start()
        finally:
            os.sched_setaffinity(0, mask)
        startup = time.perf_counter() - t0
        yield Running("ckptgw", d.proc.pid, d.nfs_port, startup_s=startup, handle=d)
    finally:
        d.close()


def ganesha_missing() -> str | None:
    """Why NFS-Ganesha cannot run here, or None."""
    from testkit.kclient.ganesha import VFS_FSAL
    if not shutil.which("ganesha.nfsd"):
        return "ganesha.nfsd not installed (bash scripts/install-system-deps.sh --bench)"
    if not os.path.exists(VFS_FSAL):
        return f"{VFS_FSAL} missing (apt-get install nfs-ganesha-vfs)"
    if os.geteuid() != 0:
        return "NFS-Ganesha needs root here"
    return None


@contextmanager
def ganesha(workdir: Path):
    from testkit.loopback import free_port
    from testkit.kclient.ganesha import GaneshaServer

    g = GaneshaServer(workdir, free_port())
    t0 = time.perf_counter()
    g.start()
    try:
        yield Running("ganesha", g.proc.pid, g.port, startup_s=time.perf_counter() - t0, handle=g)
    finally:
        g.stop()
