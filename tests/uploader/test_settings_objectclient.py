import base64
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
