"""Typed settings of the uploader; the appliance maps its TOML config onto these.

Nothing here reads files or the environment: credentials not given explicitly come
from boto3's standard chain (env, shared config, instance profile).
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30

# S3 limits (https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html)
S3_MIN_PART = 5 * MiB            # every part but the last
S3_MAX_PART = 5 * GiB
S3_MAX_PARTS = 10_000
S3_MAX_COPY = 5 * GiB            # CopyObject limit; above it UploadPartCopy


@dataclass(slots=True)
class S3Settings:
    """Where objects go. `prefix` is prepended verbatim to export-relative paths;
    give it a trailing "/" if it names a folder ("ckpt/" -> "ckpt/run1/step10.pt")."""
    bucket: str
    endpoint_url: str | None = None        # None: AWS for the region
    region: str = "us-east-1"
    prefix: str = ""
    addressing_style: str = "auto"         # "auto" | "path" | "virtual"
    access_key: str | None = None          # both None: boto3's credential chain
    secret_key: str | None = None
    session_token: str | None = None
    checksum_algorithm: str = "CRC32"      # "CRC32" | "SHA256" (CRC32C would need botocore[crt])
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        if len(self.bucket) < 3:
            raise ValueError(f"s3 bucket name {self.bucket!r}: need at least 3 characters")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ValueError(f"s3 addressing_style {self.addressing_style!r}: "
                             "expected 'auto', 'path' or 'virtual'")
        if self.checksum_algorithm not in ("CRC32", "SHA256"):
            raise ValueError(f"s3 checksum_algorithm {self.checksum_algorithm!r}: "
                             "expected 'CRC32' or 'SHA256'")
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("s3 access_key and secret_key must be given together")
        if self.prefix.startswith("/"):
            raise ValueError(f"s3 prefix {self.prefix!r} must not start with '/'")


@dataclass(slots=True)
class UploadSettings:
    """How and when the uploader sends data. Rates of 0 mean unlimited."""
    settle_seconds: float = 2.0            # quiet time after the last close before upload
    part_size_min: int = 8 * MiB           # multipart part size floor (raised for huge files)
    multipart_threshold: int = 16 * MiB    # files >= this go up as multipart uploads
    max_concurrency: int = 8               # ceiling of the adaptive (AIMD) concurrency limit
    min_concurrency: int = 1
    foreground_concurrency: int = 2        # requests in flight while clients save or read
                                           # (uploader/foreground.py); 0: no such ceiling
    requests_per_second: float = 0.0       # token bucket on S3 requests (0: unlimited)
    bytes_per_second: float = 0.0          # token bucket on payload bytes (0: unlimited)
    burst_seconds: float = 0.25            # bucket depth = rate * burst_seconds (small: smooth)
    backoff_base: float = 0.2              # exponential backoff with full jitter
    backoff_max: float = 30.0
    poll_interval: float = 0.5             # how often to look for newly eligible files
    readahead_chunk: int = 8 * MiB         # read-through fetch alignment and size
    readahead_chunks: int = 2              # chunks fetched ahead for sequential readers
    evict_interval: float = 5.0            # how often to check the store's watermarks
    abort_orphan_uploads: bool = True      # abort unknown multipart uploads under our prefix at start
    allow_small_parts: bool = False        # tests only: let part_size_min go below 5 MiB

    def __post_init__(self) -> None:
        if self.settle_seconds < 0:
            raise ValueError("upload settle_seconds must be >= 0")
        if self.part_size_min < S3_MIN_PART and not self.allow_small_parts:
            raise ValueError(f"upload part_size_min {self.part_size_min}: S3 needs >= {S3_MIN_PART}")
        if self.part_size_min > S3_MAX_PART:
            raise ValueError(f"upload part_size_min {self.part_size_min}: S3 allows <= {S3_MAX_PART}")
        if self.multipart_threshold < 1:
            raise ValueError("upload multipart_threshold must be >= 1")
        if not 1 <= self.min_concurrency <= self.max_concurrency:
            raise ValueError("upload concurrency: need 1 <= min_concurrency <= max_concurrency")
        if self.foreground_concurrency < 0:
            raise ValueError("upload foreground_concurrency must be >= 0 (0 = no ceiling)")
        if self.requests_per_second < 0 or self.bytes_per_second < 0:
            raise ValueError("upload rates must be >= 0 (0 = unlimited)")
        if self.readahead_chunk < 4096:
            raise ValueError("upload readahead_chunk must be >= 4096")
