"""`ckptgw verify` for one file: does its object in S3 hold the bytes the cache holds?

Compared with the object as S3 reports it now (HEAD, then its bytes when that does not
settle it), never with what the gateway recorded at upload: a record says what was sent,
not what the bucket holds.

An object's checksum comes in two forms (S3 User Guide, "Checking object integrity"):
FULL_OBJECT, the checksum of all its bytes (every PutObject, and multipart uploads created
so), and COMPOSITE, the checksum of the concatenated part checksums (multipart uploads by
default). S3 says which in HeadObject's x-amz-checksum-type; the value of a composite one is
suffixed "-N" (N parts) by AWS, but not by every S3: moto 5.2.5's HEAD gives neither the
type nor the suffix for a multipart upload created without a type, which made verify take
a composite checksum for a full-object one and report every multipart file as differing.
So: the type S3 reports decides; without it, a "-N" suffix means composite; with neither,
both forms are tried. A composite checksum is computed from the cache with the uploader's
own part layout; where that does not match it (another part size, another writer), the
object's bytes decide, so a layout we cannot know never reads as corruption.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zlib
from dataclasses import dataclass

from cache.api import DataState

from .keys import part_ranges, part_size_for
from .objectclient import NotFoundError, PreconditionFailedError

CHUNK = 8 << 20
FULL_OBJECT, COMPOSITE = "FULL_OBJECT", "COMPOSITE"
# how a file was shown to match (verify's "matched_by" counts)
FORMS = ("full-object", "composite", "object bytes")


@dataclass(slots=True)
class Verdict:
    problem: str | None = None   # None: the object holds the cache's bytes; "not local": nothing to compare
    form: str | None = None      # one of FORMS: what showed the match (or the mismatch)


class _Digest:
    """Incremental CRC32 or SHA-256, rendered like S3's checksum headers (base64)."""

    def __init__(self, algorithm: str):
        if algorithm not in ("crc32", "sha256"):
            raise ValueError(f"unsupported checksum algorithm {algorithm!r}")
        self._crc = 0
        self._sha = hashlib.sha256() if algorithm == "sha256" else None

    def update(self, data) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def raw(self) -> bytes:
        return self._sha.digest() if self._sha is not None else self._crc.to_bytes(4, "big")

    def b64(self) -> str:
        return base64.b64encode(self.raw()).decode()


def split_checksum(value: str) -> tuple[str, int | None]:
    """"BASE64-N" -> ("BASE64", N); a value without the suffix -> (value, None). Base64 has no
    '-', so a '-' can only start the suffix."""
    digest, dash, parts = value.partition("-")
    if not dash:
        return value, None
    if not parts.isdigit() or int(parts) < 1:
        raise ValueError(f"checksum {value!r}: '-' is not followed by a part count")
    return digest, int(parts)


def checksum_form(checksum_type: str | None, parts: int | None) -> str | None:
    """FULL_OBJECT or COMPOSITE as S3 reports it; without a report, composite if the value had
    a part count; None if nothing tells."""
    if checksum_type in (FULL_OBJECT, COMPOSITE):
        return checksum_type
    return COMPOSITE if parts is not None else None


def local_checksums(store, ino: int, size: int, algorithm: str,
                    part_size: int | None) -> tuple[str, str | None]:
    """The cache's full-object checksum of the file and, given a part size, its composite one
    (that of the concatenated part digests, without the "-N"), in one read."""
    full = _Digest(algorithm)
    digests: list[bytes] = []
    ranges = part_ranges(size, part_size) if part_size else [(1, 0, size)]
    fd = store.open_data_fd(ino)
    try:
        for _, off, length in ranges:
            part = _Digest(algorithm)
            end = off + length
            while off < end:
                want = min(CHUNK, end - off)
                chunk = os.pread(fd, want, off) or bytes(want)      # past the data file's end: a hole
                full.update(chunk)
                part.update(chunk)
                off += len(chunk)
            digests.append(part.raw())
    finally:
        os.close(fd)
    if not part_size or not digests:
        return full.b64(), None
    of_parts = _Digest(algorithm)
    of_parts.update(b"".join(digests))
    return full.b64(), of_parts.b64()


def _object_bytes_digest(client, key: str, size: int, algorithm: str, etag: str) -> str:
    digest = _Digest(algorithm)
    for off in range(0, size, CHUNK):
        # pinned to the object the HEAD saw: bytes of a replacement are never taken for it
        digest.update(client.get_range(key, off, min(CHUNK, size - off), if_match=etag or None))
    return digest.b64()


def verify_file(store, client, prefix: str, attr, *, part_size_min: int) -> Verdict:
    """Whether the object of file `attr` holds the cache's bytes. `part_size_min`: the
    uploader's setting, for the part layout of a composite checksum."""
    remote = store.remote_info(attr.ino)
    if not remote.key:
        return Verdict("no object recorded for this file")
    key = prefix + remote.key
    head = client.head_object(key)
    if head is None:
        return Verdict(f"object {key!r} is missing from the bucket")
    if head.size != attr.size:
        return Verdict(f"size differs: cache {attr.size}, object {head.size}")
    etag = head.etag.strip('"')
    if remote.etag and etag and etag != remote.etag.strip('"'):
        return Verdict(f"object was replaced: etag {etag} is not the uploaded {remote.etag}")
    if attr.data_state == DataState.ABSENT:
        return Verdict("not local")
    algorithm, _, value = (head.checksum or "").partition(":")
    if not value:                                 # no checksum kept: the object's bytes decide
        return _by_bytes(store, client, key, attr, head, "crc32", None)
    try:
        digest, parts = split_checksum(value)
    except ValueError as e:
        return _by_bytes(store, client, key, attr, head, algorithm, f"S3 reported an unreadable {e}")
    form = checksum_form(head.checksum_type, parts)
    part_size = None
    if form != FULL_OBJECT and attr.size:
        part_size = part_size_for(attr.size, part_size_min)
        if parts is not None and len(part_ranges(attr.size, part_size)) != parts:
            part_size = None                      # not our layout: no composite to compute
    full, composite = local_checksums(store, attr.ino, attr.size, algorithm, part_size)
    if form != COMPOSITE and full == digest:
        return Verdict(None, "full-object")
    if composite is not None and composite == digest:
        return Verdict(None, "composite")
    if form == FULL_OBJECT:
        return Verdict(f"content differs: {algorithm} full-object checksum: cache {full}, object {digest}",
                       "full-object")
    # composite (or of no form S3 or the value told) and not ours under our layout: the
    # object may have been sent in other parts, so its bytes decide
    tried = ([f"full-object {full}"] if form is None else []) + (
        [f"composite {composite}"] if composite is not None else ["composite: not in our part layout"])
    why = f"object's {algorithm} {'composite ' if form else ''}checksum {value}, cache's {', '.join(tried)}"
    return _by_bytes(store, client, key, attr, head, algorithm, why, full=full)


def _by_bytes(store, client, key: str, attr, head, algorithm: str, why: str | None, *,
              full: str | None = None) -> Verdict:
    """Read the object and compare its bytes' checksum with the cache's."""
    if full is None:
        full, _ = local_checksums(store, attr.ino, attr.size, algorithm, None)
    try:
        remote = _object_bytes_digest(client, key, attr.size, algorithm, head.etag)
    except PreconditionFailedError:
        return Verdict("object was replaced while it was being verified", "object bytes")
    except NotFoundError:
        return Verdict(f"object {key!r} was removed while it was being verified", "object bytes")
    if remote == full:
        return Verdict(None, "object bytes")
    return Verdict(f"content differs from the object's bytes: {algorithm} cache {full}, object {remote}"
                   + (f" ({why})" if why else ""), "object bytes")
