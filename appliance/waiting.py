"""Wait, on any client node, until a checkpoint is in S3: read through the NFSv4.2 mount.

    from appliance.waiting import wait_uploaded
    torch.save(state, "/mnt/ckpt/run1/step1000.pt")
    wait_uploaded("/mnt/ckpt/run1/step1000.pt", timeout=600)     # or a directory (DCP)

The gateway serves each file's upload state as read-only extended attributes (RFC 8276,
nfsd/ops/xattr.py), which the Linux client shows in the `user.` namespace:
`user.ckptgw.state` (dirty | queued | uploading | in_s3), `.key`, `.etag`, `.version`,
`.checksum` of a file, `user.ckptgw.pending_files` / `.pending_bytes` of a directory (every
file below it). Nothing here needs the admin socket or a token: only the mount.

The Linux client keeps xattr values until the file's change attribute moves, and an upload
does not move it. So every read asks for `NAME.<random suffix>`, a name the gateway answers
like NAME and the client has never cached: each poll reaches the server.

`ckptgw wait PATH` (appliance/wait_cmd.py) is this function with exit codes.
"""
from __future__ import annotations

import errno
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

from .units import fmt_seconds

PREFIX = "user.ckptgw."
FILE_FIELDS = ("key", "etag", "version", "checksum")
IN_S3 = "in_s3"
# what the attributes' absence means, by errno
_NOT_OFFERED = {errno.ENOTSUP, errno.EOPNOTSUPP, getattr(errno, "ENOATTR", errno.ENODATA),
                errno.ENODATA}


class NotOffered(OSError):
    """The path's file system does not serve ckptgw's attributes (not a ckptgw export, or
    not mounted with NFS 4.2)."""


class NotUploaded(TimeoutError):
    """The timeout passed first; `.state` is the last UploadState read."""

    def __init__(self, message: str, state: "UploadState"):
        super().__init__(message)
        self.state = state


@dataclass
class UploadState:
    path: str
    is_dir: bool
    done: bool
    state: str | None = None          # a file's state
    pending_files: int = 0            # a directory's (a file: 1 until done)
    pending_bytes: int = 0            # a directory's
    object: dict = field(default_factory=dict)     # a file's key, etag, version, checksum

    def as_dict(self) -> dict:
        return {"path": self.path, "is_dir": self.is_dir, "done": self.done, "state": self.state,
                "pending_files": self.pending_files, "pending_bytes": self.pending_bytes,
                **self.object}


def _reader(getxattr: Callable[[str, str], bytes]):
    def read(path: str, name: str, *, missing_ok: bool = False) -> str | None:
        fresh = f"{PREFIX}{name}.{secrets.token_hex(8)}"
        try:
            return getxattr(path, fresh).decode("ascii", "replace")
        except OSError as e:
            if e.errno in _NOT_OFFERED:
                if missing_ok:
                    return None
                raise NotOffered(e.errno, f"{path}: no {PREFIX}{name} attribute: not on a ckptgw "
                                 "export mounted with NFS 4.2 (mount -o vers=4.2)", path) from None
            raise
    return read


def upload_state(path: str, *, getxattr: Callable[[str, str], bytes] | None = None,
                 isdir: Callable[[str], bool] | None = None) -> UploadState:
    """What the gateway says now about `path` (a file, or every file below a directory).
    NotOffered when the mount does not serve the attributes; other OSErrors as they come
    (ENOENT, EACCES)."""
    read = _reader(getxattr or os.getxattr)
    if (isdir or os.path.isdir)(path):
        files = int(read(path, "pending_files") or 0)
        size = int(read(path, "pending_bytes", missing_ok=True) or 0)
        return UploadState(path, True, files == 0, pending_files=files, pending_bytes=size)
    state = read(path, "state")
    done = state == IN_S3
    out = UploadState(path, False, done, state=state, pending_files=0 if done else 1)
    if done:
        for name in FILE_FIELDS:
            value = read(path, name, missing_ok=True)
            if value is not None:
                out.object[name] = value
    return out


def wait_uploaded(path: str | os.PathLike, timeout: float | None = None, interval: float = 2.0, *,
                  getxattr: Callable[[str, str], bytes] | None = None,
                  isdir: Callable[[str], bool] | None = None,
                  clock: Callable[[], float] | None = None,
                  sleep: Callable[[float], None] | None = None,
                  on_poll: Callable[[UploadState], None] | None = None) -> UploadState:
    """Block until `path` (a file, or every file under a directory) is in S3; returns the
    final UploadState (a file's key, etag, version, checksum in `.object`).

    Raises NotUploaded (a TimeoutError) when `timeout` seconds pass first (None: no limit),
    NotOffered (an OSError) when the mount does not serve the attributes, FileNotFoundError
    and the like as os.getxattr raises them. `interval`: seconds between reads (a
    directory's read walks its subtree on the gateway: keep it a second or more)."""
    path = os.fspath(path)
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    if interval <= 0:
        raise ValueError("interval must be > 0")
    deadline = None if timeout is None else clock() + timeout
    while True:
        st = upload_state(path, getxattr=getxattr, isdir=isdir)
        if on_poll is not None:
            on_poll(st)
        if st.done:
            return st
        now = clock()
        if deadline is not None and now >= deadline:
            what = (f"{st.pending_files} file(s), {st.pending_bytes} bytes not in S3" if st.is_dir
                    else f"still {st.state}")
            raise NotUploaded(f"{path}: {what} after {fmt_seconds(timeout)}", st)
        sleep(interval if deadline is None else max(0.0, min(interval, deadline - now)))
