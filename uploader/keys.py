"""Object keys, s3fs-compatible metadata and the multipart part plan.

Key = bucket prefix + export-relative path; a directory is the marker object "path/"; a
symbolic link is an object whose body is the link's target (mode S_IFLNK), as s3fs stores one;
a device, socket or FIFO is an empty object whose mode carries S_IFBLK/S_IFCHR/S_IFSOCK/
S_IFIFO, devices with x-amz-meta-rdev (st_rdev in decimal, Linux's makedev encoding), as
s3fs's mknod records them.
Metadata uses s3fs-fuse's names so a bucket written here mounts with s3fs and back:
x-amz-meta-mode (st_mode in decimal, file type bits included), -uid, -gid, -mtime
(seconds, with nanoseconds after a dot when not whole). Our own keys name the inode the
object came from and which version of it (ckptgw-ino, -gen, -seq, -store: the object's identity)
so a move or delete can check it acts on our object.
"""
from __future__ import annotations

import os
import stat

from cache.api import DEVICE_TYPES, FileType

from .settings import MiB, S3_MAX_PARTS

S3_MAX_OBJECT = 5 << 40

INO_META = "ckptgw-ino"
STORE_META = "ckptgw-store"
GEN_META = "ckptgw-gen"      # the inode's generation: (store, ino, gen) never names two files
SEQ_META = "ckptgw-seq"      # the data sequence of the bytes the object holds
DIR_CONTENT_TYPE = "application/x-directory"

#: st_mode file-type bits of the inode types kept as an object of their own, besides
#: directories' markers (a regular file's object holds its bytes)
NODE_KINDS = {FileType.LNK: stat.S_IFLNK, FileType.BLK: stat.S_IFBLK, FileType.CHR: stat.S_IFCHR,
              FileType.SOCK: stat.S_IFSOCK, FileType.FIFO: stat.S_IFIFO}
#: journal job "type" names of those inodes (cache.namespace.TYPE_NAMES)
NODE_JOB_TYPES = frozenset(("lnk", "blk", "chr", "sock", "fifo"))


class KeyMap:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def file_key(self, path: str) -> str:
        return self.prefix + path

    def dir_key(self, path: str) -> str:
        return self.prefix + path.rstrip("/") + "/"

    def dir_prefix(self, path: str) -> str:
        """Prefix of every object below directory `path` (the marker included)."""
        return self.dir_key(path)

    def path_of_key(self, key: str) -> str | None:
        """Export-relative path of an object key, or None if the key cannot be a path here
        (outside the prefix, empty/"."/".." components, "//", NUL, names over 255 bytes)."""
        if not key.startswith(self.prefix):
            return None
        rel = key[len(self.prefix):]
        is_dir = rel.endswith("/")
        rel = rel[:-1] if is_dir else rel
        if not rel:
            return None
        parts = rel.split("/")
        for p in parts:
            if p in ("", ".", "..") or "\0" in p or len(p.encode()) > 255:
                return None
        return rel + ("/" if is_dir else "")


def mtime_str(mtime_ns: int) -> str:
    sec, nsec = divmod(mtime_ns, 1_000_000_000)
    return str(sec) if nsec == 0 else f"{sec}.{nsec:09d}"


def parse_mtime(value: str | None, default_ns: int) -> int:
    if not value:
        return default_ns
    try:
        if "." in value:
            sec, frac = value.split(".", 1)
            frac = (frac + "000000000")[:9]
            return int(sec) * 1_000_000_000 + int(frac)
        return int(value) * 1_000_000_000
    except ValueError:
        return default_ns


def object_metadata(attr, *, is_dir: bool, store_id: str = "") -> dict[str, str]:
    kind = stat.S_IFDIR if is_dir else NODE_KINDS.get(attr.type, stat.S_IFREG)
    meta = {"mode": str(kind | (attr.mode & 0o7777)), "uid": str(attr.uid), "gid": str(attr.gid),
            "mtime": mtime_str(attr.mtime_ns), INO_META: str(attr.ino), GEN_META: str(attr.gen),
            SEQ_META: str(attr.data_seq)}
    if store_id:
        meta[STORE_META] = store_id
    if attr.type in DEVICE_TYPES:
        meta["rdev"] = str(os.makedev(*attr.rdev))
    return meta


def special_of_metadata(meta: dict[str, str]) -> tuple[FileType, tuple[int, int]] | None:
    """(type, (major, minor)) when s3fs-style metadata marks a device, socket or FIFO; the
    rdev of a device without a parsable x-amz-meta-rdev is (0, 0)."""
    try:
        fmt = stat.S_IFMT(int(meta.get("mode", "")))
    except ValueError:
        return None
    typ = next((t for t, k in NODE_KINDS.items() if k == fmt and t != FileType.LNK), None)
    if typ is None:
        return None
    rdev = (0, 0)
    if typ in DEVICE_TYPES:
        try:
            dev = int(meta.get("rdev", "0"))
            rdev = (os.major(dev), os.minor(dev)) if 0 <= dev < 1 << 64 else (0, 0)
        except (ValueError, OverflowError):
            pass
    return typ, rdev


def is_symlink_metadata(meta: dict[str, str]) -> bool:
    """Whether s3fs-style metadata marks the object as a symbolic link (its body: the target)."""
    try:
        return stat.S_ISLNK(int(meta.get("mode", "")))
    except ValueError:
        return False


def attrs_from_metadata(meta: dict[str, str], *, default_mtime_ns: int,
                        default_mode: int = 0o644, default_uid: int = 0, default_gid: int = 0
                        ) -> tuple[int, int, int, int]:
    """(mode permission bits, uid, gid, mtime_ns) from s3fs-style metadata, defaults where absent
    or unparsable."""
    def _int(name, default):
        try:
            return int(meta[name])
        except (KeyError, ValueError):
            return default
    mode = _int("mode", default_mode) & 0o7777
    return mode, _int("uid", default_uid), _int("gid", default_gid), parse_mtime(meta.get("mtime"), default_mtime_ns)


def part_size_for(size: int, part_size_min: int) -> int:
    """Smallest size >= part_size_min (rounded up to a MiB once above it) that fits the file in
    S3's 10,000 parts."""
    if size > S3_MAX_OBJECT:
        raise ValueError(f"file of {size} bytes exceeds S3's maximum object size (5 TiB)")
    part = part_size_min
    if -(-size // part) > S3_MAX_PARTS:
        need = -(-size // S3_MAX_PARTS)
        part = -(-need // MiB) * MiB
    return part


def part_ranges(size: int, part_size: int) -> list[tuple[int, int, int]]:
    """[(part_number, offset, length)] covering [0, size)."""
    return [(i // part_size + 1, i, min(part_size, size - i)) for i in range(0, size, part_size)]
