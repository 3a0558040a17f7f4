"""The Linux kernel NFSv4 client (in a QEMU VM, testkit/kclient) against ckptgw's server.

Each VM boot runs one guest driver from tests/e2e/guest/ that checks several scenarios and prints
`PASS name` / `FAIL name: why`; module-scoped fixtures boot once and the tests below assert one
scenario each, so a failure names the scenario and carries the guest output, the guest kernel log
and the server log.

Default (CI): 7 boots (one of them the data path over vers=4.0, one the 4.2 sparse/copy ops), about 8-11 minutes of TCG time: semantics over vers=4.2 (tar in/out, links,
truncate, chmod, df, 2,000 entries), data over vers=4.1 (256 MiB dd + checksum, checkpoint
pattern, `latest` rename race), a server restart between unmount and remount, an flock and its
open file held across a server restart (reclaimed in the grace period), a bad export.
CKPTGW_KCLIENT_FULL=1: semantics over 4.1 as well, 10,000 entries, a 1 GiB dd, a bigger checkpoint.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.guest import fsops  # conftest.py put the repo root on sys.path
from testkit.kclient import EXIT_HARNESS, KclientResult, KernelClient

pytestmark = pytest.mark.kclient

REPO = Path(__file__).resolve().parents[2]
GUEST = Path(__file__).resolve().parent / "guest"
EXPORT = "/checkpoints"  # as in conftest.server_command
FULL = os.environ.get("CKPTGW_KCLIENT_FULL") == "1"
SEMANTICS_VERS = ["4.1", "4.2"] if FULL else ["4.2"]
DD_MIB = 1024 if FULL else 256
ENTRIES = 10_000 if FULL else 2_000
CKPT = {"CKPT_STEPS": "3", "CKPT_RANKS": "4", "CKPT_MIB": "16" if FULL else "4"}
LINE_RE = re.compile(r"^(PASS|FAIL) (\S+)(?:[: ] ?(.*))?$")


@dataclass
class GuestRun:
    res: KclientResult
    server: object
    results: dict  # scenario -> (passed, detail)

    def assert_scenario(self, name: str) -> None:
        passed, detail = self.results.get(name, (None, None))
        if passed:
            return
        why = f"scenario {name} {'FAILED: ' + detail if passed is False else 'did not report'}"
        pytest.fail(f"{why}\n{self.res.describe(tail=60)}\n--- server log (tail):\n{self.server.log_tail()}",
                    pytrace=False)


def boot(server, script: str, vers: str = "4.1", env: dict | None = None, timeout: float = 900,
         mount: bool = True, host_calls: dict | None = None) -> GuestRun:
    kc = KernelClient(server.port, export=EXPORT, vers=vers, mount=mount)
    res = kc.run(f"sh {GUEST / script}", timeout=timeout, env=env or {}, cwd=str(REPO), host_calls=host_calls)
    results = {}
    for line in res.stdout.splitlines():
        m = LINE_RE.match(line)
        if m:
            results.setdefault(m.group(2), (m.group(1) == "PASS", m.group(3) or ""))
    run = GuestRun(res, server, results)
    if res.rc == EXIT_HARNESS or res.timed_out:
        pytest.fail(f"kernel-client boot for {script} failed\n{res.describe(tail=60)}\n"
                    f"--- server log (tail):\n{server.log_tail()}", pytrace=False)
    return run


@pytest.fixture(scope="module", params=SEMANTICS_VERS, ids=lambda v: f"vers{v}")
def semantics_run(request, nfs_server):
    return boot(nfs_server, "semantics.sh", vers=request.param, env={"ENTRIES": str(ENTRIES)}, timeout=1500)


@pytest.fixture(scope="module")
def data_run(nfs_server):
    env = {"DD_MIB": str(DD_MIB), "DD_SHA": fsops.stream_sha("dd", DD_MIB * fsops.MIB), **CKPT}
    return boot(nfs_server, "data.sh", vers="4.1", env=env, timeout=1800 if FULL else 900)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("scenario", ["mount-vers", "tar-in-out", "symlinks", "hardlinks", "truncate", "chmod", "df",
                                      "many-entries"])
def test_semantics(semantics_run, scenario):
    semantics_run.assert_scenario(scenario)


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("scenario", ["mount-vers", "dd-fsync-readback", "checkpoint", "checkpoint-readback", "latest-race"])
def test_data(data_run, scenario):
    data_run.assert_scenario(scenario)


@pytest.fixture(scope="module")
def data40_run(nfs_server):
    """The everyday checkpoint path over NFSv4.0 (SETCLIENTID, OPEN_CONFIRM, seqids, RENEW):
    a smaller dd than the 4.1 boot, the same checkpoint pattern and `latest` race."""
    mib = 32
    env = {"DD_MIB": str(mib), "DD_SHA": fsops.stream_sha("dd", mib * fsops.MIB), **CKPT,
           "LATEST_VERSIONS": "50"}
    return boot(nfs_server, "data.sh", vers="4.0", env=env, timeout=900)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("scenario", ["mount-vers", "dd-fsync-readback", "checkpoint", "checkpoint-readback", "latest-race"])
def test_data_vers40(data40_run, scenario):
    data40_run.assert_scenario(scenario)


@pytest.fixture(scope="module")
def v42_run(nfs_server):
    return boot(nfs_server, "v42.sh", vers="4.2", timeout=900)


@pytest.mark.parametrize("scenario", ["mount-vers", "punch-hole", "seek-data-hole", "reflink", "copy",
                                      "copy-async", "special-files", "two-process-locks"])
def test_v42_sparse_and_copy(v42_run, scenario):
    """fallocate --punch-hole, lseek SEEK_DATA/SEEK_HOLE, cp --reflink=always, copy_file_range;
    mkfifo/mknod/a unix socket, flock and fcntl locks from two processes (all over vers=4.2).
    punch-hole and SEEK have no client-side fallback (a server without them fails the check);
    copy_file_range does, so the server's log must show the COPY (and the CLONE) it served, and for
    80 MiB an asynchronous one whose CB_OFFLOAD the client received."""
    v42_run.assert_scenario(scenario)
    if scenario in ("reflink", "copy", "copy-async") and os.environ.get("CKPTGW_E2E_SERVER", "ckptgw") == "ckptgw":
        op = "CLONE" if scenario == "reflink" else "COPY"
        log = v42_run.server.log_path.read_text(errors="replace")
        assert re.search(rf"server_side_copy .*op={op}\b", log), f"no {op} in the server log"
        if scenario == "copy-async":       # the kernel asked asynchronous and waited for CB_OFFLOAD
            assert re.search(r"server_side_copy .*asynchronous=True", log), "no asynchronous COPY"
            assert "async_copy_done" in log and "cb_offload_failed" not in log, "CB_OFFLOAD not delivered"


@pytest.mark.timeout(900)
def test_unmount_restart_remount(fresh_nfs_server):
    run = boot(fresh_nfs_server, "restart.sh", vers="4.1", mount=False, timeout=600,
               host_calls={"restart": fresh_nfs_server.restart})
    for scenario in ("write-then-unmount", "server-restart", "remount-verify", "restart-checkpoint-readback",
                     "after-restart-new-checkpoint"):
        run.assert_scenario(scenario)


def _lock_denied_to_another_client(server, name: str, wait_s: float = 90) -> None:
    """Host call: a second client (testkit/nfsclient.py) asks LOCKT for the guest's locked file and
    must be DENIED (GRACE while the guest still reclaims is waited out)."""
    import asyncio
    import time

    from nfsd.xdr import nfs4 as x
    from testkit.nfsclient import NfsClient, op

    async def probe() -> int:
        c = await NfsClient.connect("127.0.0.1", server.port)
        try:
            await c.setup_session()
            fh = await c.lookup_path(f"{EXPORT}/{name}")
            deadline = time.monotonic() + wait_s
            while True:
                res = await c.compound([op(x.OP_PUTFH, x.PUTFH4args(fh)), op(x.OP_LOCKT, x.LOCKT4args(
                    x.WRITE_LT, 0, 1, x.lock_owner4(c.clientid, b"host-probe")))])
                if res.status != x.NFS4ERR_GRACE or time.monotonic() > deadline:
                    return res.status
                await asyncio.sleep(0.5)
        finally:
            await c.close()
    status = asyncio.run(probe())
    if status != x.NFS4ERR_DENIED:
        raise AssertionError(f"LOCKT by another client answered {status}, not NFS4ERR_DENIED")


@pytest.mark.timeout(900)
def test_lock_and_open_file_survive_restart(fresh_nfs_server):
    """An flock and the open file under it, held across a gateway restart: the client reclaims
    both in the grace period (nfsd/grace.py) and the lock still excludes another process."""
    run = boot(fresh_nfs_server, "lockrestart.sh", vers="4.1", mount=False, timeout=600,
               host_calls={"restart": fresh_nfs_server.restart,
                           "lock-probe": lambda: _lock_denied_to_another_client(fresh_nfs_server, "held-lock")})
    for scenario in ("lock-held-before-restart", "server-restart", "lock-reclaimed", "held-fd-writes",
                     "lock-released"):
        run.assert_scenario(scenario)


@pytest.mark.timeout(300)
def test_missing_export_is_refused(nfs_server):
    """Mounting a path that is not exported fails cleanly (NFS4ERR_NOENT -> mount error), no hang."""
    kc = KernelClient(nfs_server.port, export=EXPORT + "/no-such-dir", vers="4.1", opts="retry=0")
    res = kc.run("true", timeout=240)
    assert res.rc == EXIT_HARNESS and res.harness_error and "mount" in res.harness_error, res.describe()
