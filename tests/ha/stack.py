"""The gateway stack on a Pair under Pacemaker (issue 38), as the Ansible role deploys it (deploy.py):
ckptgw installed on both nodes, the cache volume on DRBD, and the cluster resources that move them
together. This module reads and drives that stack; the role writes it.

Resources (the role's templates/pair.crm.j2; Pacemaker 2.1.5 reads the Master/Slave role names, crmsh
4.4 writes them while its OCF 1.1 support is off, Debian's default):
  fence-sbd              stonith:fence_sbd on the shared SBD disk
  drbd-r0 / drbd-clone   ocf:linbit:drbd, a promotable clone: one Primary, one Secondary
  gw (a group, in order) cache-fs   ocf:heartbeat:Filesystem, /dev/drbd0 on /var/lib/ckptgw/cache
                         gw-ip      ocf:heartbeat:IPaddr2, the floating address on eth1 (the segment)
                         gateway    systemd:ckptgw, the role's unit (Type=notify: started = READY=1)
  gw runs only where drbd-clone is promoted, and starts only after the promotion; a stopping gw
  is stopped before the demotion. resource-stickiness keeps things where they run (no failback
  by itself); a small preference puts the first promotion on the first node, gw-a, so a test knows
  its active node. The unit is installed but never enabled: only Pacemaker starts it, on the active
  node only. Every operation's timeout is generous (60 s for a monitor): on an emulated CPU of a
  loaded host an IPaddr2 monitor once took over 20 s, and a monitor timeout restarts the whole group.
"""
from __future__ import annotations

import json
import re
import shlex
import time

from pairvm import Pair

FLOATING_IP = "192.168.38.100"
CACHE = "/var/lib/ckptgw/cache"
VENV = "/opt/ckptgw/venv"
CKPTGW = f"{VENV}/bin/ckptgw"
EXPORT = "/checkpoints"


def resources(status: str) -> dict[str, str]:
    """crm_mon -1's resource lines: name -> 'Started gw-a', 'Master gw-a' / 'Promoted gw-a', ..."""
    found = {}
    for m in re.finditer(r"^\s*\*?\s*(\S+)\s+\((?:ocf:|stonith:|systemd:)[^)]*\):\s+(.+?)\s*$", status, re.M):
        found.setdefault(m.group(1), m.group(2))
    return found


def promoted_on(status: str) -> set[str]:
    """Nodes where drbd-clone is promoted (crm_mon's 'Promoted: [ gw-a ]' or 'Masters: [ gw-a ]')."""
    m = re.search(r"(?:Promoted|Masters):\s*\[ (.*?) \]", status)
    return set(m.group(1).split()) if m else set()


def stack_on(status: str, node: str) -> bool:
    """The whole stack active on `node`: DRBD promoted there, the group's three resources started there."""
    res = resources(status)
    return promoted_on(status) == {node} and all(res.get(r) == f"Started {node}"
                                                 for r in ("cache-fs", "gw-ip", "gateway"))


def unit_state(pair: Pair, node: str) -> str:
    return pair.out(node, "systemctl is-active ckptgw.service", check=False).strip()


def check(pair: Pair, node: str) -> str:
    """`ckptgw check` through the admin socket on the node (exit 1 on problems)."""
    return pair.out(node, f"{CKPTGW} check")


def pair_status(pair: Pair, node: str) -> dict:
    """The "pair" part of `ckptgw status --json` on the node: DRBD's state as the gateway reads it
    (/proc/drbd) and the fence constraints it reads from the CIB (cibadmin, as the unit's user)."""
    return json.loads(pair.out(node, f"{CKPTGW} status --json"))["pair"]


def mount_client(pair: Pair, node: str, mountpoint: str = "/mnt/ckpt", vers: str = "4.1",
                 server: str = FLOATING_IP, port: int | None = None) -> None:
    """The stock kernel client, a hard NFSv4.1 mount of the floating address (or `server`, at
    `port`). timeo=100,retrans=2 bounds the client's reconnect backoff (its maximum is
    timeo*(retrans+1), 30 s) while the address has no server behind it; the default timeo=600
    would let it grow to 3 min. 4.2 offers the user.ckptgw.* attributes that `ckptgw wait` reads."""
    opts = f"vers={vers},hard,timeo=100,retrans=2" + (f",port={port}" if port else "")
    pair.ssh(node, f"mkdir -p {mountpoint} && mount -t nfs4 -o {opts} {server}:{EXPORT} {mountpoint}",
             timeout=300)


def wait_uploaded(pair: Pair, node: str, path: str, timeout: float) -> None:
    """`ckptgw wait PATH` on the node (a 4.2 mount): every file under PATH is in S3."""
    pair.ssh(node, f"{CKPTGW} wait --timeout {timeout:.0f} {shlex.quote(path)}", timeout=timeout + 120)


def bucket_objects(client, bucket: str, prefix: str) -> tuple[dict[str, list[dict]], set[str]]:
    """Every version of every key under `prefix` (key -> versions, newest first, delete markers
    left out) and the keys whose newest version is an object (not deleted)."""
    versions: dict[str, list[dict]] = {}
    deleted: set[str] = set()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            versions.setdefault(v["Key"], []).append(v)
        for m in page.get("DeleteMarkers", []):
            if m["IsLatest"]:
                deleted.add(m["Key"])
    current = {key for key, vs in versions.items() if key not in deleted}
    return versions, current


def clock_offset(pair: Pair, node: str) -> tuple[float, float]:
    """(guest clock - host clock, uncertainty): the smallest of three SSH round trips, halved."""
    best = None
    for _ in range(3):
        t0 = time.time()
        guest = float(pair.out(node, "date +%s.%N"))
        t1 = time.time()
        if best is None or t1 - t0 < best[1] * 2:
            best = (guest - (t0 + t1) / 2, (t1 - t0) / 2)
    return best


# What the survivor's journal says, in order (each the first line after the kill that matches).
JOURNAL_MARKS = [
    ("peer lost (corosync)", r"A processor failed, forming new configuration"),
    ("fenced", r"Operation '(?:reboot|off)' .*targeting gw-a.*: OK|Peer gw-a was terminated .*: OK"),
    ("promoted", r"role\( Secondary -> Primary \)"),
    ("mounted", r"EXT4-fs \(drbd0\): mounted filesystem"),
    ("floating IP up", r"Adding inet address " + re.escape(FLOATING_IP)),
    ("gateway READY", r"Started ckptgw\.service|Started ckptgw NFSv4"),
    ("grace ended", r'"event": ?"grace_ended"'),
]


def journal_marks(pair: Pair, node: str, since: float, marks=JOURNAL_MARKS) -> dict[str, float]:
    """Guest-clock times of `marks` (name, pattern) in the node's journal since `since` (guest clock)."""
    return {name: t for name, (t, _) in journal_matches(pair, node, since, marks).items()}


def journal_matches(pair: Pair, node: str, since: float, marks) -> dict[str, tuple[float, re.Match]]:
    """The first line of the node's journal since `since` matching each of `marks`: (time, match)."""
    text = pair.out(node, f"journalctl --no-pager -o short-unix --since @{int(since) - 1}", timeout=120)
    found: dict[str, tuple[float, re.Match]] = {}
    for line in text.splitlines():
        stamp, _, msg = line.partition(" ")
        try:
            t = float(stamp)
        except ValueError:
            continue
        if t < since:
            continue
        for name, pattern in marks:
            m = re.search(pattern, msg) if name not in found else None
            if m:
                found[name] = (t, m)
    return found


# A cut replication link, on the active node gw-a's journal: it loses gw-b and fences it (and is
# never fenced itself: priority-fencing-delay holds back the fencing of the node running the group).
LINKCUT_MARKS = [
    ("peer lost (corosync)", r"A processor failed, forming new configuration"),
    ("gw-b fenced", r"Operation '(?:reboot|off)' .*targeting gw-b.*: OK|Peer gw-b was terminated .*: OK"),
    ("gw-a fenced", r"Operation '(?:reboot|off)' .*targeting gw-a.*: OK|Peer gw-a was terminated .*: OK"),
    ("DRBD connected again", r"conn\( \w+ -> Connected \)"),
]


def wait_acknowledged_after(pair: Pair, node: str, since: float, timeout: float, what: str,
                            log: str = "/root/acks.log") -> None:
    """Wait until the save loop on `node` has acknowledged a save after `since` (its clock)."""
    pair.wait_for(node, f"awk '$2 > {since:.3f} {{ found = 1 }} END {{ exit !found }}' {log}", timeout, what)


# A switchover's steps on the node taking over (failback), and the DRBD resync on the source.
SWITCHOVER_MARKS = [(name, pattern) for name, pattern in JOURNAL_MARKS
                    if name not in ("peer lost (corosync)", "fenced")]
RESYNC_MARKS = [
    ("resync began", r"Began resync as SyncSource \(will sync (\d+) KB"),
    ("resync done", r"Resync done \(total (\d+) sec"),
]


def resync_figure(resync: dict) -> tuple[float, int] | None:
    """(MiB resynced, seconds) from journal_matches(..., RESYNC_MARKS), None if either line is missing."""
    if "resync began" in resync and "resync done" in resync:
        return int(resync["resync began"][1].group(1)) / 1024, int(resync["resync done"][1].group(1))
    return None


# The checkpoint save recipe in a loop, as a client runs it: write a tmp file, fsync, rename,
# fsync the directory; a shard is acknowledged once that returns, and only then is it logged
# (index, time, sha256) to a local file that is itself fsynced. A save that fails (an error from
# the mount) is not acknowledged: it is logged to FAILED (index, time, error) and the loop goes on
# with the next shard, as a training job retries its save. Stops when STOP exists.
WRITER = r"""
import hashlib, os, sys, time
d, log, size, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
out = open(log, "a")
failed = open(log + ".failed", "a")
i = int(sys.argv[5]) if len(sys.argv) > 5 else 0
while not os.path.exists(stop):
    data = os.urandom(size)
    p = os.path.join(d, "shard-%05d" % i)
    try:
        fd = os.open(p + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        os.rename(p + ".tmp", p)
        dfd = os.open(d, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    except OSError as e:
        failed.write("%d %.3f %s\n" % (i, time.time(), repr(e).replace("\n", " ")))
        failed.flush()
        i += 1
        continue
    out.write("%d %.3f %s\n" % (i, time.time(), hashlib.sha256(data).hexdigest()))
    out.flush()
    os.fsync(out.fileno())
    i += 1
"""


def start_writer(pair: Pair, node: str, directory: str, size: int, log: str = "/root/acks.log",
                 stop: str = "/root/writer.stop", first: int = 0) -> None:
    """The save loop in the background; `first` > 0 goes on with the log of an earlier loop (its
    saves from shard `first` on), else the log starts afresh."""
    fresh = f"{log} {log}.failed " if first == 0 else ""
    pair.ssh(node, f"mkdir -p {directory} && cat > /root/writer.py", input=WRITER.encode())
    pair.ssh(node, f"rm -f {fresh}{stop}; setsid nohup python3 /root/writer.py {shlex.quote(directory)} {log} "
                   f"{size} {stop} {first} > /root/writer.out 2>&1 < /dev/null & echo $! > /root/writer.pid")


def acks(pair: Pair, node: str, log: str = "/root/acks.log") -> list[tuple[int, float, str]]:
    text = pair.out(node, f"cat {log} 2>/dev/null || true")
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((int(parts[0]), float(parts[1]), parts[2]))
    return rows


def failed_saves(pair: Pair, node: str, log: str = "/root/acks.log") -> list[str]:
    return pair.out(node, f"cat {log}.failed 2>/dev/null || true").splitlines()


def stop_writer(pair: Pair, node: str, timeout: float, stop: str = "/root/writer.stop") -> None:
    """Ask the writer to stop after its current shard, and wait until it has."""
    pair.ssh(node, f"touch {stop}")
    pair.wait_for(node, "test ! -d /proc/$(cat /root/writer.pid)", timeout, "the writer stopped")
    err = pair.out(node, "cat /root/writer.out")
    assert not err.strip(), f"the writer failed:\n{err[-2000:]}"
