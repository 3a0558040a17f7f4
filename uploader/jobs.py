"""The uploader's durable jobs and the rule that orders them.

Jobs live in the store's durable queue (opaque dicts there). Two kinds:
  {"kind": "upload", "ino": I, "change": C, "data_seq": D, "t": enqueue unix time,
   + while multipart is in progress: "key", "upload_id", "part_size", "upload_change",
     "upload_data_seq"}
  {"kind": "ns", "op": "rename"|"unlink"|"mkdir"|"rmdir"|"symlink"|"mknod"|"link", ...}   appended by the store itself
      in the same transaction as the namespace op (see cache/store.py at queue_put).

Order: S3 replays the namespace history per path. Keys are export-relative paths: exact
names, or "dir/" prefixes for directory renames (which move everything below).
  - a namespace job starts when no earlier (lower id) unfinished namespace job and no
    running upload touches an overlapping key;
  - an upload job sends the file under its CURRENT path (so a.tmp renamed to a before its
    upload starts is only ever sent as a), which is the present, not a point in history:
    it starts only when no namespace job at all (earlier or later) is pending on that path
    or moves or deletes the file's object (MOVES_OBJECT of its inode, at any of its names),
    and no other upload of that path is running. Running uploads wait for nothing, so the
    two rules cannot deadlock; a namespace job arriving during an upload of its path or of
    its file waits for it.
Jobs on unrelated paths run in parallel.
"""
from __future__ import annotations

from dataclasses import dataclass

UPLOAD = "upload"
NS = "ns"
MOVES_OBJECT = ("rename", "unlink")     # namespace ops whose job moves or deletes their file's object


@dataclass(frozen=True, slots=True)
class KeyRef:
    path: str
    is_prefix: bool = False

    def overlaps(self, other: "KeyRef") -> bool:
        if self.is_prefix and other.is_prefix:
            return self.path.startswith(other.path) or other.path.startswith(self.path)
        if self.is_prefix:
            return other.path.startswith(self.path)
        if other.is_prefix:
            return self.path.startswith(other.path)
        return self.path == other.path


def ns_keys(job: dict) -> list[KeyRef]:
    op = job.get("op")
    typ = job.get("type", "reg")
    old, new = job.get("old_path"), job.get("new_path")
    if op == "rename":
        if typ == "dir":
            return [KeyRef(old.rstrip("/") + "/", True), KeyRef(new.rstrip("/") + "/", True)]
        return [KeyRef(old), KeyRef(new)]
    if op == "unlink":           # new_path: where a hard-linked file's object moves (its next name)
        return [KeyRef(old)] + ([KeyRef(new)] if new else [])
    if op in ("symlink", "mknod"):
        return [KeyRef(new)]
    if op == "mkdir":
        return [KeyRef((new or old).rstrip("/") + "/")]
    if op == "rmdir":
        return [KeyRef((old or new).rstrip("/") + "/")]
    return []


class KeysAhead:
    """Keys of the unfinished jobs seen so far in one scheduling pass (in id order)."""

    def __init__(self) -> None:
        self.exact: set[str] = set()
        self.prefixes: list[str] = []

    def blocks(self, keys: list[KeyRef]) -> bool:
        for k in keys:
            if k.is_prefix:
                if any(p.startswith(k.path) or k.path.startswith(p) for p in self.prefixes):
                    return True
                if any(e.startswith(k.path) for e in self.exact):
                    return True
            else:
                if k.path in self.exact or any(k.path.startswith(p) for p in self.prefixes):
                    return True
        return False

    def add(self, keys: list[KeyRef]) -> None:
        for k in keys:
            if k.is_prefix:
                self.prefixes.append(k.path)
            else:
                self.exact.add(k.path)
