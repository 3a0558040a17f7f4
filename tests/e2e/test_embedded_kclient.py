"""The README's first command end to end: `ckptgw serve` in try-out mode (embedded in-memory S3),
mounted by the real Linux client, a checkpoint saved the recommended way (tmp + fsync + rename, a
step directory renamed into place, a `latest` symlink), `ckptgw flush --wait`, and the objects in the
embedded bucket are byte for byte what the guest wrote, under their final names only."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from testkit.appliance_live import LiveDaemon
from tests.appliance.test_cli_live import s3_client

pytestmark = pytest.mark.kclient

RANKS = 3
MIB = 6

# Deterministic, incompressible-looking content so the host knows what each rank wrote.
GUEST = r'''
set -e
cd /mnt
mkdir -p run1/step_000100.tmp
for r in $(seq 0 $((RANKS - 1))); do
  ( python3 -c "
import hashlib, os, sys
r, mib = int(sys.argv[1]), int(sys.argv[2])
block = b''.join(hashlib.sha256(b'%d-%d' % (r, i)).digest() for i in range(32768))
with open('run1/step_000100.tmp/rank%d.pt.tmp' % r, 'wb') as f:
    for _ in range(mib):
        f.write(block)
    f.flush(); os.fsync(f.fileno())
os.rename('run1/step_000100.tmp/rank%d.pt.tmp' % r, 'run1/step_000100.tmp/rank%d.pt' % r)
" $r $MIB ) &
done
wait
mv run1/step_000100.tmp run1/step_000100
ln -s step_000100 run1/latest
. "$KCLIENT_GUEST_LIB"
kc_host_call flush
ls -l run1/step_000100
'''


def expected(rank: int) -> bytes:
    block = b"".join(hashlib.sha256(b"%d-%d" % (rank, i)).digest() for i in range(32768))
    return block * MIB


@pytest.fixture
def daemon(tmp_path):
    d = LiveDaemon(tmp_path).start()
    yield d
    d.close()


def test_tryout_mode_save_flush_and_objects_in_the_embedded_bucket(daemon):
    from testkit.kclient import KernelClient, require
    require()
    flushed = {}

    def flush():
        # What a training script runs before it exits: everything under the path clean in S3.
        r = subprocess.run([sys.executable, "-m", "appliance.cli", "--socket", str(daemon.socket),
                            "flush", "--wait", "--timeout", "300", "/checkpoints/run1"],
                           capture_output=True, text=True, timeout=360)
        flushed.update(rc=r.returncode, out=r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"ckptgw flush --wait failed ({r.returncode}): {r.stdout} {r.stderr}")

    kc = KernelClient(daemon.nfs_port, export="/checkpoints", vers="4.1")
    res = kc.run(GUEST, timeout=900, env={"RANKS": str(RANKS), "MIB": str(MIB)},
                 host_calls={"flush": flush})
    res.check()
    assert flushed["rc"] == 0, flushed

    s3 = s3_client(daemon)
    bucket = daemon.status["s3"]["bucket"]
    listing = s3.list_objects_v2(Bucket=bucket)
    keys = sorted(o["Key"] for o in listing.get("Contents", []))
    files = [k for k in keys if not k.endswith("/")]
    assert files == ["run1/latest"] + [f"run1/step_000100/rank{r}.pt" for r in range(RANKS)], keys
    # the symlink as s3fs stores one: its target is the body
    assert s3.get_object(Bucket=bucket, Key="run1/latest")["Body"].read() == b"step_000100"
    assert not any(".tmp" in k for k in keys), keys          # temp names never reach S3
    for r in range(RANKS):
        body = s3.get_object(Bucket=bucket, Key=f"run1/step_000100/rank{r}.pt")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(expected(r)).hexdigest()
    st = daemon.cli_json("status")
    assert st["upload"]["queue_depth"] == 0
