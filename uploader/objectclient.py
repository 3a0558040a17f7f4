"""The one interface the uploader talks to S3 through, and its boto3 implementation.

Modelled on mountpoint-s3's `ObjectClient` trait: the uploader, read-through and
importer depend only on `ObjectClient`; tests may wrap it. Keys are full object keys
(the bucket prefix already applied: see uploader.keys). Every call is synchronous and
blocking; asyncio callers run them in a thread pool (uploader.gate.RequestGate).

Errors are classified once, here, into `ThrottledError` (slow down: halve concurrency),
`TransientError` (retry with backoff, forever), `NotFoundError` (no such key / upload)
and `PermanentError` (403, missing bucket, bad request: surfaced loudly, data stays
dirty). botocore's own retries are off so throttles reach our AIMD controller.
"""
from __future__ import annotations

import base64
import hashlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, runtime_checkable

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.handlers import convert_body_to_file_like_object

from .settings import S3Settings


# ---- results -----------------------------------------------------------------------
@dataclass(slots=True)
class PutResult:
    etag: str
    checksum: str | None = None      # "crc32:BASE64" / "sha256:BASE64" as S3 reported or we sent
    version_id: str | None = None    # on a versioned bucket


@dataclass(slots=True)
class PartInfo:
    part_number: int
    etag: str
    size: int = 0
    checksum: str | None = None


@dataclass(slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: float = 0.0                   # unix seconds
    metadata: dict = field(default_factory=dict)  # x-amz-meta-* without the prefix
    checksum: str | None = None
    version_id: str | None = None
    # how `checksum` was computed, as S3 reports it (HeadObject x-amz-checksum-type):
    # "FULL_OBJECT" (of all the bytes) or "COMPOSITE" (of the parts' checksums); None: not said
    checksum_type: str | None = None


@dataclass(slots=True)
class UploadInfo:
    key: str
    upload_id: str
    initiated: float = 0.0


# ---- errors ------------------------------------------------------------------------
class ObjectClientError(Exception):
    """Base of the classified errors; `.code` is S3's error code (or the exception name)."""

    def __init__(self, code: str, message: str = "", status: int = 0):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.status = status


class TransientError(ObjectClientError):
    """Network trouble, 5xx, timeouts: retry with backoff."""


class ThrottledError(TransientError):
    """503 SlowDown / throttling: retry, and cut the concurrency."""


class NotFoundError(ObjectClientError):
    """NoSuchKey / NoSuchUpload / 404."""


class PermanentError(ObjectClientError):
    """Will not succeed by retrying (403, NoSuchBucket, invalid request)."""


class PreconditionFailedError(PermanentError):
    """412: the object under the key is not the one the request named (If-Match and
    friends): somebody replaced or removed it. Callers re-resolve; retrying is pointless."""


_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                   "TooManyRequestsException", "RequestThrottled", "ProvisionedThroughputExceededException",
                   "RequestThrottledException", "BandwidthLimitExceeded"}
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed",
                    "BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "IncompleteBody",
                    "OperationAborted", "500", "502", "503", "504"}
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchUpload", "404", "NotFound"}


def classify(exc: BaseException) -> ObjectClientError:
    """Map a boto3/botocore exception onto our error classes. Exceptions that did not come
    from talking to S3 (a bug, the store) are re-raised as they are."""
    if isinstance(exc, ObjectClientError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "Unknown"))
        msg = str(err.get("Message", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "PreconditionFailed" or status == 412:
            return PreconditionFailedError(code, msg, status)
        if code in _THROTTLE_CODES or status == 429:
            return ThrottledError(code, msg, status)
        if code in _NOT_FOUND_CODES or (status == 404 and code not in ("NoSuchBucket",)):
            return NotFoundError(code, msg, status)
        if code in _TRANSIENT_CODES or status >= 500 or status == 408:
            if status == 503 and code in ("ServiceUnavailable", "503"):
                return ThrottledError(code, msg, status)
            return TransientError(code, msg, status)
        return PermanentError(code, msg, status)
    if isinstance(exc, (botocore.exceptions.NoCredentialsError,
                        botocore.exceptions.PartialCredentialsError,
                        botocore.exceptions.ParamValidationError)):
        return PermanentError(type(exc).__name__, str(exc))
    if isinstance(exc, (botocore.exceptions.HTTPClientError,          # connection reset/closed, timeouts
                        botocore.exceptions.ConnectionError,
                        botocore.exceptions.ResponseStreamingError,
                        botocore.exceptions.IncompleteReadError,
                        botocore.exceptions.FlexibleChecksumError,     # corrupt response body
                        botocore.exceptions.ChecksumError,
                        ConnectionError, TimeoutError)):
        return TransientError(type(exc).__name__, str(exc))
    # anything else raised on the way to S3 (urllib3, http.client, ssl, socket): the network
    # failed, retry. Errors from elsewhere (a bug, the store) are not ours to classify.
    module = type(exc).__module__ or ""
    if (module.split(".")[0] in ("botocore", "urllib3", "http", "ssl", "socket", "s3transfer")
            or (isinstance(exc, OSError) and module == "builtins")):
        return TransientError(type(exc).__name__, str(exc))
    raise exc


# TransientErrors that are S3's answer refusing the request (it was read and not applied:
# the body came short or did not match its digest, the clock is off, a conflicting operation),
# and failures to open a connection at all (nothing was sent)
_REFUSED_CODES = {"RequestTimeout", "RequestTimeTooSkewed", "BadDigest", "InvalidDigest",
                  "XAmzContentSHA256Mismatch", "IncompleteBody", "OperationAborted",
                  "EndpointConnectionError", "ConnectTimeoutError", "ConnectionRefusedError"}


def may_have_applied(err: ObjectClientError) -> bool:
    """Whether a failed request may have been carried out by S3 with its reply lost: a
    TransientError that is not a refusal (a read timeout, a connection reset or closed after
    sending, a 500/502/504). Not a throttle (503 SlowDown, 429: refused, nothing applied), not
    an answer in `_REFUSED_CODES`, not a NotFound or Permanent error (S3 said no)."""
    return (isinstance(err, TransientError) and not isinstance(err, ThrottledError)
            and err.code not in _REFUSED_CODES)


# ---- checksums ---------------------------------------------------------------------
def checksum_b64(algorithm: str, data) -> str:
    """Base64 of the big-endian CRC32 or SHA-256 digest, as S3's x-amz-checksum-* headers."""
    if algorithm == "CRC32":
        return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    if algorithm == "SHA256":
        return base64.b64encode(hashlib.sha256(data).digest()).decode()
    raise ValueError(f"unsupported checksum algorithm {algorithm!r}")


def composite_checksum(algorithm: str, part_checksums_b64: list[str]) -> str:
    """S3's checksum of a multipart object: the checksum of the concatenated part digests,
    suffixed with -N (the COMPOSITE checksum type)."""
    raw = b"".join(base64.b64decode(c) for c in part_checksums_b64)
    return f"{checksum_b64(algorithm, raw)}-{len(part_checksums_b64)}"


def _checksum_from(resp: dict, algorithm: str) -> str | None:
    value = resp.get(f"Checksum{algorithm}")
    return f"{algorithm.lower()}:{value}" if value else None


def _body(body):
    # bytes or bytearray go out as they are (see _send_bodies_whole); anything else
    # (memoryview) is copied once
    return body if isinstance(body, (bytes, bytearray)) else bytes(body)


def _send_bodies_whole(client) -> None:
    """Keep a PUT's or part's bytes as bytes. botocore wraps a bytes Body of PutObject and
    UploadPart in a BytesIO, which is then copied out 1 MiB at a time (holding the GIL) to
    hash it for the signature and sent 128 KiB at a time (64 sends per 8 MiB part, the
    GIL taken back after each). As bytes: one SHA-256 call and one sendall, both without
    the GIL; per 8 MiB part against moto, 10.1-10.3 -> 8.0-8.8 ms of the sending thread's
    CPU. `Expect: 100-continue` (which botocore adds only for a file-like body) is kept, so
    S3 can still refuse a part (503 SlowDown) before its body is sent. A retry resends the
    same bytes (botocore treats bytes as a static body)."""
    for op in ("PutObject", "UploadPart"):
        client.meta.events.unregister(f"before-parameter-build.s3.{op}",
                                      convert_body_to_file_like_object)
        client.meta.events.register(f"before-call.s3.{op}", _expect_continue)


def _expect_continue(params, **kwargs) -> None:
    if params.get("body"):
        params["headers"]["Expect"] = "100-continue"


# ---- protocol ----------------------------------------------------------------------
@runtime_checkable
class ObjectClient(Protocol):
    checksum_algorithm: str

    def put_object(self, key: str, body: bytes, *, metadata: dict[str, str],
                   checksum: str, content_type: str | None = None) -> PutResult: ...

    def create_multipart_upload(self, key: str, *, metadata: dict[str, str]) -> str: ...

    def upload_part(self, key: str, upload_id: str, part_number: int, body: bytes, *,
                    checksum: str) -> PartInfo: ...

    def complete_multipart_upload(self, key: str, upload_id: str, parts: list[PartInfo]) -> PutResult: ...

    def abort_multipart_upload(self, key: str, upload_id: str) -> None: ...

    def list_parts(self, key: str, upload_id: str) -> list[PartInfo]: ...

    def list_multipart_uploads(self, prefix: str) -> list[UploadInfo]: ...

    def copy_object(self, src_key: str, dst_key: str, *, if_match: str | None = None,
                    metadata: dict[str, str] | None = None) -> PutResult: ...

    def upload_part_copy(self, src_key: str, dst_key: str, upload_id: str, part_number: int,
                         first: int, last: int) -> PartInfo: ...

    def delete_object(self, key: str, *, if_match: str | None = None) -> None: ...

    def head_object(self, key: str) -> ObjectInfo | None: ...

    def get_range(self, key: str, offset: int, length: int, *, if_match: str | None = None,
                  version_id: str | None = None) -> bytes: ...

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]: ...

    # retention and lifecycle (uploader.retention / uploader.lifecycle)
    def storage_class(self, key: str) -> str | None: ...

    def change_storage_class(self, key: str, storage_class: str) -> PutResult: ...

    def put_object_tags(self, key: str, tags: dict[str, str]) -> None: ...

    def get_object_tags(self, key: str) -> dict[str, str]: ...

    def object_lock_enabled(self) -> bool: ...

    def set_legal_hold(self, key: str, on: bool) -> None: ...

    def get_legal_hold(self, key: str) -> bool: ...

    def set_retention(self, key: str, mode: str, until: float) -> None: ...

    def get_retention(self, key: str) -> tuple[str, float] | None: ...

    def get_lifecycle_rules(self) -> list[dict]: ...

    def put_lifecycle_rules(self, rules: list[dict]) -> None: ...


# ---- boto3 -------------------------------------------------------------------------
def _tls(endpoint_url: str | None) -> bool:
    """Whether requests go over TLS (None: AWS's own endpoint, always https).

    Over TLS a body needs no SHA-256 in the signature: every PUT and part carries our
    checksum header (signed, and checked by S3 against the body) and TLS guards the
    bytes in transit, which is when botocore itself leaves the payload unsigned. It
    cannot tell here: under request_checksum_calculation="when_required" our own
    x-amz-checksum-* header is not the checksum it looks for, so without this it hashed
    every uploaded byte once more (about 0.6 ms of CPU per MiB). Plain http keeps the
    signed payload, the body's only protection there."""
    return endpoint_url is None or endpoint_url.lower().startswith("https://")


class Boto3ObjectClient:
    """`ObjectClient` over one bucket with plain boto3 (no CRT needed)."""

    def __init__(self, s3: S3Settings, *, max_pool_connections: int = 64):
        # uploads and read-through each keep up to max_concurrency requests in flight
        self.bucket = s3.bucket
        self.prefix = s3.prefix          # carried for the uploader; calls take full keys
        self.checksum_algorithm = s3.checksum_algorithm
        config = Config(
            region_name=s3.region,
            s3={"addressing_style": s3.addressing_style,
                "payload_signing_enabled": not _tls(s3.endpoint_url)},
            retries={"total_max_attempts": 1, "mode": "standard"},   # our AIMD does the retrying
            connect_timeout=s3.connect_timeout,
            read_timeout=s3.read_timeout,
            max_pool_connections=max_pool_connections,
            request_checksum_calculation="when_required",   # we send our own checksums
            response_checksum_validation="when_supported",
        )
        session = boto3.session.Session(
            aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key,
            aws_session_token=s3.session_token, region_name=s3.region)
        self._s3 = session.client("s3", endpoint_url=s3.endpoint_url, config=config)
        _send_bodies_whole(self._s3)

    # called as observer(method, seconds, error_code or None) after every request (metrics);
    # it runs on the calling thread and must be quick
    observer: Callable[[str, float, str | None], None] | None = None

    # Every call goes through _call so errors come out classified.
    def _call(self, name: str, **kwargs):
        started, code = time.monotonic(), None
        try:
            return getattr(self._s3, name)(Bucket=self.bucket, **kwargs)
        except Exception as exc:         # noqa: BLE001 - classified and re-raised
            code = type(exc).__name__    # kept when classify re-raises an error not from S3
            err = classify(exc)
            code = err.code
            raise err from exc
        finally:
            if self.observer is not None:
                self.observer(name, time.monotonic() - started, code)

    def _checksum_args(self, checksum: str) -> dict:
        return {"ChecksumAlgorithm": self.checksum_algorithm, f"Checksum{self.checksum_algorithm}": checksum}

    @staticmethod
    def _verify(what: str, stored: str | None, sent: str) -> None:
        # S3 rejects a mismatch itself (BadDigest); a server that stores anyway but reports
        # its own checksum (moto) is caught here. Either way: retry the upload.
        if stored is not None and stored != sent:
            raise TransientError("BadDigest", f"{what}: stored checksum {stored} != sent {sent}")

    def put_object(self, key, body, *, metadata, checksum, content_type=None) -> PutResult:
        extra = {"ContentType": content_type} if content_type else {}
        resp = self._call("put_object", Key=key, Body=_body(body), Metadata=metadata,
                          **self._checksum_args(checksum), **extra)
        self._verify(key, resp.get(f"Checksum{self.checksum_algorithm}"), checksum)
        return PutResult(resp["ETag"], f"{self.checksum_algorithm.lower()}:{checksum}", resp.get("VersionId"))

    def create_multipart_upload(self, key, *, metadata) -> str:
        resp = self._call("create_multipart_upload", Key=key, Metadata=metadata,
                          ChecksumAlgorithm=self.checksum_algorithm)
        return resp["UploadId"]

    def upload_part(self, key, upload_id, part_number, body, *, checksum) -> PartInfo:
        resp = self._call("upload_part", Key=key, UploadId=upload_id, PartNumber=part_number,
                          Body=_body(body), **self._checksum_args(checksum))
        self._verify(f"{key}#{part_number}", resp.get(f"Checksum{self.checksum_algorithm}"), checksum)
        return PartInfo(part_number, resp["ETag"], len(body), checksum)

    def complete_multipart_upload(self, key, upload_id, parts) -> PutResult:
        algo = self.checksum_algorithm
        body = {"Parts": [{"PartNumber": p.part_number, "ETag": p.etag,
                           **({f"Checksum{algo}": p.checksum} if p.checksum else {})}
                          for p in sorted(parts, key=lambda p: p.part_number)]}
        resp = self._call("complete_multipart_upload", Key=key, UploadId=upload_id,
                          MultipartUpload=body)
        reported = _checksum_from(resp, algo)
        if reported is None and all(p.checksum for p in parts):
            reported = f"{algo.lower()}:{composite_checksum(algo, [p.checksum for p in parts])}"
        return PutResult(resp["ETag"], reported, resp.get("VersionId"))

    def abort_multipart_upload(self, key, upload_id) -> None:
        self._call("abort_multipart_upload", Key=key, UploadId=upload_id)

    def list_parts(self, key, upload_id) -> list[PartInfo]:
        parts: list[PartInfo] = []
        marker = 0
        while True:
            resp = self._call("list_parts", Key=key, UploadId=upload_id, PartNumberMarker=marker)
            for p in resp.get("Parts", []):
                parts.append(PartInfo(p["PartNumber"], p["ETag"], p.get("Size", 0),
                                      p.get(f"Checksum{self.checksum_algorithm}")))
            if not resp.get("IsTruncated"):
                return parts
            marker = int(resp["NextPartNumberMarker"])

    def list_multipart_uploads(self, prefix) -> list[UploadInfo]:
        out: list[UploadInfo] = []
        kwargs: dict = {"Prefix": prefix}
        while True:
            resp = self._call("list_multipart_uploads", **kwargs)
            for u in resp.get("Uploads", []):
                initiated = u.get("Initiated")
                out.append(UploadInfo(u["Key"], u["UploadId"],
                                      initiated.timestamp() if initiated else 0.0))
            if not resp.get("IsTruncated"):
                return out
            kwargs.update(KeyMarker=resp.get("NextKeyMarker", ""),
                          UploadIdMarker=resp.get("NextUploadIdMarker", ""))

    def copy_object(self, src_key, dst_key, *, if_match=None, metadata=None) -> PutResult:
        # ChecksumAlgorithm on copies: S3 computes a fresh full-object checksum (and moto
        # otherwise carries a multipart source's checksum over, breaking GET validation).
        # if_match: copy only that version of the source (x-amz-copy-source-if-match; moto
        # 5.2.5 ignores it, so the worker HEADs and compares first as well).
        # metadata: the copy is another file's object (a COPY/CLONE mirrored), so it gets that
        # file's identity (REPLACE) instead of the source's (COPY: a rename keeps its own)
        extra = {"CopySourceIfMatch": if_match} if if_match else {}
        if metadata is not None:
            extra.update(MetadataDirective="REPLACE", Metadata=metadata)
        else:
            extra["MetadataDirective"] = "COPY"
        resp = self._call("copy_object", Key=dst_key, CopySource={"Bucket": self.bucket, "Key": src_key},
                          ChecksumAlgorithm=self.checksum_algorithm, **extra)
        result = resp.get("CopyObjectResult", {})
        return PutResult(result.get("ETag", ""), _checksum_from(result, self.checksum_algorithm),
                         resp.get("VersionId"))

    def upload_part_copy(self, src_key, dst_key, upload_id, part_number, first, last) -> PartInfo:
        resp = self._call("upload_part_copy", Key=dst_key, UploadId=upload_id, PartNumber=part_number,
                          CopySource={"Bucket": self.bucket, "Key": src_key},
                          CopySourceRange=f"bytes={first}-{last}")
        result = resp.get("CopyPartResult", {})
        return PartInfo(part_number, result.get("ETag", ""), last - first + 1,
                        result.get(f"Checksum{self.checksum_algorithm}"))

    def delete_object(self, key, *, if_match=None) -> None:
        # if_match: delete only that object (S3's conditional delete; 412 if it was replaced)
        self._call("delete_object", Key=key, **({"IfMatch": if_match} if if_match else {}))

    def head_object(self, key) -> ObjectInfo | None:
        try:
            resp = self._call("head_object", Key=key, ChecksumMode="ENABLED")
        except NotFoundError:
            return None
        lm = resp.get("LastModified")
        return ObjectInfo(key, resp.get("ContentLength", 0), resp.get("ETag", ""),
                          lm.timestamp() if lm else 0.0, dict(resp.get("Metadata", {})),
                          _checksum_from(resp, self.checksum_algorithm), resp.get("VersionId"),
                          resp.get("ChecksumType"))

    def get_range(self, key, offset, length, *, if_match=None, version_id=None) -> bytes:
        """if_match / version_id pin the read to the object we mean (412 / 404 otherwise):
        bytes of another object are never returned in its place."""
        if length <= 0:
            return b""
        extra = {}
        if if_match:
            extra["IfMatch"] = if_match
        if version_id:
            extra["VersionId"] = version_id
        resp = self._call("get_object", Key=key, Range=f"bytes={offset}-{offset + length - 1}", **extra)
        try:
            return resp["Body"].read()
        except Exception as exc:         # noqa: BLE001 - a body cut mid-stream
            raise classify(exc) from exc
        finally:
            resp["Body"].close()

    def list_objects(self, prefix) -> Iterator[ObjectInfo]:
        kwargs: dict = {"Prefix": prefix}
        while True:
            resp = self._call("list_objects_v2", **kwargs)
            for o in resp.get("Contents", []):
                lm = o.get("LastModified")
                yield ObjectInfo(o["Key"], o.get("Size", 0), o.get("ETag", ""),
                                 lm.timestamp() if lm else 0.0)
            if not resp.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    # ---- retention and lifecycle ----------------------------------------------------------
    def storage_class(self, key) -> str | None:
        """The object's storage class (S3 omits the header for STANDARD); None if missing."""
        try:
            resp = self._call("head_object", Key=key)
        except NotFoundError:
            return None
        return resp.get("StorageClass") or "STANDARD"

    def change_storage_class(self, key, storage_class) -> PutResult:
        """CopyObject onto itself with a new StorageClass (metadata and tags carried over).
        ChecksumAlgorithm: a fresh full-object checksum (and moto's multipart quirk)."""
        resp = self._call("copy_object", Key=key, CopySource={"Bucket": self.bucket, "Key": key},
                          StorageClass=storage_class, MetadataDirective="COPY",
                          ChecksumAlgorithm=self.checksum_algorithm)
        result = resp.get("CopyObjectResult", {})
        return PutResult(result.get("ETag", ""), _checksum_from(result, self.checksum_algorithm))

    def put_object_tags(self, key, tags) -> None:
        self._call("put_object_tagging", Key=key,
                   Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]})

    def get_object_tags(self, key) -> dict[str, str]:
        resp = self._call("get_object_tagging", Key=key)
        return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}

    def object_lock_enabled(self) -> bool:
        try:
            resp = self._call("get_object_lock_configuration")
        except (NotFoundError, PermanentError) as e:
            if e.code in ("ObjectLockConfigurationNotFoundError", "404") or e.status == 404:
                return False
            raise
        return resp.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"

    def set_legal_hold(self, key, on) -> None:
        self._call("put_object_legal_hold", Key=key, LegalHold={"Status": "ON" if on else "OFF"})

    def get_legal_hold(self, key) -> bool:
        try:
            resp = self._call("get_object_legal_hold", Key=key)
        except PermanentError as e:
            if e.code in ("NoSuchObjectLockConfiguration", "InvalidRequest"):
                return False
            raise
        return resp.get("LegalHold", {}).get("Status") == "ON"

    def set_retention(self, key, mode, until) -> None:
        import datetime
        self._call("put_object_retention", Key=key, Retention={
            "Mode": mode, "RetainUntilDate": datetime.datetime.fromtimestamp(until, datetime.timezone.utc)})

    def get_retention(self, key) -> tuple[str, float] | None:
        # HEAD carries the lock mode and date (GetObjectRetention answers 500 on moto 5.2.5
        # for an object without one, and a plain S3 error on real S3: HEAD serves both)
        resp = self._call("head_object", Key=key)
        mode, until = resp.get("ObjectLockMode"), resp.get("ObjectLockRetainUntilDate")
        return (mode, until.timestamp()) if mode and until else None

    def get_lifecycle_rules(self) -> list[dict]:
        try:
            resp = self._call("get_bucket_lifecycle_configuration")
        except (NotFoundError, PermanentError) as e:
            if e.code == "NoSuchLifecycleConfiguration":
                return []
            raise
        return list(resp.get("Rules", []))

    def put_lifecycle_rules(self, rules) -> None:
        if rules:
            self._call("put_bucket_lifecycle_configuration", LifecycleConfiguration={"Rules": rules})
        else:
            self._call("delete_bucket_lifecycle")
