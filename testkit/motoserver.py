"""moto in server mode as a subprocess on loopback (`moto_server -H 127.0.0.1 -p PORT`), over
plain http or, with tls=True, over https with a throwaway self-signed certificate (as S3 is
reached in production: the uploader hashes no payload for its signature over TLS, 54cfed4)."""
from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """A moto S3 server; all state lives in its memory and dies with it.

    `min_part_size` lowers moto's 5 MiB minimum multipart part size (S3_UPLOAD_PART_MIN_SIZE)
    so tests can use small objects with several parts. `spill_dir`: where moto writes the
    values it does not keep in its memory (its TMPDIR: every part and object over about
    5 MiB goes to a temporary file); None: the system's temporary directory."""

    def __init__(self, *, min_part_size: int | None = None, spill_dir: str | None = None,
                 tls: bool = False):
        """tls: serve https; `ca_bundle` is then the certificate a client must trust (boto3:
        verify=ca_bundle, or AWS_CA_BUNDLE in a child's environment), else None."""
        self.port = free_port()
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._cert_dir = tempfile.mkdtemp(prefix="moto-tls-") if tls else None
        self.ca_bundle: str | None = None
        tls_args: list[str] = []
        if self._cert_dir is not None:
            cert, key = self_signed_loopback_cert(Path(self._cert_dir))
            self.ca_bundle = str(cert)
            tls_args = ["-c", str(cert), "-k", str(key)]
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        if min_part_size is not None:
            env["S3_UPLOAD_PART_MIN_SIZE"] = str(min_part_size)
        if spill_dir is not None:
            env["TMPDIR"] = spill_dir
        exe = shutil.which("moto_server")
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        self.proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(self.port), *tls_args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}")
            try:
                self._open(self.endpoint + "/moto-api/", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not answer within 30 s")

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        req = urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")
        self._open(req, timeout=10).read()

    def _open(self, url, timeout: float):
        context = ssl.create_default_context(cafile=self.ca_bundle) if self.ca_bundle else None
        return urllib.request.urlopen(url, timeout=timeout, context=context)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._cert_dir is not None:
            shutil.rmtree(self._cert_dir, ignore_errors=True)


def self_signed_loopback_cert(directory: Path) -> tuple[Path, Path]:
    """A fresh key and a self-signed certificate for 127.0.0.1, valid for a day, written to
    directory/cert.pem and directory/key.pem (the certificate is its own CA bundle)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ckptgw test S3")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path
