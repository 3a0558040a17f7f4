"""AUTH_SYS permissions and locks as the Linux kernel client exercises them (QEMU VM, slow:
`-m kclient`). The guest runs a Python script as uid 1000 and reports PASS/FAIL lines."""
from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.kclient

GUEST_SCRIPT = textwrap.dedent('''
    import errno, fcntl, os, sys, time
    os.chdir("/mnt")
    d = "perm.%d" % time.time_ns()
    os.mkdir(d); os.chdir(d)
    os.mkdir("pub"); os.chmod("pub", 0o1777)
    open("pub/rootfile", "w").write("r")
    os.mkdir("priv", 0o700)

    def report(ok, name, why=""):
        print("PASS" if ok else "FAIL", name, why, flush=True)

    def expect(name, fn, err):
        try:
            fn()
            report(False, name, "no error")
        except OSError as e:
            report(e.errno == err, name, errno.errorcode.get(e.errno))

    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setgid(1000); os.setuid(1000)
        open("pub/mine", "w").write("m")
        st = os.stat("pub/mine")
        report((st.st_uid, st.st_gid) == (1000, 1000), "new-file-owner", (st.st_uid, st.st_gid))
        expect("sticky-unlink", lambda: os.unlink("pub/rootfile"), errno.EPERM)
        expect("open-others-for-write", lambda: open("pub/rootfile", "a"), errno.EACCES)
        expect("list-0700-dir", lambda: os.listdir("priv"), errno.EACCES)
        expect("create-in-0700-dir", lambda: open("priv/x", "w"), errno.EACCES)
        expect("chmod-others", lambda: os.chmod("pub/rootfile", 0o777), errno.EPERM)
        expect("chown-to-root", lambda: os.chown("pub/mine", 0, 0), errno.EPERM)
        os.chmod("pub/mine", 0o400)
        expect("owner-open-0400-for-write", lambda: open("pub/mine", "a"), errno.EACCES)
        fd = os.open("pub/new", os.O_CREAT | os.O_RDWR, 0o444)
        report(os.write(fd, b"ok") == 2, "write-through-creating-fd")
        os.close(fd)
        os._exit(0)
    os.waitpid(pid, 0)
    # POSIX locks between two processes of this client
    fd = os.open("pub/rootfile", os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    child = os.fork()
    if child == 0:
        fd2 = os.open("pub/rootfile", os.O_RDWR)
        try:
            fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
            report(False, "lock-conflict", "second lock granted")
        except OSError as e:
            report(e.errno in (errno.EAGAIN, errno.EACCES), "lock-conflict", errno.errorcode.get(e.errno))
        os._exit(0)
    os.waitpid(child, 0)
    fcntl.lockf(fd, fcntl.LOCK_UN)
    os.close(fd)
    print("DONE", flush=True)
''')


@pytest.fixture
def server(tmp_path):
    from testkit.ckptgw_server import CkptgwServer
    from testkit.loopback import free_port
    from testkit.kclient import require
    require()
    srv = CkptgwServer(tmp_path, free_port())
    srv.start()
    yield srv
    srv.stop()


def test_permissions_and_locks_through_the_kernel_client(server):
    from testkit.kclient import KernelClient
    res = KernelClient(server.port, export="/checkpoints", vers="4.1").run(
        'python3 -c "$GUEST_SCRIPT"', timeout=600, env={"GUEST_SCRIPT": GUEST_SCRIPT})
    lines = [l for l in res.stdout.splitlines() if l.startswith(("PASS", "FAIL", "DONE"))]
    failed = [l for l in lines if l.startswith("FAIL")]
    assert not failed and "DONE" in lines and len(lines) >= 11, \
        f"{res.describe(tail=40)}\n--- server log:\n{server.log_tail()}"
