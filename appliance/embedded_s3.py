"""The try-out object store: moto's S3 server in this process, on loopback, in memory.

Used when no S3 endpoint is configured, so `ckptgw serve` works without an AWS account.
Everything in it is lost when the process exits; the daemon therefore never evicts in this
mode and re-uploads at start whatever the cache holds that the (new, empty) store lacks.
"""
from __future__ import annotations

import sys

import structlog

log = structlog.get_logger(__name__)

# moto accepts any credentials; fixed dummies keep boto3 from searching for real ones
CREDENTIALS = ("ckptgw-tryout", "ckptgw-tryout-secret", None)

BANNER_LINES = (
    "ckptgw TRY-OUT MODE: no S3 endpoint is configured.",
    "Objects go to an EMBEDDED IN-MEMORY S3 (moto) at {endpoint}",
    "and are LOST when ckptgw stops. The cache is never evicted in this mode.",
    "Set [s3] endpoint and bucket (or --s3-endpoint/--s3-bucket) for real use.",
)


def banner(endpoint: str) -> str:
    lines = [line.format(endpoint=endpoint) for line in BANNER_LINES]
    width = max(len(line) for line in lines)
    rule = "*" * (width + 6)
    return "\n".join([rule, *(f"*  {line.ljust(width)}  *" for line in lines), rule]) + "\n"


def show_banner(text: str, stderr=None) -> bool:
    """The banner is for the person at the terminal, not for whatever reads the log stream:
    on stderr when stderr is a terminal, else on the controlling terminal (/dev/tty) when
    there is one, else nowhere (stderr is then a file, a pipe or the journal, where the JSON
    log lines go: the embedded_s3_tryout_mode warning says the same there). True if shown."""
    stream = stderr if stderr is not None else sys.stderr
    try:
        on_tty = stream.isatty()
    except (AttributeError, ValueError):
        on_tty = False
    if on_tty:
        stream.write(text)
        stream.flush()
        return True
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(text)
    except OSError:             # no controlling terminal (a service, a detached session)
        return False
    return True


class TryoutUnavailable(RuntimeError):
    """No S3 endpoint is configured and moto (the `tryout` extra) is not installed."""


class EmbeddedS3:
    def __init__(self, bucket: str, host: str = "127.0.0.1", port: int = 0):
        self.bucket = bucket
        self.host, self.port = host, port
        self._server = None
        self.endpoint: str | None = None

    def start(self) -> str:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise TryoutUnavailable(
                "no S3 endpoint is configured ([s3] endpoint or --s3-endpoint), and try-out mode's embedded "
                "S3 needs the 'tryout' extra, which is not installed (pip install 'ckptgw[tryout]'; "
                "scripts/run does). For real use set [s3] endpoint and bucket.") from None
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client().create_bucket(Bucket=self.bucket)
        log.warning("embedded_s3_tryout_mode", endpoint=self.endpoint, bucket=self.bucket,
                    detail="objects are kept in memory and lost at exit; the cache is never evicted")
        show_banner(banner(self.endpoint))
        return self.endpoint

    def client(self):
        import boto3
        from botocore.config import Config
        ak, sk, _ = CREDENTIALS
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ak, aws_secret_access_key=sk,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def keys(self, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.update(o["Key"] for o in page.get("Contents", ()))
        return out

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None
