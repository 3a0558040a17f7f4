"""Issue 38, foundation: a two-node Corosync/Pacemaker cluster with SBD fencing comes up in the
harness, and fences a node whose host dies.

Both nodes join (`crm_mon -1`: both online, the fence_sbd device started); then gw-a's qemu is
killed and gw-b must fence it through the SBD disk (slot `reset`, then OFFLINE, not UNCLEAN) before
the cluster may act as if gw-a were gone. No resources yet beyond the fence device.
"""
from __future__ import annotations

import os
import time

import pytest

import cluster

pytestmark = [
    pytest.mark.ha, pytest.mark.slow,
    # test_failover.py asserts all of this and more, in one pair: CI pays for that one (~10 min).
    pytest.mark.skipif(os.environ.get("CKPTGW_LONG") != "1", reason="foundation test (the cluster fencing a dead node): "
                       "covered by test_failover.py; runs with CKPTGW_LONG=1"),
]


def test_two_node_cluster_with_sbd_comes_up_and_fences_a_dead_node(pair, report):
    t = time.monotonic()
    pair.start()
    cluster.configure(pair)
    t0 = time.monotonic()
    cluster.start(pair)
    joined, _ = cluster.wait_mon(pair, "gw-a", 300, "both nodes online",
                                 lambda s: cluster.online(s) == {"gw-a", "gw-b"} and "Current DC: gw-" in s)
    report(f"cluster up (pacemaker started on both -> both online in crm_mon): {time.monotonic() - t0:.0f}s")
    cluster.configure_fencing(pair, "gw-a")
    _, status = cluster.wait_mon(pair, "gw-a", 300, "fence-sbd started", cluster.fence_device_started)
    assert cluster.online(status) == {"gw-a", "gw-b"}, status
    for node in ("gw-a", "gw-b"):
        assert pair.out(node, "systemctl is-active sbd corosync pacemaker").split() == ["active"] * 3

    pair.power_cut("gw-a")
    t_cut = time.monotonic()
    lost, _ = cluster.wait_mon(pair, "gw-b", 120, "gw-a lost", lambda s: "gw-a: UNCLEAN" in s)   # s after the cut
    fenced, status = cluster.wait_mon(pair, "gw-b", 300, "gw-a fenced",
                                      lambda s: "OFFLINE: [ gw-a ]" in s)
    assert cluster.online(status) == {"gw-b"}, status
    slots = pair.out("gw-b", f"sbd -d {cluster.SBD_DISK} list")
    assert any(line.split()[1:3] == ["gw-a", "reset"] for line in slots.splitlines()), slots
    report(f"kill -9 of gw-a -> UNCLEAN on gw-b {lost:.0f}s -> fenced (OFFLINE, "
           f"sbd slot reset) {time.monotonic() - t_cut:.0f}s (token {cluster.TOKEN_MS // 1000} s, msgwait "
           f"{cluster.SBD_MSGWAIT_S} s)")
    report(f"test total {time.monotonic() - t:.0f}s")
