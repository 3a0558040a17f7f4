"""The gateway pair's replication state (issue 38): whether the cache volume's DRBD resource is
connected to the peer and both disks are up to date, read from /proc/drbd (DRBD 8.4, the module
Debian 12's kernel ships; drbd-utils 9 drives it through its 8.4 tools).

While the pair is in sync, a write the gateway acknowledges is on both nodes' disks (protocol C).
While it is degraded (the peer down or unreachable, or a disk not up to date), DRBD keeps serving
from this node alone: acknowledged writes are on this node's disk only until the peer is back and
resynced. `ckptgw status` shows it, the `ckptgw_pair_*` metrics carry it and the CkptgwPairDegraded
alert says so (docs/operations.md "HA pair").
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

PROC_DRBD = "/proc/drbd"

IN_SYNC, SYNCING, DEGRADED, UNKNOWN = "in_sync", "syncing", "degraded", "unknown"
# connection states in which the peer is connected and a resync runs (or is paused)
_SYNCING = {"SyncSource", "SyncTarget", "PausedSyncS", "PausedSyncT", "StartingSyncS",
            "StartingSyncT", "WFBitMapS", "WFBitMapT", "WFSyncUUID"}
# connected, both sides comparing blocks: as in sync as Connected
_CONNECTED = {"Connected", "VerifyS", "VerifyT"}
_DEVICE = re.compile(r"/dev/drbd(\d{1,6})")


def minor_of(device: str) -> int:
    """The DRBD minor of a device path /dev/drbdN (ValueError otherwise)."""
    m = _DEVICE.fullmatch(device.strip())
    if not m:
        raise ValueError(f"expected a DRBD device /dev/drbdN, got {device!r}")
    return int(m.group(1))


@dataclass(frozen=True)
class PairState:
    device: str
    state: str                       # in_sync | syncing | degraded | unknown
    connection: str | None = None    # DRBD's cs: Connected, WFConnection, StandAlone, SyncSource...
    role: str | None = None          # this node's: Primary | Secondary
    peer_role: str | None = None     # Unknown while not connected
    disk: str | None = None          # UpToDate, Inconsistent, Outdated, Diskless...
    peer_disk: str | None = None     # DUnknown while not connected
    out_of_sync_bytes: int | None = None
    problem: str | None = None       # why it is not in sync, for people

    @property
    def degraded(self) -> bool:
        """Not redundant now: anything but in sync (a resync too: the peer lags)."""
        return self.state != IN_SYNC

    @property
    def peer_connected(self) -> bool:
        return self.connection in _CONNECTED or self.connection in _SYNCING

    def as_dict(self) -> dict:
        return {**asdict(self), "degraded": self.degraded, "peer_connected": self.peer_connected}


def read_pair(device: str, path: str = PROC_DRBD) -> PairState:
    """The state of DRBD device `device` (/dev/drbdN) from /proc/drbd."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        return PairState(device, UNKNOWN, problem=f"cannot read {path} ({e.strerror}): is the drbd "
                                                  "module loaded?")
    return parse_proc_drbd(text, device)


def parse_proc_drbd(text: str, device: str) -> PairState:
    """PairState of `device` from the text of /proc/drbd (8.4: one `N: cs:.. ro:../.. ds:../..`
    line per minor, then its counters, `oos:` in KiB)."""
    minor = minor_of(device)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = re.match(r"\s*(\d+):\s+(.*)$", line)
        if not head or int(head.group(1)) != minor:
            continue
        fields = dict(re.findall(r"\b(cs|ro|ds):(\S+)", head.group(2)))
        if "cs" not in fields:            # "N: cs:Unconfigured" has cs; anything else is not ours
            break
        role, peer_role = _pair(fields.get("ro"))
        disk, peer_disk = _pair(fields.get("ds"))
        oos = None
        for more in lines[i + 1:i + 4]:
            if re.match(r"\s*\d+:", more):
                break
            m = re.search(r"\boos:(\d+)", more)
            if m:
                oos = int(m.group(1)) * 1024
        cs = fields["cs"]
        state, problem = _judge(cs, disk, peer_disk)
        return PairState(device, state, cs, role, peer_role, disk, peer_disk, oos, problem)
    version = next((ln for ln in lines if ln.startswith("version:")), "")
    hint = (" (DRBD 9 does not list resources there: this gateway reads DRBD 8.4)"
            if re.match(r"version:\s*9\.", version) else ": is the resource up (drbdadm up)?")
    return PairState(device, UNKNOWN, problem=f"{device} (minor {minor}) is not in /proc/drbd{hint}")


def _pair(value: str | None) -> tuple[str | None, str | None]:
    if not value:
        return None, None
    own, _, peer = value.partition("/")
    return own, peer or None


def _judge(cs: str, disk: str | None, peer_disk: str | None) -> tuple[str, str | None]:
    if cs in _SYNCING:
        return SYNCING, (f"resynchronising ({cs}): the peer is not up to date yet, so acknowledged "
                         "writes are on this node's disk only until it is")
    if cs not in _CONNECTED:
        return DEGRADED, (f"peer not connected ({cs}): acknowledged writes are on this node's disk "
                          "only")
    if disk != "UpToDate" or peer_disk != "UpToDate":
        return DEGRADED, f"connected, but the disks are {disk}/{peer_disk}, not UpToDate/UpToDate"
    return IN_SYNC, None
