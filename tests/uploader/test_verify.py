"""`ckptgw verify` of single-part and multipart objects (uploader.verify), against moto and
against moto behind the fault proxy made to report checksums as other S3s do (issue 39, bug 1).

moto 5.2.5's HeadObject gives a multipart object's composite CRC32 with neither the "-N" part
count nor x-amz-checksum-type: verify took it for a full-object checksum and called every
multipart file corrupt ("content differs: crc32 cache phY/gQ==, object ttcUtw=="). AWS gives
"-N" and COMPOSITE; an object uploaded as FULL_OBJECT gives the CRC of all its bytes."""
from __future__ import annotations

import asyncio
import base64
import os
import zlib

import boto3
import pytest

from tests.uploader.conftest import SMALL_PART, make_uploader, payload, s3_settings
from testkit.storefiles import write_file
from uploader.objectclient import Boto3ObjectClient
from uploader.verify import split_checksum, verify_file

SINGLE = payload(100_000, 31)                     # one PutObject (FULL_OBJECT)
MULTI = payload(5 * SMALL_PART + 123, 32)         # 6 parts of 256 KiB: a multipart upload


def crc(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def composite(data: bytes, part_size: int) -> str:
    """S3's COMPOSITE CRC32 of `data` sent in parts of `part_size`, with its "-N"."""
    parts = [data[i:i + part_size] for i in range(0, len(data), part_size)]
    raw = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    return f"{crc(raw)}-{len(parts)}"


def upload(store, moto, bucket, files: dict[str, bytes]) -> dict[str, int]:
    """The files written to the cache and uploaded by the uploader (straight to moto)."""
    async def run():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            inos = {path: write_file(store, path, data) for path, data in files.items()}
            assert await up.flush(timeout=60)
            return inos
        finally:
            await up.stop()
    return asyncio.run(run())


def verify(store, endpoint, bucket, ino):
    client = Boto3ObjectClient(s3_settings(endpoint, bucket))
    return verify_file(store, client, "gw/", store.getattr(ino), part_size_min=SMALL_PART)


def reporting(checksums: dict[str, tuple[str | None, str | None]]):
    """A rewrite_head for the fault proxy: HEAD of key path -> (x-amz-checksum-crc32,
    x-amz-checksum-type) as that S3 would answer (None: header left out)."""
    def rewrite(method: str, path: str, head: bytes) -> bytes:
        key = path.split("/", 2)[-1]
        if method != "HEAD" or key not in checksums:
            return head
        lines = [line for line in head.split(b"\r\n")
                 if not line.lower().startswith((b"x-amz-checksum-crc32:", b"x-amz-checksum-type:"))]
        value, kind = checksums[key]
        extra = ([b"x-amz-checksum-crc32: " + value.encode()] if value else []) + (
            [b"x-amz-checksum-type: " + kind.encode()] if kind else [])
        return b"\r\n".join(lines[:1] + extra + lines[1:])
    return rewrite


def test_single_and_multipart_files_verify_against_moto(moto, bucket, store):
    inos = upload(store, moto, bucket, {"run/single.bin": SINGLE, "run/multi.bin": MULTI})
    head = Boto3ObjectClient(s3_settings(moto.endpoint, bucket)).head_object("gw/run/multi.bin")
    # what made verify fail: a composite checksum with nothing saying it is one
    assert (head.checksum, head.checksum_type) == ("crc32:" + split_checksum(composite(MULTI, SMALL_PART))[0],
                                                   None), head
    single = verify(store, moto.endpoint, bucket, inos["run/single.bin"])
    multi = verify(store, moto.endpoint, bucket, inos["run/multi.bin"])
    assert (single.problem, single.form) == (None, "full-object")
    assert (multi.problem, multi.form) == (None, "composite")


@pytest.mark.parametrize("s3", ["aws", "type-only", "suffix-only", "neither", "full-object"])
def test_verify_takes_the_checksum_form_s3_reports(moto, proxy, bucket, store, s3):
    """Each way an S3 may report a multipart object's checksum: verify settles it from the
    checksum alone (no GET of the object), and says which form matched."""
    inos = upload(store, moto, bucket, {"run/multi.bin": MULTI})
    comp = composite(MULTI, SMALL_PART)
    proxy.proxy.rewrite_head = reporting({"gw/run/multi.bin": {
        "aws": (comp, "COMPOSITE"),
        "type-only": (split_checksum(comp)[0], "COMPOSITE"),     # moto for an upload created COMPOSITE
        "suffix-only": (comp, None),
        "neither": (split_checksum(comp)[0], None),               # moto for ours
        "full-object": (crc(MULTI), "FULL_OBJECT"),               # an upload created FULL_OBJECT
    }[s3]})
    v = verify(store, proxy.endpoint, bucket, inos["run/multi.bin"])
    assert (v.problem, v.form) == (None, "full-object" if s3 == "full-object" else "composite")
    assert proxy.requests("GET") == []


def test_a_composite_checksum_of_another_part_layout_is_settled_by_the_bytes(moto, proxy, bucket, store):
    """Sent in other parts (another part size, another writer): the composite cannot be
    computed from the cache, so the object's bytes decide instead of a false mismatch."""
    inos = upload(store, moto, bucket, {"run/multi.bin": MULTI})
    proxy.proxy.rewrite_head = reporting({"gw/run/multi.bin": (composite(MULTI, 2 * SMALL_PART), "COMPOSITE")})
    v = verify(store, proxy.endpoint, bucket, inos["run/multi.bin"])
    assert (v.problem, v.form) == (None, "object bytes")
    assert proxy.requests("GET"), "the object was not read"


@pytest.mark.parametrize("s3", ["moto", "aws", "full-object"])
def test_a_multipart_file_whose_cache_bytes_rotted_is_reported(moto, proxy, bucket, store, s3):
    inos = upload(store, moto, bucket, {"run/multi.bin": MULTI, "run/single.bin": SINGLE})
    comp = composite(MULTI, SMALL_PART)
    if s3 != "moto":
        proxy.proxy.rewrite_head = reporting({"gw/run/multi.bin": (comp, "COMPOSITE") if s3 == "aws"
                                              else (crc(MULTI), "FULL_OBJECT")})
    for path, data in (("run/multi.bin", MULTI), ("run/single.bin", SINGLE)):
        fd = os.open(store.data.path(inos[path]), os.O_WRONLY)
        try:                                                  # behind the store's back
            os.pwrite(fd, bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 2]), len(data) // 2)
        finally:
            os.close(fd)
    multi = verify(store, proxy.endpoint, bucket, inos["run/multi.bin"])
    assert multi.problem and multi.problem.startswith("content differs"), multi
    assert multi.form == ("full-object" if s3 == "full-object" else "object bytes")
    single = verify(store, proxy.endpoint, bucket, inos["run/single.bin"])
    assert single.problem and single.problem.startswith("content differs"), single


def test_a_multipart_object_replaced_behind_an_etag_less_record_is_reported(moto, bucket, store):
    """Verify compares with the bucket's object, not with what the gateway recorded: with no
    ETag to tell (a record without one), a replacement of the same size and part layout is
    still found by its bytes."""
    inos = upload(store, moto, bucket, {"run/multi.bin": MULTI})
    ino = inos["run/multi.bin"]
    remote = store.remote_info(ino)
    remote.etag = None
    store.set_remote_info(ino, remote)
    other = bytearray(MULTI)
    other[-1] ^= 0xFF
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="gw/run/multi.bin", ChecksumAlgorithm="CRC32")["UploadId"]
    parts = []
    for n, off in enumerate(range(0, len(other), SMALL_PART), 1):
        body = bytes(other[off:off + SMALL_PART])
        r = s3.upload_part(Bucket=bucket, Key="gw/run/multi.bin", UploadId=uid, PartNumber=n, Body=body,
                           ChecksumCRC32=crc(body))
        parts.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": crc(body)})
    s3.complete_multipart_upload(Bucket=bucket, Key="gw/run/multi.bin", UploadId=uid,
                                 MultipartUpload={"Parts": parts})
    v = verify(store, moto.endpoint, bucket, ino)
    assert v.problem and v.problem.startswith("content differs from the object's bytes"), v


def test_ci_verify_miss_was_a_replacement_with_the_very_same_bytes(moto, bucket, store):
    """The CI run in which `ckptgw verify` exited 0 after test_cli_live replaced run1/a.bin:
    the test replaced the object with A[:-1] + b"!", the same bytes whenever the random A
    already ended in "!" (1 run in 256). Same bytes, same ETag: verify was right. Other
    bytes of the same size are reported, single-part and multipart."""
    single, multi = payload(100_000, 41)[:-1] + b"!", MULTI[:-1] + b"!"
    inos = upload(store, moto, bucket, {"run/a.bin": single, "run/m.bin": multi})
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.put_object(Bucket=bucket, Key="gw/run/a.bin", Body=single[:-1] + b"!")     # the old test's "replacement"
    assert verify(store, moto.endpoint, bucket, inos["run/a.bin"]).problem is None
    for path, data in (("run/a.bin", single), ("run/m.bin", multi)):
        s3.put_object(Bucket=bucket, Key="gw/" + path, Body=data[:-1] + bytes([data[-1] ^ 0xFF]))
        v = verify(store, moto.endpoint, bucket, inos[path])
        assert v.problem and v.problem.startswith("object was replaced"), (path, v)
