"""DRBD 8.4 on a Pair: the resource file, bringing it up, reading its state from /proc/drbd.

Debian 12's kernel ships the drbd 8.4.11 module; drbd-utils 9.22 sees that and runs its 8.4
tools (drbdadm-84), so the resource file is 8.4 syntax.
"""
from __future__ import annotations

import re
import time

from pairvm import Pair, address

RESOURCE = "r0"
DEVICE = "/dev/drbd0"
BACKING = "/dev/vdb"        # each node's own raw data disk (pairvm)
PORT = 7789


# Under Pacemaker (cluster=True), what a production pair runs:
#  - fencing resource-and-stonith: when a node loses its peer it freezes I/O and calls the fence-peer
#    handler, which (crm-fence-peer.sh, the 8.4 one) forbids the peer's promotion in the CIB and, the
#    peer's state being unknown, waits for Pacemaker to STONITH it; I/O resumes only then. So a
#    node cut off from its peer can neither go on writing alone nor be promoted while the peer is
#    primary. after-resync-target lifts the constraint once the peer is in sync again.
#  - on-io-error detach: a failing backing disk is dropped (the node goes diskless, reads and writes
#    through the peer) instead of the error reaching the file system.
#  - after a split brain (which fencing should make impossible): a side with no changes, or the
#    secondary's, is discarded automatically; two primaries' changes are never merged (disconnect,
#    an operator decides).
#  - c-min-rate 20M, c-max-rate 400M (the role's defaults): with clients writing, DRBD 8.4 holds a
#    resync at c-min-rate, 250k by default (18 min for the 512 MiB a crashed primary's activity log
#    marks, seen in the failback test); 20M is that resync in under a minute.
CLUSTER_OPTIONS = (
    "  disk { on-io-error detach; fencing resource-and-stonith; c-min-rate 20M; c-max-rate 400M; }\n"
    "  handlers {\n    fence-peer \"/usr/lib/drbd/crm-fence-peer.sh\";\n"
    "    after-resync-target \"/usr/lib/drbd/crm-unfence-peer.sh\";\n  }\n")
CLUSTER_NET = " after-sb-0pri discard-zero-changes; after-sb-1pri discard-secondary; after-sb-2pri disconnect;"


def resource_file(nodes: tuple[str, ...], cluster: bool = False) -> str:
    # Protocol C: a write completes only once both nodes' disks have it.
    ons = "".join(f"  on {n} {{ address {address(n)}:{PORT}; }}\n" for n in nodes)
    net = "protocol C;" + (CLUSTER_NET if cluster else "")
    return (f"resource {RESOURCE} {{\n  net {{ {net} }}\n{CLUSTER_OPTIONS if cluster else ''}"
            f"  device {DEVICE};\n  disk {BACKING};\n  meta-disk internal;\n{ons}}}\n")


def configure(pair: Pair, node: str, *, create_md: bool, cluster: bool = False) -> None:
    """Write the resource file and attach + connect (create-md only on a fresh disk)."""
    pair.ssh(node, f"cat > /etc/drbd.d/{RESOURCE}.res", input=resource_file(tuple(pair.data), cluster).encode())
    md = f"drbdadm create-md --force {RESOURCE} && " if create_md else ""
    pair.ssh(node, f"modprobe drbd && {md}drbdadm up {RESOURCE}")


def state(pair: Pair, node: str) -> dict[str, str]:
    """cs (connection), ro (roles, own/peer), ds (disk states, own/peer) of the resource."""
    text = pair.out(node, "cat /proc/drbd")
    found = dict(re.findall(r"\b(cs|ro|ds):(\S+)", text))
    if not found:
        raise AssertionError(f"{node}: no resource in /proc/drbd:\n{text}")
    return found


def wait_state(pair: Pair, node: str, timeout: float, **want: str) -> float:
    """Poll /proc/drbd until every field has the wanted value; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        now = state(pair, node)
        if all(now.get(k) == v for k, v in want.items()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            stalls = pair.segment_stalls()
            raise AssertionError(f"{node}: DRBD did not reach {want} in {timeout:.0f}s: {now}"
                                 + (f"; {stalls}" if stalls else ""))
        time.sleep(2)
