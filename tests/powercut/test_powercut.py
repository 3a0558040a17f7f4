"""Power cut: the gateway in a Debian VM loses power (qemu SIGKILL) in the middle of checkpoint saves.

Setup (host): the gateway's cache lives on a raw data disk (`data.raw`, /dev/vdb in the guest),
made with `mkfs.ext4 -d` from a tree holding this checkout's ckptgw wheel installed with the
guest image's wheelhouse (`pip install --target`, same CPython 3.11 and platform as the guest) and
the guest workload script. The data disk is the only state carried from boot to boot; the root
disk is a fresh qcow2 overlay on the cached image every boot (a killed qemu may damage a qcow2
file itself, which is no part of a power cut; see guestvm.GuestVM.power_cut).

Each cycle: mount /dev/vdb, start `ckptgw serve` (try-out mode; crash recovery runs at start),
mount it with the guest's kernel NFS client (vers=4.1 on loopback), run `guest_workload.py save`
over SSH and read its `ACK` lines live: a line is sent only after the shard's fsync, rename and
directory fsync returned, so the host's list is exactly what the client was told is durable.
After a seeded random number of ACKs and a seeded random delay the host SIGKILLs qemu, boots the
same disks again and checks:
  - the store opens (`ckptgw serve` reaches READY under systemd, after recovery);
  - `ckptgw check` (the store's consistency check) exits 0;
  - every acknowledged file is there byte for byte (sha256 read back through NFS), cumulatively
    over all earlier cuts (lost = acknowledged but missing or different);
  - no file under a final name holds anything but its complete deterministic content (torn).
CI: 1 cut. CKPTGW_LONG=1: 50 cuts (CKPTGW_POWERCUT_CUTS overrides). The seed is printed;
CKPTGW_POWERCUT_SEED=N replays the same kill schedule.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from guestimage import DEPLOY_USER, GUEST_WHEELHOUSE
from guestvm import GuestError, GuestVM

from . import guest_workload
from .conftest import report

HERE = Path(__file__).resolve().parent

# Found by this test (seed 69028, first cut): with the index opened sync=False/metasync=False, the
# kernel writes LMDB's pages back in any order, and after a power cut the store refuses to open
# ("LMDB without a ckptgw meta record (unknown format)"). Expected to fail while the index is
# opened that way; the fix (sync=True) turns the condition off and the test runs for real.


def _lmdb_opened_without_sync() -> bool:
    """Whether the store opens its LMDB index with sync off (asked of a throwaway index)."""
    from cache.index import Index
    with tempfile.TemporaryDirectory() as d:
        ix = Index(d)
        try:
            return not ix.env.flags()["sync"]
        finally:
            ix.close()


LMDB_NOSYNC = _lmdb_opened_without_sync()

LONG = os.environ.get("CKPTGW_LONG") == "1"
CUTS = int(os.environ.get("CKPTGW_POWERCUT_CUTS", "50" if LONG else "1"))
SEED = int(os.environ.get("CKPTGW_POWERCUT_SEED", str(int(time.time()) % 100000)))
SHARDS = 4
DATA_DISK_SIZE = "3G"
SOCK = "/run/ckptgw-powercut.sock"
# The guest never writes bytecode to the data disk (a torn .pyc is no part of the test): it was
# compiled on the host by pip, with the same CPython 3.11.
GUEST_ENV = "PYTHONPATH=/data/site PYTHONDONTWRITEBYTECODE=1"
CKPTGW = f"sudo env {GUEST_ENV} python3 -m appliance.cli"
MOUNT = "/mnt/ckpt"
ACK_WAIT = 900            # seconds for the ACK the cut waits for (TCG on a loaded host is slow)
FINAL = re.compile(r"^step_(\d{6})/shard_(\d+)$")

pytestmark = [pytest.mark.ansible, pytest.mark.slow, pytest.mark.powercut,
              pytest.mark.timeout(1200 + CUTS * 900),      # a cut cycle under TCG on a loaded host: 4-8 min
              pytest.mark.xfail(LMDB_NOSYNC, strict=True, reason="issue 13: LMDB opened sync=False/metasync=False: "
                                "a power cut can leave the index unopenable (meta record gone)")]


@dataclass
class Tally:
    seed: int = SEED
    cuts: int = 0
    boots: list[float] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)
    acked: dict[str, tuple[int, str]] = field(default_factory=dict)
    checked: int = 0                  # acknowledged files verified (cumulative over every reboot)
    lost: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    check_failures: list[str] = field(default_factory=list)
    open_failures: list[str] = field(default_factory=list)     # the store did not open after a cut
    kills: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"power cut: seed {self.seed}, cuts {self.cuts}, boots {len(self.boots)} "
                f"(to SSH {min(self.boots, default=0):.0f}-{max(self.boots, default=0):.0f}s), gateway start (recovery) "
                f"{min(self.recoveries, default=0):.0f}-{max(self.recoveries, default=0):.0f}s, "
                f"acknowledged files {len(self.acked)}, acknowledged files checked {self.checked}, "
                f"lost {len(self.lost)}, torn {len(self.torn)}, store open failures {len(self.open_failures)}, "
                f"store check failures {len(self.check_failures)}")


def build_data_disk(image, wheel: Path, work: Path) -> Path:
    """The raw data disk: ckptgw with its try-out extra (the embedded S3) and dependencies under
    /site, the workload script, an empty cache/."""
    tree = work / "data-tree"
    wheelhouse = work / "wheelhouse"
    subprocess.run(["debugfs", "-R", f"rdump {GUEST_WHEELHOUSE} {work}", str(image.disk)], check=True,
                   capture_output=True)
    (work / Path(GUEST_WHEELHOUSE).name).rename(wheelhouse)
    (tree / "cache").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                           "--find-links", str(wheelhouse), "--target", str(tree / "site"), f"{wheel}[tryout]"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"pip install --target failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    shutil.copy2(HERE / "guest_workload.py", tree / "guest_workload.py")
    disk = work / "data.raw"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "ckptgw-data", "-d", str(tree), str(disk), DATA_DISK_SIZE],
                   check=True, capture_output=True)
    shutil.rmtree(tree)
    shutil.rmtree(wheelhouse)
    return disk


def journal(vm: GuestVM) -> str:
    return vm.ssh("sudo journalctl --no-pager -o cat -u ckptgw-powercut -n 80", check=False, timeout=120).stdout


def boot_and_serve(image, disk: Path, tally: Tally) -> GuestVM:
    """Boot on the data disk, start the gateway (recovery), mount it. Returns the running VM."""
    vm = GuestVM(image, smp=2, mem_mib=2048, cache_image=disk)
    try:
        vm.start(timeout=900)
        tally.boots.append(vm.boot_seconds)
        t0 = time.monotonic()
        # Type=notify: systemd-run returns once the daemon said READY=1, i.e. after the store opened.
        start = vm.ssh(
            "set -e; sudo mkdir -p /data; sudo mount /dev/vdb /data;"
            " sudo systemd-run --quiet --unit=ckptgw-powercut -p Type=notify -p TimeoutStartSec=900"
            f" -p 'Environment={GUEST_ENV}' /usr/bin/python3 -m appliance.cli serve"
            " --cache-dir /data/cache --capacity 1G --listen 127.0.0.1:2049 --admin-socket " + SOCK +
            " --export /checkpoints:127.0.0.0/8:rw:none", check=False, timeout=1000)
        if start.returncode != 0:
            raise GuestError(f"the gateway did not start (exit {start.returncode}): {start.stdout}{start.stderr}\n"
                             f"--- journal\n{journal(vm)}")
        tally.recoveries.append(time.monotonic() - t0)
        vm.ssh(f"sudo mkdir -p {MOUNT}; sudo mount -t nfs4 -o vers=4.1,port=2049 127.0.0.1:/checkpoints {MOUNT}",
               timeout=300)
        return vm
    except BaseException:
        vm.stop()
        raise


def save_until_cut(vm: GuestVM, rng: random.Random, cycle: int, tally: Tally) -> None:
    """Checkpoint saves in the guest; SIGKILL qemu after a seeded number of ACKs plus a seeded delay."""
    want = rng.randint(1, 3 * SHARDS)
    delay = rng.uniform(0.0, 2.0)
    cond = threading.Condition()
    seen = {"acks": 0, "done": False}
    cmd = ["ssh", *vm.ssh_options(), f"{DEPLOY_USER}@127.0.0.1",
           f"sudo python3 /data/guest_workload.py save --mnt {MOUNT} --seed {SEED} "
           f"--first-step {cycle * 1000} --steps 500 --shards {SHARDS}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read() -> None:
        for line in proc.stdout:
            parts = line.split()
            with cond:
                if parts[:1] == ["ACK"] and len(parts) == 4:
                    tally.acked[parts[1]] = (int(parts[2]), parts[3])
                    seen["acks"] += 1
                elif parts[:1] == ["DONE"]:
                    seen["done"] = True
                cond.notify_all()
        with cond:
            seen["done"] = True
            cond.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with cond:
        cond.wait_for(lambda: seen["acks"] >= want or seen["done"], timeout=ACK_WAIT)
        got = seen["acks"]
    if got < want:
        err = proc.stderr.read() if proc.poll() is not None else ""
        vm.power_cut()
        raise AssertionError(f"cycle {cycle}: only {got} of {want} ACKs before the cut was due; workload: {err}")
    time.sleep(delay)
    vm.power_cut()
    tally.cuts += 1
    proc.wait(timeout=60)
    reader.join(timeout=60)
    tally.kills.append(f"after ACK {want} + {delay:.2f}s ({seen['acks']} ACKs read by then)")


def verify(vm: GuestVM, tally: Tally, label: str) -> None:
    """Store check, then every acknowledged file byte for byte and no torn file under a final name."""
    check = vm.ssh(f"{CKPTGW} --socket {SOCK} check", check=False, timeout=900)
    if check.returncode != 0:
        tally.check_failures.append(f"{label}: exit {check.returncode}: {check.stdout[-1500:]}{check.stderr[-1500:]}")
    scan = vm.ssh(f"sudo python3 /data/guest_workload.py scan --mnt {MOUNT}", timeout=1800)
    files = {}
    for line in scan.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["FILE"]:
            files[parts[1]] = (int(parts[2]), parts[3])
    assert scan.stdout.rstrip().endswith(f"END {len(files)}"), scan.stdout[-500:]
    for path, want in sorted(tally.acked.items()):
        tally.checked += 1
        if files.get(path) != want:
            tally.lost.append(f"{label}: {path} acknowledged {want}, found {files.get(path)}")
    for path, got in sorted(files.items()):
        if path.endswith(".tmp"):
            continue                 # an unacknowledged temp file may hold any prefix of its data
        m = FINAL.match(path)
        if not m:
            tally.torn.append(f"{label}: unexpected file {path} {got}")
            continue
        data = guest_workload.content(SEED, int(m.group(1)), int(m.group(2)))
        if got != (len(data), guest_workload.hashlib.sha256(data).hexdigest()):
            tally.torn.append(f"{label}: {path} size {got[0]} (complete: {len(data)}) has other bytes")


def test_power_cuts_during_checkpoint_saves(guest_image, ckptgw_wheel, tmp_path):
    tally = Tally()
    rng = random.Random(SEED)
    disk = build_data_disk(guest_image, ckptgw_wheel, tmp_path)
    vm = boot_and_serve(guest_image, disk, tally)
    try:
        for cycle in range(1, CUTS + 1):
            save_until_cut(vm, rng, cycle, tally)
            vm.stop()
            try:
                vm = boot_and_serve(guest_image, disk, tally)
            except GuestError as e:
                tally.open_failures.append(f"after cut {cycle}: {e}")
                break
            verify(vm, tally, f"after cut {cycle}")
            report(f"  cut {cycle}: {tally.kills[-1]}; boot {tally.boots[-1]:.0f}s, gateway up "
                   f"{tally.recoveries[-1]:.0f}s; acknowledged so far {len(tally.acked)}, "
                   f"lost {len(tally.lost)}, torn {len(tally.torn)}, check failures {len(tally.check_failures)}")
            if tally.lost or tally.torn or tally.check_failures:
                break               # keep the evidence readable: the first failing cut
    finally:
        report(tally.summary())
        vm.stop()
    problems = tally.open_failures + tally.check_failures + tally.lost[:20] + tally.torn[:20]
    assert not problems, f"{tally.summary()}\n" + "\n".join(problems)
    assert tally.cuts == CUTS and tally.checked >= len(tally.acked) > 0, tally.summary()
    disk.unlink()
