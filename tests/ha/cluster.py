"""Corosync + Pacemaker + SBD on a Pair: the configuration files and bringing the stack up.

Timers are stretched for guests on emulated CPUs (qemu TCG, no KVM), where the defaults cause
false failovers; every failover time measured with them says so:
  - corosync token 10 s (default 1 s; 3 s in many recipes); consensus is 1.2x the token (12 s);
  - SBD on the shared disk: watchdog timeout 20 s, msgwait 40 s (defaults 5 s / 10 s); Pacemaker's
    stonith-timeout 90 s (above msgwait with margin); priority-fencing-delay 25 s (default 10 s).
A two-node cluster: votequorum's two_node (implies wait_for_all), and fencing is what settles a
split: fence_sbd writes a poison pill into the peer's slot on the SBD disk, and a node whose
watchdog is not fed (sbd hung, or cut off from the disk and from its peer) resets itself.
"""
from __future__ import annotations

import re
import time

from pairvm import Pair, address

SBD_DISK = "/dev/vdc"
TOKEN_MS = 10_000
SBD_WATCHDOG_S, SBD_MSGWAIT_S = 20, 40
# A cut link: the fencing of the node running the gateway waits this long, so the passive node is
# shot first; above the watchdog timeout (a fenced node is dead by then). It delays a dead active
# node's fencing as much.
PRIORITY_FENCING_DELAY_S = 25
STONITH_TIMEOUT_S = 90


def corosync_conf(nodes: tuple[str, ...]) -> str:
    members = "".join(f"    node {{\n        ring0_addr: {address(n)}\n        name: {n}\n        nodeid: {i}\n    }}\n"
                      for i, n in enumerate(nodes, 1))
    # No crypto: the segment is the test's own; a deployment sets crypto and an authkey.
    return ("totem {\n    version: 2\n    cluster_name: ckptgw\n    transport: knet\n"
            f"    token: {TOKEN_MS}\n    crypto_cipher: none\n    crypto_hash: none\n}}\n"
            f"nodelist {{\n{members}}}\n"
            "quorum {\n    provider: corosync_votequorum\n    two_node: 1\n}\n"
            "logging {\n    to_syslog: yes\n    to_logfile: no\n}\n")


def watchdog_device(pair: Pair, node: str) -> str:
    """The i6300esb's /dev/watchdogN (q35 also has the iTCO one, probed in either order)."""
    out = pair.out(node, "grep -l i6300ESB /sys/class/watchdog/*/identity")
    return "/dev/" + out.split("/")[4]


def configure(pair: Pair) -> None:
    """SBD header on the shared disk (once), then on each node: corosync.conf, sbd's settings, sbd
    enabled (corosync requires it, so starting pacemaker starts all three)."""
    nodes = tuple(pair.vms)
    first = nodes[0]
    pair.ssh(first, f"sbd -d {SBD_DISK} -1 {SBD_WATCHDOG_S} -4 {SBD_MSGWAIT_S} create")
    for node in nodes:
        pair.ssh(node, "cat > /etc/corosync/corosync.conf", input=corosync_conf(nodes).encode())
        wd = watchdog_device(pair, node)
        pair.ssh(node, f"sed -i -e 's|^#*SBD_DEVICE=.*|SBD_DEVICE={SBD_DISK}|' -e 's|^SBD_WATCHDOG_DEV=.*|SBD_WATCHDOG_DEV={wd}|'"
                       f" -e 's|^SBD_WATCHDOG_TIMEOUT=.*|SBD_WATCHDOG_TIMEOUT={SBD_WATCHDOG_S}|' /etc/default/sbd"
                       f" && grep -q '^SBD_DEVICE={SBD_DISK}$' /etc/default/sbd && systemctl enable sbd")


def start(pair: Pair) -> None:
    """Start pacemaker (and with it corosync and sbd) on every node."""
    for node in pair.vms:
        pair.ssh(node, "systemctl start pacemaker")


def configure_fencing(pair: Pair, node: str) -> None:
    """Cluster-wide (through one node): fencing on, and the SBD fence device."""
    pair.ssh(node, f"crm configure property stonith-enabled=true stonith-timeout={STONITH_TIMEOUT_S}s")
    pair.ssh(node, f"crm configure primitive fence-sbd stonith:fence_sbd params devices={SBD_DISK} "
                   "op monitor interval=60s timeout=60s")


def crm_mon(pair: Pair, node: str) -> str:
    return pair.out(node, "crm_mon -1", check=False)


def online(status: str) -> set[str]:
    m = re.search(r"Online: \[ (.*?) \]", status)
    return set(m.group(1).split()) if m else set()


def fence_device_started(status: str) -> bool:
    return re.search(r"fence-sbd\s+\(stonith:fence_sbd\):\s+Started gw-", status) is not None


def fence_constraints(pair: Pair, node: str) -> list[str]:
    """DRBD's fence constraints in the CIB: crm-fence-peer.sh sets one (no promotion of the peer that
    may be out of date), crm-unfence-peer.sh lifts it after that peer's resync. One left on an in-sync
    pair forbids the next failover."""
    xml = pair.out(node, "cibadmin --query --scope constraints")
    return re.findall(r'id="(drbd-fence-by-handler-[^"]*)"', xml)


def wait_unfenced(pair: Pair, node: str, timeout: float) -> float:
    """Wait for the fence constraints to be lifted (the handler runs as the resync ends)."""
    t0 = time.monotonic()
    while left := fence_constraints(pair, node):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{node}: DRBD's fence constraint {left} still in the CIB {timeout:.0f}s after "
                                 "the resync: the pair could not fail over to the resynced node")
        time.sleep(3)
    return time.monotonic() - t0


def wait_mon(pair: Pair, node: str, timeout: float, what: str, ok) -> tuple[float, str]:
    """Poll `crm_mon -1` on the node until ok(status); returns (seconds, status)."""
    t0 = time.monotonic()
    while True:
        status = crm_mon(pair, node)
        if ok(status):
            return time.monotonic() - t0, status
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{node}: {what} not reached in {timeout:.0f}s:\n{status}")
        time.sleep(3)
