"""nfs-rs and the RFC 8276 upload-state xattrs (issue 39).

nfs-rs 0.8.7 speaks NFSv3/4.0/4.1 only; its getxattr/listxattr/setxattr are NFSv4 *named
attributes* (OPENATTR), not RFC 8276 GETXATTR/LISTXATTRS, which exist in 4.2 alone. So it
cannot read ckptgw.state; what it must see is a clear "unsupported" (the server offers no
named attributes) and a 4.1 session the new 4.2 attribute and ops leave unchanged. The
RFC 8276 ops themselves are tested through the wire by tests/nfsd/test_ops_xattr.py (our
compound client, minor version 2) and through the Linux kernel client in
tests/e2e/test_kclient_xattr.py."""
from __future__ import annotations

import pytest

import nfs_rs  # noqa: E402 (a [test] dependency: missing fails, it does not skip)

from testkit.crash_server import ServerProcess  # noqa: E402
from testkit.nfsrs_support import connect, read_file, write_file  # noqa: E402


def test_nfs_rs_sees_no_named_attributes_and_a_working_4_1_mount(tmp_path):
    srv = ServerProcess(tmp_path / "cache", tmp_path / "server.log")
    srv.start()
    try:
        c = connect(srv.port)
        try:
            assert c.capabilities.named_attributes is False
            write_file(c, "ckpt.pt", b"weights" * 1000)
            assert read_file(c, "ckpt.pt") == b"weights" * 1000
            for call in (lambda: c.getxattr("ckpt.pt", "ckptgw.state"),
                         lambda: c.setxattr("ckpt.pt", "ckptgw.state", b"in_s3"),
                         lambda: c.removexattr("ckpt.pt", "ckptgw.state")):
                with pytest.raises(nfs_rs.NfsUnsupportedError):     # OPENATTR: NFS4ERR_NOTSUPP
                    call()
            # nfs-rs 0.8.7 reports the same NOTSUPP of its listxattr as an "uncertain outcome"
            # of a replay-sensitive op (its own classification, not the server's answer)
            with pytest.raises(nfs_rs.NfsError):
                c.listxattr("ckpt.pt")
            assert read_file(c, "ckpt.pt") == b"weights" * 1000     # the session is fine
        finally:
            c.close()
    finally:
        assert srv.stop() == 0, srv.log_tail()
