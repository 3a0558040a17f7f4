"""Import: make objects under the bucket prefix visible as files, fetched on first read.

Rule: LOCAL DATA ALWAYS WINS. An object whose path already exists in the namespace (a
file or a directory, whatever its state: dirty, uploading, clean) is skipped, never
merged or overwritten; so is an object whose parent path is a local file. Only names the
gateway does not know are added, as ABSENT files carrying the object's size, ETag and the
s3fs metadata (x-amz-meta-mode/uid/gid/mtime; defaults 0644, 0:0 and the object's
LastModified when absent). Directory markers ("dir/") become directories, objects marked
S_IFLNK (s3fs's symbolic links, as the uploader writes them) become symlinks, objects
marked S_IFBLK/S_IFCHR (with x-amz-meta-rdev)/S_IFSOCK/S_IFIFO special files. Keys that
cannot be paths (empty or "."/".." components, "//", names over 255 bytes) are skipped and
counted. An object the gateway still answers for (a record's key or kept object, the old name of
a queued move or delete: `Store.owned_keys`) is skipped too: it is already a file, or about
to be moved or deleted, and importing it again would leave the new file with no object; so is an
object whose identity metadata names this store (`ckptgw-store`): a marker, symlink or special file of
ours that a queued directory move or delete is about to act on (an index lost means a new store id,
so a rebuilt gateway imports its predecessor's objects).
Imported files are not journaled (they came from S3); a parent directory import creates
is (its `dir/` marker is put), so the bucket keeps every directory of the namespace.
"""
from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass, field

import structlog

from cache.api import ROOT_INO, SYMLINK_MAX, FileType, RemoteInfo, StoreError

from .gate import RequestGate
from .keys import STORE_META, KeyMap, attrs_from_metadata, is_symlink_metadata, special_of_metadata
from .manifest import is_manifest_key
from .objectclient import ObjectClient

log = structlog.get_logger(__name__)


@dataclass
class ImportReport:
    imported: int = 0
    directories: int = 0
    symlinks: int = 0
    special: int = 0             # devices, sockets, FIFOs
    skipped_existing: int = 0
    skipped_invalid: list[str] = field(default_factory=list)


def _ensure_dirs(store, path: str, mode: int, uid: int, gid: int) -> bool:
    """mkdir -p; False if a component exists as a non-directory."""
    ino = ROOT_INO
    for part in [p for p in path.split("/") if p]:
        name = part.encode("utf-8", "surrogateescape")
        try:
            attr = store.lookup(ino, name)
        except StoreError:
            attr = store.mkdir(ino, name, mode, uid, gid)[0]
        if attr.type != FileType.DIR:
            return False
        ino = attr.ino
    return True


def _owned(path: str, head) -> RemoteInfo:
    """The record of an imported name: the object it came from, owned like an uploaded one."""
    return RemoteInfo(key=path, etag=head.etag, checksum=head.checksum, size=head.size)


async def import_prefix(store, client: ObjectClient, keys: KeyMap, gate: RequestGate) -> ImportReport:
    report = ImportReport()
    objects = await gate.call("ListObjectsV2", lambda: list(client.list_objects(keys.prefix)), what=keys.prefix)
    owned = await asyncio.to_thread(store.owned_keys)     # after the listing: covers every listed key
    store_id = store.instance_id.hex()
    for obj in objects:
        path = keys.path_of_key(obj.key)
        if path is None:
            report.skipped_invalid.append(obj.key)
            continue
        if is_manifest_key(path):
            continue                     # a checkpoint manifest (uploader.manifest), not a file
        if path in owned:                # ours already, being moved or deleted: not a new file
            report.skipped_existing += 1
            continue
        head = await gate.call("HeadObject", lambda o=obj: client.head_object(o.key), what=obj.key)
        if head is None:                 # deleted since the listing
            continue
        if store_id and head.metadata.get(STORE_META) == store_id:
            # written by this gateway and not a record's: a marker, symlink or special file a
            # queued directory move or delete is about to act on. Ours already, never new
            report.skipped_existing += 1
            continue
        mode, uid, gid, mtime_ns = attrs_from_metadata(
            head.metadata, default_mtime_ns=int(head.last_modified * 1e9))
        try:
            if path.endswith("/"):
                if await asyncio.to_thread(_ensure_dirs, store, path, mode or 0o755, uid, gid):
                    report.directories += 1
                continue
            if is_symlink_metadata(head.metadata):
                if not 0 < head.size <= SYMLINK_MAX:
                    raise StoreError(errno.EINVAL, f"symlink object of {head.size} bytes")
                target = await gate.call("GetObject", lambda o=obj, n=head.size: client.get_range(o.key, 0, n),
                                         what=obj.key)
                attr = await asyncio.to_thread(store.import_symlink, path, target, mode, uid, gid, mtime_ns,
                                               _owned(path, head))
                if attr is not None:
                    report.symlinks += 1
            elif (special := special_of_metadata(head.metadata)) is not None:
                attr = await asyncio.to_thread(store.import_special, path, special[0], special[1], mode,
                                               uid, gid, mtime_ns, _owned(path, head))
                if attr is not None:
                    report.special += 1
            else:
                attr = await asyncio.to_thread(store.import_object, path, head.size, mode, uid, gid, mtime_ns,
                                               _owned(path, head))
        except StoreError as e:
            log.warning("import_skipped", key=obj.key, error=str(e))
            report.skipped_invalid.append(obj.key)
            continue
        if attr is None:
            report.skipped_existing += 1
        else:
            report.imported += 1
    await asyncio.to_thread(store.sync)
    log.info("import_done", prefix=keys.prefix, imported=report.imported, directories=report.directories,
             symlinks=report.symlinks, special=report.special,
             skipped_existing=report.skipped_existing, skipped_invalid=len(report.skipped_invalid))
    return report
