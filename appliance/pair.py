"""The gateway pair's replication state (issue 38): whether the cache volume's DRBD resource is
connected to the peer and both disks are up to date, read from /proc/drbd (DRBD 8.4, the module
Debian 12's kernel ships; drbd-utils 9 drives it through its 8.4 tools).

While the pair is in sync, a write the gateway acknowledges is on both nodes' disks (protocol C).
While it is degraded (the peer down or unreachable, or a disk not up to date), DRBD keeps serving
from this node alone: acknowledged writes are on this node's disk only until the peer is back and
resynced. `ckptgw status` shows it, the `ckptgw_pair_*` metrics carry it and the CkptgwPairDegraded
alert says so (docs/operations.md "HA pair").

DRBD's fence-peer handler (crm-fence-peer.sh) also leaves a mark in the cluster: a location
constraint drbd-fence-by-handler-<resource>-<clone> that forbids promoting the peer while it may be
out of date, lifted by crm-unfence-peer.sh after the peer's resync. One that outlives the resync
(the unfence handler could not reach the CIB) refuses the next failover although DRBD says in sync:
the pair is then not redundant either. read_fences() reads those constraints from the CIB
(`cibadmin`, which needs the haclient group) and judge_fences() weighs them against DRBD's state.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, replace
from typing import Callable

from .units import fmt_seconds

PROC_DRBD = "/proc/drbd"
CIBADMIN = ("cibadmin", "--query", "--scope", "constraints")
CIB_TIMEOUT_SECONDS = 5.0
# how long one reading of the CIB serves status and scrapes (a scrape every 15 s, a status now and
# then: at most one cibadmin per this many seconds, whoever asks)
CIB_CACHE_SECONDS = 5.0
FENCE_PREFIX = "drbd-fence-by-handler-"

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
    # DRBD's fence constraints in the CIB; None: not known (not read, or cibadmin failed:
    # fence_constraints_error says why)
    fence_constraints: tuple[FenceConstraint, ...] | None = None
    fence_constraints_error: str | None = None

    @property
    def degraded(self) -> bool:
        """Not redundant now: anything but in sync (a resync too: the peer lags)."""
        return self.state != IN_SYNC

    @property
    def peer_connected(self) -> bool:
        return self.connection in _CONNECTED or self.connection in _SYNCING

    def as_dict(self) -> dict:
        fences = self.fence_constraints
        return {**asdict(self), "degraded": self.degraded, "peer_connected": self.peer_connected,
                # lists, as JSON has them: a status read back compares equal
                "fence_constraints": None if fences is None else [c.as_dict() for c in fences]}


def read_pair(device: str, path: str = PROC_DRBD, fences: FenceReader | None = None) -> PairState:
    """The state of DRBD device `device` (/dev/drbdN) from /proc/drbd, and with `fences` the CIB's
    DRBD fence constraints weighed in (judge_fences)."""
    st = _read_proc(device, path)
    return judge_fences(st, fences.read()) if fences is not None else st


def _read_proc(device: str, path: str) -> PairState:
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


# ---- DRBD's fence constraints in the CIB ---------------------------------------------------------

@dataclass(frozen=True)
class FenceConstraint:
    """One drbd-fence-by-handler-* rsc_location: `rsc` (the promotable clone) is not promoted on any
    node but `only_on` (its rule: role Master, crm-fence-peer.sh's default, or Promoted, the newer
    name; score -INFINITY where #uname ne NODE: the node(s) that placed it, whose disk was UpToDate)."""
    id: str
    rsc: str | None = None
    role: str | None = None
    only_on: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"id": self.id, "rsc": self.rsc, "role": self.role, "only_on": list(self.only_on)}


@dataclass(frozen=True)
class Fences:
    """What the CIB holds: the fence constraints, or None and why they could not be read."""
    constraints: tuple[FenceConstraint, ...] | None
    error: str | None = None


def parse_fence_constraints(xml: str) -> tuple[FenceConstraint, ...]:
    """The drbd-fence-by-handler-* location constraints in the output of `cibadmin --query --scope
    constraints` (a <constraints> element; a whole <cib> works too). ValueError if it is not XML."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise ValueError(f"not XML ({e})") from None
    found = []
    for loc in root.iter("rsc_location"):
        cid = loc.get("id") or ""
        if not cid.startswith(FENCE_PREFIX):
            continue
        role, only_on = None, []
        for rule in loc.iter("rule"):
            role = role or rule.get("role")
            for expr in rule.iter("expression"):
                if expr.get("attribute") == "#uname" and expr.get("operation") == "ne" and expr.get("value"):
                    only_on.append(expr.get("value"))
        found.append(FenceConstraint(cid, loc.get("rsc"), role, tuple(only_on)))
    return tuple(found)


def _run_cibadmin(timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(CIBADMIN, capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def read_fences(run: Callable[[float], subprocess.CompletedProcess] = _run_cibadmin,
                timeout: float = CIB_TIMEOUT_SECONDS) -> Fences:
    """The fence constraints now in the CIB, or why they are unknown: cibadmin missing, not permitted
    (the gateway's user needs the haclient group), timed out, failed or printing no XML."""
    what = " ".join(CIBADMIN)
    try:
        done = run(timeout)
    except FileNotFoundError:
        return Fences(None, "cibadmin not found (is pacemaker-cli-utils installed?)")
    except PermissionError as e:
        return Fences(None, f"cannot run cibadmin ({e.strerror})")
    except subprocess.TimeoutExpired:
        return Fences(None, f"`{what}` did not answer within {fmt_seconds(timeout)}")
    except OSError as e:
        return Fences(None, f"cannot run cibadmin ({e.strerror or e})")
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()
        return Fences(None, f"`{what}` failed (exit {done.returncode}"
                            + (f": {said[-1].strip()[:200]}" if said else "")
                            + "): is the gateway's user in the haclient group, the cluster up?")
    try:
        return Fences(parse_fence_constraints(done.stdout))
    except ValueError as e:
        return Fences(None, f"`{what}` printed {e}")


class FenceReader:
    """read_fences(), at most once per `ttl` seconds: what status and every scrape show in between is
    the last reading. Thread-safe (status runs in a worker thread, scrapes in the metrics server's);
    callers arriving while cibadmin runs wait for its answer rather than run their own."""

    def __init__(self, run: Callable[[float], subprocess.CompletedProcess] = _run_cibadmin,
                 clock: Callable[[], float] = time.monotonic, ttl: float = CIB_CACHE_SECONDS,
                 timeout: float = CIB_TIMEOUT_SECONDS):
        self._run, self._clock, self._ttl, self._timeout = run, clock, ttl, timeout
        self._lock = threading.Lock()
        self._last: tuple[float, Fences] | None = None

    def read(self) -> Fences:
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last[0] >= self._ttl or now < self._last[0]:
                self._last = (now, read_fences(self._run, self._timeout))
            return self._last[1]


def judge_fences(st: PairState, fences: Fences) -> PairState:
    """`st` with the CIB's fence constraints. In sync with one left (its resync over, the unfence
    handler never lifted it), the pair is not redundant: a failover would be refused, so it is
    degraded and the problem says what to do. While degraded anyway (peer away, resync running) a
    constraint is expected and only listed; unknown constraints change nothing. Every DRBD fence
    constraint counts: a pair's cluster runs the one DRBD resource, the cache volume."""
    if fences.constraints is None:
        return replace(st, fence_constraints=None, fence_constraints_error=fences.error)
    st = replace(st, fence_constraints=fences.constraints, fence_constraints_error=None)
    if st.state != IN_SYNC or not fences.constraints:
        return st
    ids = [c.id for c in fences.constraints]
    only = sorted({n for c in fences.constraints for n in c.only_on})
    where = f" (promotion only on {', '.join(only)})" if only else ""
    many = len(ids) > 1
    return replace(st, state=DEGRADED, problem=(
        f"DRBD fence constraint{'s' if many else ''} {', '.join(ids)} {'are' if many else 'is'} left "
        f"after the resync{where}: the peer cannot be promoted, a failover would be refused; "
        f"`crm configure delete {' '.join(ids)}` once the peer is UpToDate (it is now), or rerun the "
        "playbook"))
