"""Persistent NFSv4 file handles (RFC 8881 section 4.2.3: FH4_PERSISTENT).

Wire layout (40 bytes, well under NFS4_FHSIZE = 128):

    version:u8  kind:u8  export_id:u16  ino:u64  gen:u64  mac:16 bytes

`kind` is PSEUDO (a directory of the pseudo-filesystem above the exports, `ino` is
the pseudo node's index) or EXPORT (an object of an export's store subtree). The MAC
is a keyed BLAKE2b over the first 20 bytes, so a forged or corrupted handle is
rejected with NFS4ERR_BADHANDLE instead of reaching the store. The key is derived
from the store's durable instance_id and a random secret kept beside the store
(`<store dir>/nfsd-fh.key`, created once): handles survive a server restart, become
invalid when the store is re-created (a different file system), and cannot be forged
by a client that learns the instance_id (it is visible as the NFS server owner).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

FH_VERSION = 1
KIND_PSEUDO = 1
KIND_EXPORT = 2

_BODY = struct.Struct(">BBHQQ")
_MAC_LEN = 16
FH_LEN = _BODY.size + _MAC_LEN


class BadHandle(ValueError):
    """The bytes are not a handle this server issued (NFS4ERR_BADHANDLE)."""


@dataclass(frozen=True, slots=True)
class FileHandle:
    kind: int
    export_id: int
    ino: int
    gen: int
    raw: bytes          # the wire form, returned by GETFH and the filehandle attribute

    @property
    def is_pseudo(self) -> bool:
        return self.kind == KIND_PSEUDO


# Handles made or verified lately, by their fields and by their bytes: a client sends the same
# few handles in COMPOUND after COMPOUND (its directory's in every LOOKUP), and a MAC plus a
# FileHandle cost ~2 us each time. Only handles that verified are kept (a forged one is checked
# every time), and each map is emptied when full, so a client cannot make it grow.
MEMO_ENTRIES = 16384


class FhCodec:
    """Encodes and verifies handles with one key (one per store)."""

    def __init__(self, key_material: bytes):
        # Domain-separated so the raw instance_id (which may be shown elsewhere)
        # is never itself the MAC key.
        self._key = hashlib.blake2b(key_material, digest_size=32,
                                    person=b"ckptgw-fh-key").digest()
        self._made: dict[tuple, FileHandle] = {}
        self._verified: dict[bytes, FileHandle] = {}

    def _mac(self, body: bytes) -> bytes:
        return hashlib.blake2b(body, key=self._key, digest_size=_MAC_LEN).digest()

    def make(self, kind: int, export_id: int, ino: int, gen: int) -> FileHandle:
        fields = (kind, export_id, ino, gen)
        fh = self._made.get(fields)
        if fh is None:
            body = _BODY.pack(FH_VERSION, kind, export_id, ino, gen)
            fh = FileHandle(kind, export_id, ino, gen, body + self._mac(body))
            _remember(self._made, fields, fh)
        return fh

    def pseudo(self, node_index: int) -> FileHandle:
        return self.make(KIND_PSEUDO, 0, node_index, 0)

    def export(self, export_id: int, ino: int, gen: int) -> FileHandle:
        return self.make(KIND_EXPORT, export_id, ino, gen)

    def decode(self, raw: bytes) -> FileHandle:
        raw = bytes(raw)
        fh = self._verified.get(raw)
        if fh is None:
            fh = self._verify(raw)
            _remember(self._verified, raw, fh)
        return fh

    def _verify(self, raw: bytes) -> FileHandle:
        if len(raw) != FH_LEN:
            raise BadHandle(f"file handle length {len(raw)}, expected {FH_LEN}")
        body, mac = raw[:_BODY.size], raw[_BODY.size:]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise BadHandle("file handle MAC mismatch")
        version, kind, export_id, ino, gen = _BODY.unpack(body)
        if version != FH_VERSION:
            raise BadHandle(f"file handle version {version}")
        if kind not in (KIND_PSEUDO, KIND_EXPORT):
            raise BadHandle(f"file handle kind {kind}")
        return FileHandle(kind, export_id, ino, gen, raw)


def _remember(memo: dict, key, fh: FileHandle) -> None:
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = fh


KEY_FILE = "nfsd-fh.key"
_SECRET_LEN = 32
_codecs: dict[tuple, FhCodec] = {}


def load_secret(store_dir: str) -> bytes:
    """The handle secret of a store directory, created (durably) on first use."""
    path = os.path.join(store_dir, KEY_FILE)
    try:
        with open(path, "rb") as f:
            secret = f.read()
    except FileNotFoundError:
        secret = os.urandom(_SECRET_LEN)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secret)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)           # never replaces a key another process made first
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        dfd = os.open(store_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        with open(path, "rb") as f:
            secret = f.read()
    if len(secret) != _SECRET_LEN:
        raise ValueError(f"{path}: expected {_SECRET_LEN} bytes, found {len(secret)}")
    return secret


def codec_for(store) -> FhCodec:
    """The codec for this store (cached): instance_id plus the directory's secret
    (a store without a directory, path "", as the nfsd tests' FakeStore, uses instance_id alone)."""
    store_dir = store.path
    cache_key = (bytes(store.instance_id), store_dir)
    codec = _codecs.get(cache_key)
    if codec is None:
        secret = load_secret(store_dir) if store_dir and os.path.isdir(store_dir) else b""
        codec = _codecs[cache_key] = FhCodec(bytes(store.instance_id) + secret)
    return codec
