import base64
import os
import zlib

import botocore.exceptions
import pytest

from uploader.objectclient import (NotFoundError, PermanentError, ThrottledError, TransientError,
                                   checksum_b64, classify, composite_checksum)
from uploader.settings import S3Settings, UploadSettings


def _client_error(code, status):
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize("code,status,cls", [
    ("SlowDown", 503, ThrottledError), ("ServiceUnavailable", 503, ThrottledError),
    ("InternalError", 500, TransientError), ("RequestTimeout", 400, TransientError),
    ("NoSuchKey", 404, NotFoundError), ("NoSuchUpload", 404, NotFoundError), ("404", 404, NotFoundError),
    ("AccessDenied", 403, PermanentError), ("NoSuchBucket", 404, PermanentError),
    ("InvalidAccessKeyId", 403, PermanentError),
])
def test_classify_client_errors(code, status, cls):
    err = classify(_client_error(code, status))
    assert type(err) is cls and err.code == code


def test_classify_network_errors_are_transient():
    err = classify(botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"))
    assert isinstance(err, TransientError) and not isinstance(err, ThrottledError)
    assert isinstance(classify(botocore.exceptions.ReadTimeoutError(endpoint_url="x")), TransientError)
    assert isinstance(classify(botocore.exceptions.NoCredentialsError()), PermanentError)


def test_checksums_match_s3_encoding():
    data = b"hello world"
    assert checksum_b64("CRC32", data) == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    parts = [checksum_b64("CRC32", b"a"), checksum_b64("CRC32", b"b")]
    raw = base64.b64decode(parts[0]) + base64.b64decode(parts[1])
    assert composite_checksum("CRC32", parts) == checksum_b64("CRC32", raw) + "-2"
    with pytest.raises(ValueError):
        checksum_b64("MD5", data)


def test_settings_validate():
    with pytest.raises(ValueError, match="3 characters"):
        S3Settings(bucket="ab")
    with pytest.raises(ValueError, match="addressing_style"):
        S3Settings(bucket="abc", addressing_style="weird")
    with pytest.raises(ValueError, match="together"):
        S3Settings(bucket="abc", access_key="k")
    with pytest.raises(ValueError, match="5242880"):
        UploadSettings(part_size_min=1 << 20)
    assert UploadSettings(part_size_min=1 << 18, allow_small_parts=True).part_size_min == 1 << 18
    with pytest.raises(ValueError, match="concurrency"):
        UploadSettings(max_concurrency=0)


def test_keymap_and_metadata_roundtrip():
    from types import SimpleNamespace

    from cache.api import FileType
    from uploader.keys import KeyMap, attrs_from_metadata, object_metadata, special_of_metadata
    km = KeyMap("ckpt/")
    assert km.file_key("run/a.pt") == "ckpt/run/a.pt" and km.dir_key("run") == "ckpt/run/"
    assert km.path_of_key("ckpt/run/a.pt") == "run/a.pt"
    assert km.path_of_key("ckpt/run/") == "run/"
    for bad in ("other/a", "ckpt/", "ckpt/a//b", "ckpt/../x", "ckpt/./x", "ckpt/" + "n" * 256):
        assert km.path_of_key(bad) is None, bad
    attr = SimpleNamespace(type=FileType.REG, ino=7, gen=3, data_seq=9, mode=0o640, uid=1000, gid=100, mtime_ns=1_700_000_000_123_456_789)
    meta = object_metadata(attr, is_dir=False)
    assert meta["mode"] == str(0o100640) and meta["mtime"] == "1700000000.123456789"
    assert (meta["ckptgw-ino"], meta["ckptgw-gen"], meta["ckptgw-seq"]) == ("7", "3", "9")   # identity
    assert attrs_from_metadata(meta, default_mtime_ns=0) == (0o640, 1000, 100, attr.mtime_ns)
    assert special_of_metadata(meta) is None
    dev = SimpleNamespace(**{**vars(attr), "type": FileType.CHR, "rdev": (4, 64)})
    dev_meta = object_metadata(dev, is_dir=False)                 # s3fs records a device this way
    assert dev_meta["mode"] == str(0o020640) and special_of_metadata(dev_meta) == (FileType.CHR, (4, 64))
    assert attrs_from_metadata({"mtime": "12"}, default_mtime_ns=5) == (0o644, 0, 0, 12_000_000_000)
    assert attrs_from_metadata({"mode": "junk"}, default_mtime_ns=5) == (0o644, 0, 0, 5)


def test_part_plan():
    from uploader.keys import part_ranges, part_size_for
    MiB = 1 << 20
    assert part_size_for(100 * MiB, 8 * MiB) == 8 * MiB
    big = 200 * (1 << 30)                         # 200 GiB needs > 8 MiB parts
    p = part_size_for(big, 8 * MiB)
    assert p % MiB == 0 and -(-big // p) <= 10_000 and p > 8 * MiB
    ranges = part_ranges(10 * MiB + 5, 4 * MiB)
    assert [r[0] for r in ranges] == [1, 2, 3]
    assert sum(r[2] for r in ranges) == 10 * MiB + 5 and ranges[-1] == (3, 8 * MiB, 2 * MiB + 5)
    with pytest.raises(ValueError):
        part_size_for(6 * (1 << 40), 8 * MiB)


@pytest.mark.parametrize("endpoint,signed", [
    ("http://127.0.0.1:9", True), ("https://127.0.0.1:9", False), ("HTTPS://s3.example:443", False),
    (None, False),
])
def test_payload_is_hashed_into_the_signature_only_without_tls(endpoint, signed):
    """Over TLS (AWS's endpoint too) a part's body is covered by its signed checksum header,
    not hashed a second time for the signature; over plain http it is signed."""
    from uploader.objectclient import Boto3ObjectClient

    client = Boto3ObjectClient(S3Settings(bucket="bkt", endpoint_url=endpoint, access_key="a",
                                          secret_key="b", addressing_style="path"))
    seen = {}

    def before_send(request, **kwargs):
        for name in ("x-amz-content-sha256", "x-amz-checksum-crc32"):
            seen[name] = request.headers.get(name)
        raise _Stop()

    client._s3.meta.events.register("before-send.s3.UploadPart", before_send)
    body = b"x" * 1000
    with pytest.raises(_Stop):
        client._s3.upload_part(Bucket="bkt", Key="k", UploadId="u", PartNumber=1, Body=body,
                               **client._checksum_args(checksum_b64("CRC32", body)))
    content_sha = seen["x-amz-content-sha256"].decode()
    assert (content_sha != "UNSIGNED-PAYLOAD") == signed
    assert seen["x-amz-checksum-crc32"].decode() == checksum_b64("CRC32", body)


class _Stop(Exception):
    pass


def test_a_part_and_a_put_go_out_in_one_send_as_the_bytes_given(moto, bucket, monkeypatch):
    """A part's or a PUT's bytes leave in one send after `Expect: 100-continue`: not as
    botocore's BytesIO, read and sent 128 KiB at a time with the GIL taken back after each
    piece (the event loop serving NFS may wait for it). The bytes arrive whole."""
    import http.client

    from tests.uploader.conftest import s3_settings
    from uploader.objectclient import Boto3ObjectClient

    client = Boto3ObjectClient(s3_settings(moto.endpoint, bucket))
    sends: list[int] = []
    expect: list[bytes | None] = []
    real_send = http.client.HTTPConnection.send

    def counting_send(self, data):
        sends.append(len(data))
        return real_send(self, data)

    def before_send(request, **kwargs):
        value = request.headers.get("Expect")
        expect.append(value.encode() if isinstance(value, str) else value)

    monkeypatch.setattr(http.client.HTTPConnection, "send", counting_send)
    client._s3.meta.events.register("before-send.s3.UploadPart", before_send)
    client._s3.meta.events.register("before-send.s3.PutObject", before_send)
    part, whole = os.urandom(300 * 1024), os.urandom(200 * 1024)
    up = client.create_multipart_upload("gw/big", metadata={})
    sends.clear()
    info = client.upload_part("gw/big", up, 1, part, checksum=checksum_b64("CRC32", part))
    assert len(part) in sends and sum(n for n in sends if n != len(part)) < 8192, sends
    sends.clear()
    client.put_object("gw/small", whole, metadata={}, checksum=checksum_b64("CRC32", whole))
    assert len(whole) in sends and sum(n for n in sends if n != len(whole)) < 8192, sends
    assert [bytes(e or b"") for e in expect] == [b"100-continue"] * 2, expect
    client.complete_multipart_upload("gw/big", up, [info])
    assert client._s3.get_object(Bucket=bucket, Key="gw/big")["Body"].read() == part
    assert client._s3.get_object(Bucket=bucket, Key="gw/small")["Body"].read() == whole


def test_an_upload_over_tls_to_the_test_s3_verifies_its_certificate_and_signs_no_payload(monkeypatch):
    """The benchmarks' S3 is moto over TLS (bench/stack.py, as S3 is reached in production):
    the client trusts only the throwaway certificate it is given, and sends the body unsigned."""
    import botocore.exceptions
    from testkit.motoserver import MotoServer
    from uploader.objectclient import Boto3ObjectClient

    moto = MotoServer(tls=True)
    try:
        assert moto.endpoint.startswith("https://")
        settings = S3Settings(bucket="bkt", endpoint_url=moto.endpoint, access_key="a", secret_key="b",
                              addressing_style="path")
        monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
        with pytest.raises(botocore.exceptions.SSLError):      # not trusted by default
            Boto3ObjectClient(settings)._s3.create_bucket(Bucket="bkt")
        monkeypatch.setenv("AWS_CA_BUNDLE", moto.ca_bundle)
        client = Boto3ObjectClient(settings)
        client._s3.create_bucket(Bucket="bkt")
        sent = []
        client._s3.meta.events.register(
            "before-send.s3.PutObject", lambda request, **kw: sent.append(request.headers["x-amz-content-sha256"]))
        body = b"y" * 5000
        client.put_object("k", body, metadata={}, checksum=checksum_b64("CRC32", body))
        assert sent == [b"UNSIGNED-PAYLOAD"]
        assert client._s3.get_object(Bucket="bkt", Key="k")["Body"].read() == body
    finally:
        moto.stop()
    assert not os.path.exists(moto.ca_bundle)
