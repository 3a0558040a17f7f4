"""Issue 38, foundation: DRBD protocol C between two gateway VMs keeps an fsynced write across a
power cut of the primary.

Node A is primary with ext4 on the DRBD device; a shard is written with the checkpoint recipe
(write tmp, fsync, rename, fsync the directory) and the moment the guest says so, A's qemu is
killed (SIGKILL: a power cut). B sees its peer go, is promoted, mounts (ext4 replays its journal)
and must hold the shard byte for byte. No cluster manager yet: the test is the cluster here.
"""
from __future__ import annotations

import hashlib
import os
import time

import pytest

import drbd

pytestmark = [
    pytest.mark.ha, pytest.mark.slow,
    # test_failover.py asserts all of this and more, in one pair: CI pays for that one (~10 min).
    pytest.mark.skipif(os.environ.get("CKPTGW_LONG") != "1", reason="foundation test (DRBD failed over by hand): "
                       "covered by test_failover.py; runs with CKPTGW_LONG=1"),
]

MOUNT = "/srv/ckpt"
SHARD = 16 << 20
# Runs in the guest as root: the save recipe, reading the shard from stdin.
SAVE = ("python3 -c 'import os,sys\n"
        "d=sys.stdin.buffer.read(); p=\"" + MOUNT + "/shard\"\n"
        "fd=os.open(p+\".tmp\",os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644); os.write(fd,d); os.fsync(fd); os.close(fd)\n"
        "os.rename(p+\".tmp\",p); dfd=os.open(\"" + MOUNT + "\",os.O_RDONLY); os.fsync(dfd)\n"
        "print(\"acknowledged\",len(d))'")


def test_fsynced_write_survives_primary_power_cut(pair, report):
    t = time.monotonic()
    pair.start()
    report(f"boot (both at once, to SSH): gw-a {pair.boot_seconds['gw-a']:.0f}s, gw-b {pair.boot_seconds['gw-b']:.0f}s")

    for node in ("gw-a", "gw-b"):
        drbd.configure(pair, node, create_md=True)
    drbd.wait_state(pair, "gw-a", 120, cs="Connected")
    # Fresh disks: A's content is declared the good one and copied to B in full.
    t0 = time.monotonic()
    pair.ssh("gw-a", f"drbdadm primary --force {drbd.RESOURCE}")
    synced = drbd.wait_state(pair, "gw-a", 900, cs="Connected", ds="UpToDate/UpToDate")
    report(f"initial sync of {pair.data_size}: {time.monotonic() - t0:.0f}s (poll {synced:.0f}s)")

    pair.ssh("gw-a", f"mkfs.ext4 -q {drbd.DEVICE} && mkdir -p {MOUNT} && mount {drbd.DEVICE} {MOUNT}")
    shard = os.urandom(SHARD)
    out = pair.out("gw-a", SAVE, input=shard)
    assert out.strip() == f"acknowledged {SHARD}", out
    pair.power_cut("gw-a")                 # nothing between the acknowledgement and the cut
    t_cut = time.monotonic()

    # B notices the peer is gone (DRBD's ping timeout), then takes over.
    drbd.wait_state(pair, "gw-b", 120, cs="WFConnection", ds="UpToDate/DUnknown")
    t_seen = time.monotonic()
    pair.ssh("gw-b", f"drbdadm primary {drbd.RESOURCE}")
    t_promoted = time.monotonic()
    pair.ssh("gw-b", f"mkdir -p {MOUNT} && mount {drbd.DEVICE} {MOUNT}")
    t_mounted = time.monotonic()
    got = pair.ssh("gw-b", f"cat {MOUNT}/shard").stdout
    assert len(got) == SHARD and got == shard, \
        f"shard differs after failover: {len(got)} bytes, sha256 {hashlib.sha256(got).hexdigest()[:16]}"
    assert pair.out("gw-b", f"ls {MOUNT}").split() == ["lost+found", "shard"]
    report(f"failover by hand: kill -> peer seen gone {t_seen - t_cut:.1f}s -> promoted "
           f"{t_promoted - t_cut:.1f}s -> mounted {t_mounted - t_cut:.1f}s; {SHARD >> 20} MiB shard byte for byte")
    report(f"test total {time.monotonic() - t:.0f}s")
