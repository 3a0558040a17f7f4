"""An in-process object store for the integrity model test: the uploader's `ObjectClient`
over plain dicts, keeping EVERY version of every key.

Why not moto: the model test takes thousands of steps per second and must judge the
bucket's whole history (was `latest.pt` ever missing? did any object ever hold bytes of two
file versions?), which needs a store that remembers each version and where its bytes came
from. moto stays the backend of the e2e tests.

What it models of S3:
  - versions: each key has a history of `Version`s (puts, completed multipart uploads,
    copies, delete markers); `current(key)` is the newest unless it is a delete marker;
  - ETags as S3 computes them (MD5 of the body; multipart: MD5 of the part MD5s + "-N");
  - metadata (x-amz-meta-*), content type, multipart uploads (parts, complete with part
    ETag checks, abort, list), copies, ranged GETs;
  - conditional requests where S3 has them, taken as keyword arguments so a client may use
    them or not: GET / HEAD / CopyObject source / DeleteObject `if_match` (ETag), PutObject and
    CompleteMultipartUpload `if_match` / `if_none_match` ("*"); a failed condition raises
    412 PreconditionFailed;
  - faults the test controls: `outage` (every request fails as a refused connection, nothing
    applied), `slowdown` (that fraction of requests answer 503 SlowDown, nothing applied) and
    `lost_reply` (that fraction of mutating requests ARE applied but the reply is lost: the
    client sees a transient error and must be idempotent). Draws come from a seeded Random.

Provenance: `origin_of(body, metadata) -> frozenset` (set by the test) names every local
file version (ino, data sequence) whose whole content equals the body; each stored version
keeps that set in `.origin`, so "no object holds bytes of two versions" is `origin != {}`
for every version that claims to be a file's data (see `torn_versions`).
"""
from __future__ import annotations

import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field

from uploader import objectclient as oc
from uploader.objectclient import (NotFoundError, ObjectInfo, PartInfo, PermanentError, PutResult,
                                   ThrottledError, TransientError, UploadInfo, checksum_b64)


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _precondition_failed(what: str) -> Exception:
    # the uploader may grow its own class for 412 (issue 13); S3 answers 412 either way
    cls = getattr(oc, "PreconditionFailedError", PermanentError)
    return cls("PreconditionFailed", what, 412)


def _etag_eq(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip('"') == b.strip('"')


@dataclass
class Version:
    key: str
    seq: int                          # global order of every version of every key
    data: bytes = b""
    etag: str = ""
    metadata: dict = field(default_factory=dict)
    content_type: str | None = None
    deleted: bool = False             # a delete marker
    op: str = ""                      # PutObject | CompleteMultipartUpload | CopyObject | DeleteObject | external
    origin: frozenset = frozenset()   # {(ino, data_seq)} whose whole content equals data
    t: float = 0.0

    @property
    def version_id(self) -> str:
        return f"v{self.seq}"


@dataclass
class _Upload:
    key: str
    upload_id: str
    metadata: dict
    initiated: float
    parts: dict = field(default_factory=dict)   # number -> (data, etag, checksum)


class FakeS3:
    checksum_algorithm = "CRC32"

    def __init__(self, *, prefix: str = "", seed: int = 0):
        self.prefix = prefix
        self.history: dict[str, list[Version]] = {}
        self.uploads: dict[str, _Upload] = {}
        self.outage = False
        self.slowdown = 0.0
        self.lost_reply = 0.0
        self.rng = random.Random(seed)
        self.origin_of = None            # callable(body, metadata) -> frozenset, set by the test
        self.requests: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.tags: dict[str, dict] = {}
        self.storage: dict[str, str] = {}
        self.lifecycle: list[dict] = []
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)

    # ---- inspection (tests) ---------------------------------------------------------
    def current(self, key: str) -> Version | None:
        hist = self.history.get(key)
        if not hist or hist[-1].deleted:
            return None
        return hist[-1]

    def keys(self) -> list[str]:
        return sorted(k for k in self.history if self.current(k) is not None)

    def snapshot(self) -> dict[str, bytes]:
        return {k: self.current(k).data for k in self.keys()}

    def versions(self, since_seq: int = 0):
        """Every version stored after `since_seq`, in order."""
        out = [v for hist in self.history.values() for v in hist if v.seq > since_seq]
        return sorted(out, key=lambda v: v.seq)

    @property
    def last_seq(self) -> int:
        return max((h[-1].seq for h in self.history.values() if h), default=0)

    def ever_held(self, key: str) -> bool:
        return any(not v.deleted for v in self.history.get(key, []))

    def put_external(self, key: str, data: bytes, metadata: dict | None = None) -> Version:
        """An object written by somebody else (a training job writing the bucket directly)."""
        return self._store(key, data, _md5(data), dict(metadata or {}), None, "external",
                           frozenset({("external", key, _md5(data))}))

    # ---- fault injection ---------------------------------------------------------------
    def _enter(self, op: str, *, mutating: bool) -> bool:
        """Count the request and maybe fail it before it acts; returns whether the reply of
        a mutating request is to be lost after it acted."""
        self.requests[op] = self.requests.get(op, 0) + 1
        if self.outage:
            self.failures[op] = self.failures.get(op, 0) + 1
            raise TransientError("ConnectionError", f"{op}: endpoint unreachable (outage)")
        if self.slowdown and self.rng.random() < self.slowdown:
            self.failures[op] = self.failures.get(op, 0) + 1
            raise ThrottledError("SlowDown", f"{op}: please reduce your request rate", 503)
        return mutating and bool(self.lost_reply) and self.rng.random() < self.lost_reply

    def _lost(self, op: str):
        self.failures[op] = self.failures.get(op, 0) + 1
        return TransientError("ConnectionResetError", f"{op}: reply lost (the request was applied)")

    def _store(self, key, data, etag, metadata, content_type, op, origin=None) -> Version:
        if origin is None:
            origin = self.origin_of(data, metadata) if self.origin_of else frozenset()
        v = Version(key, next(self._seq), bytes(data), f'"{etag}"', dict(metadata), content_type,
                    False, op, frozenset(origin), time.time())
        self.history.setdefault(key, []).append(v)
        return v

    def _check_put_conditions(self, key: str, if_match, if_none_match) -> None:
        cur = self.current(key)
        if if_none_match is not None and cur is not None:
            raise _precondition_failed(f"{key} exists")
        if if_match is not None and (cur is None or not _etag_eq(cur.etag, if_match)):
            if cur is None:
                raise NotFoundError("NoSuchKey", key, 404)
            raise _precondition_failed(f"{key}: ETag {cur.etag} != {if_match}")

    def _must(self, key: str, if_match=None, version_id=None) -> Version:
        if version_id is not None:
            for v in self.history.get(key, []):
                if v.version_id == version_id and not v.deleted:
                    return v
            raise NotFoundError("NoSuchVersion", f"{key}@{version_id}", 404)
        cur = self.current(key)
        if cur is None:
            raise NotFoundError("NoSuchKey", key, 404)
        if if_match is not None and not _etag_eq(cur.etag, if_match):
            raise _precondition_failed(f"{key}: ETag {cur.etag} != {if_match}")
        return cur

    # ---- ObjectClient ------------------------------------------------------------------
    def put_object(self, key, body, *, metadata, checksum, content_type=None, if_match=None,
                   if_none_match=None) -> PutResult:
        lose = self._enter("PutObject", mutating=True)
        data = bytes(body)
        if checksum != checksum_b64(self.checksum_algorithm, data):
            raise TransientError("BadDigest", f"{key}: checksum mismatch", 400)
        self._check_put_conditions(key, if_match, if_none_match)
        v = self._store(key, data, _md5(data), metadata, content_type, "PutObject")
        if lose:
            raise self._lost("PutObject")
        return PutResult(v.etag, f"crc32:{checksum}")

    def create_multipart_upload(self, key, *, metadata) -> str:
        lose = self._enter("CreateMultipartUpload", mutating=True)
        uid = f"up{next(self._ids)}"
        self.uploads[uid] = _Upload(key, uid, dict(metadata), time.time())
        if lose:
            raise self._lost("CreateMultipartUpload")
        return uid

    def _upload(self, key, upload_id) -> _Upload:
        up = self.uploads.get(upload_id)
        if up is None or up.key != key:
            raise NotFoundError("NoSuchUpload", f"{key}#{upload_id}", 404)
        return up

    def upload_part(self, key, upload_id, part_number, body, *, checksum) -> PartInfo:
        lose = self._enter("UploadPart", mutating=True)
        up = self._upload(key, upload_id)
        data = bytes(body)
        if checksum != checksum_b64(self.checksum_algorithm, data):
            raise TransientError("BadDigest", f"{key}#{part_number}: checksum mismatch", 400)
        etag = f'"{_md5(data)}"'
        up.parts[part_number] = (data, etag, checksum)
        if lose:
            raise self._lost("UploadPart")
        return PartInfo(part_number, etag, len(data), checksum)

    def complete_multipart_upload(self, key, upload_id, parts, *, if_match=None,
                                  if_none_match=None) -> PutResult:
        lose = self._enter("CompleteMultipartUpload", mutating=True)
        up = self._upload(key, upload_id)
        numbers = [p.part_number for p in parts]
        if numbers != sorted(set(numbers)) or not numbers:
            raise PermanentError("InvalidPartOrder", key, 400)
        body, md5s = [], []
        for p in parts:
            held = up.parts.get(p.part_number)
            if held is None or not _etag_eq(held[1], p.etag):
                raise PermanentError("InvalidPart", f"{key}#{p.part_number}", 400)
            body.append(held[0])
            md5s.append(bytes.fromhex(held[1].strip('"')))
        self._check_put_conditions(key, if_match, if_none_match)
        data = b"".join(body)
        etag = f"{hashlib.md5(b''.join(md5s)).hexdigest()}-{len(parts)}"
        v = self._store(key, data, etag, up.metadata, None, "CompleteMultipartUpload")
        del self.uploads[upload_id]
        if lose:
            raise self._lost("CompleteMultipartUpload")
        checksum = oc.composite_checksum(self.checksum_algorithm, [up.parts[n][2] for n in numbers])
        return PutResult(v.etag, f"crc32:{checksum}")

    def abort_multipart_upload(self, key, upload_id) -> None:
        lose = self._enter("AbortMultipartUpload", mutating=True)
        self._upload(key, upload_id)
        del self.uploads[upload_id]
        if lose:
            raise self._lost("AbortMultipartUpload")

    def list_parts(self, key, upload_id) -> list[PartInfo]:
        self._enter("ListParts", mutating=False)
        up = self._upload(key, upload_id)
        return [PartInfo(n, etag, len(data), ck) for n, (data, etag, ck) in sorted(up.parts.items())]

    def list_multipart_uploads(self, prefix) -> list[UploadInfo]:
        self._enter("ListMultipartUploads", mutating=False)
        return [UploadInfo(u.key, u.upload_id, u.initiated) for u in self.uploads.values()
                if u.key.startswith(prefix)]

    def copy_object(self, src_key, dst_key, *, if_match=None, copy_source_if_match=None,
                    version_id=None, metadata=None) -> PutResult:
        lose = self._enter("CopyObject", mutating=True)
        src = self._must(src_key, if_match or copy_source_if_match, version_id)
        v = self._store(dst_key, src.data, _md5(src.data), src.metadata if metadata is None else metadata,
                        src.content_type, "CopyObject", src.origin)
        if lose:
            raise self._lost("CopyObject")
        return PutResult(v.etag, f"crc32:{checksum_b64(self.checksum_algorithm, src.data)}")

    def upload_part_copy(self, src_key, dst_key, upload_id, part_number, first, last, *,
                         if_match=None, copy_source_if_match=None) -> PartInfo:
        lose = self._enter("UploadPartCopy", mutating=True)
        src = self._must(src_key, if_match or copy_source_if_match)
        up = self._upload(dst_key, upload_id)
        data = src.data[first:last + 1]
        ck = checksum_b64(self.checksum_algorithm, data)
        etag = f'"{_md5(data)}"'
        up.parts[part_number] = (data, etag, ck)
        if lose:
            raise self._lost("UploadPartCopy")
        return PartInfo(part_number, etag, len(data), ck)

    def delete_object(self, key, *, if_match=None, version_id=None) -> None:
        lose = self._enter("DeleteObject", mutating=True)
        cur = self.current(key)
        if if_match is not None and (cur is None or not _etag_eq(cur.etag, if_match)):
            if cur is None:
                raise NotFoundError("NoSuchKey", key, 404)
            raise _precondition_failed(f"{key}: ETag {cur.etag} != {if_match}")
        if cur is not None:
            self.history[key].append(Version(key, next(self._seq), deleted=True, op="DeleteObject",
                                             t=time.time()))
        if lose:
            raise self._lost("DeleteObject")

    def _info(self, v: Version) -> ObjectInfo:
        return ObjectInfo(v.key, len(v.data), v.etag, v.t, dict(v.metadata),
                          f"crc32:{checksum_b64(self.checksum_algorithm, v.data)}")

    def head_object(self, key, *, if_match=None, version_id=None) -> ObjectInfo | None:
        self._enter("HeadObject", mutating=False)
        try:
            return self._info(self._must(key, if_match, version_id))
        except NotFoundError:
            return None

    def get_range(self, key, offset, length, *, if_match=None, version_id=None) -> bytes:
        self._enter("GetObject", mutating=False)
        if length <= 0:
            return b""
        v = self._must(key, if_match, version_id)
        if offset >= len(v.data):
            raise PermanentError("InvalidRange", f"{key}: {offset} >= {len(v.data)}", 416)
        return v.data[offset:offset + length]

    def list_objects(self, prefix):
        self._enter("ListObjectsV2", mutating=False)
        for k in self.keys():
            if k.startswith(prefix):
                v = self.current(k)
                yield ObjectInfo(k, len(v.data), v.etag, v.t)

    # ---- retention and lifecycle (enough for uploader.retention to run) ----------------
    def storage_class(self, key) -> str | None:
        self._enter("HeadObject", mutating=False)
        return None if self.current(key) is None else self.storage.get(key, "STANDARD")

    def change_storage_class(self, key, storage_class) -> PutResult:
        self._enter("CopyObject", mutating=True)
        src = self._must(key)
        v = self._store(key, src.data, _md5(src.data), src.metadata, src.content_type, "CopyObject",
                        src.origin)
        self.storage[key] = storage_class
        return PutResult(v.etag, None)

    def put_object_tags(self, key, tags) -> None:
        self._enter("PutObjectTagging", mutating=True)
        self._must(key)
        self.tags[key] = dict(tags)

    def get_object_tags(self, key) -> dict[str, str]:
        self._enter("GetObjectTagging", mutating=False)
        self._must(key)
        return dict(self.tags.get(key, {}))

    def object_lock_enabled(self) -> bool:
        return False

    def set_legal_hold(self, key, on) -> None:
        raise PermanentError("InvalidRequest", "bucket has no object lock", 400)

    def get_legal_hold(self, key) -> bool:
        return False

    def set_retention(self, key, mode, until) -> None:
        raise PermanentError("InvalidRequest", "bucket has no object lock", 400)

    def get_retention(self, key):
        return None

    def get_lifecycle_rules(self) -> list[dict]:
        return list(self.lifecycle)

    def put_lifecycle_rules(self, rules) -> None:
        self.lifecycle = list(rules)
