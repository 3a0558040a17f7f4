"""Issue 38: Pacemaker fails the gateway over from a dead node, and no acknowledged save is lost.

The Ansible role deploys the pair (deploy.py: ansible/site.yml in pair mode on both nodes at once):
DRBD protocol C with fencing resource-and-stonith, Corosync/Pacemaker with SBD, the cache volume, the
floating IP and the ckptgw unit, ordered and colocated, active on gw-a (stack.py reads them). A second
run of the playbook changes nothing (changed=0 on both nodes). A stock kernel NFS client (hard mount of the floating IP) runs the
checkpoint save recipe in a loop. gw-a's qemu is killed (a power cut) in the middle of the saves;
then on gw-b, with nothing done by hand:
  - gw-a is fenced through SBD, gw-b promoted, the volume mounted, the IP moved, ckptgw READY;
  - the client's next save returns through the same mount (never remounted);
  - every save acknowledged before or after the kill is on gw-b's gateway byte for byte (read
    after a remount, so from the server, not the client's page cache);
  - `ckptgw check` is clean, and ckptgw ran on one node at a time (never on the passive one).
The failover timeline (kill -> corosync notices -> fenced -> promoted -> mounted -> IP -> READY ->
grace ended -> first acknowledged save) is read from gw-b's journal and the client's own log, on
gw-b's clock, and printed in the run's "gateway pair report".

The client runs on gw-b, the surviving node: a third VM would be the issue's setup, but three
emulated guests on this 2-core machine starve the cluster's timers. The client's traffic goes to
the floating IP over the segment before the failover and to the same address, then local, after.

Timers are stretched for emulation (cluster.py): token 10 s, SBD msgwait 40 s; the timeline says
how much of the failover they are. CKPTGW_HA_SEED picks the kill point (how many saves, then a
fraction of one save's time); CI runs one failover with the default seed, CKPTGW_LONG=1 several.
"""
from __future__ import annotations

import os
import random
import time

import pytest

import cluster
import deploy
import drbd
import stack

pytestmark = [pytest.mark.ha, pytest.mark.slow]

MNT = "/mnt/ckpt"
RUN_DIR = f"{MNT}/run"
SHARD = 256 << 10
SEED = int(os.environ.get("CKPTGW_HA_SEED", "38"))
# CKPTGW_LONG=1: CKPTGW_HA_FAILOVERS failovers (default 5), seeds SEED, SEED+1, ..., each on a fresh pair
# (~10 min each here); the run's report closes with each step's median and max.
LONG = os.environ.get("CKPTGW_LONG") == "1"
SEEDS = [SEED + i for i in range(int(os.environ.get("CKPTGW_HA_FAILOVERS", "5")) if LONG else 1)]


@pytest.mark.parametrize("seed", SEEDS)
def test_gateway_fails_over_to_the_survivor_with_every_acknowledged_save(pair, ansible_bin, ckptgw_wheel, report,
                                                                        timelines, tmp_path, seed):
    rng = random.Random(seed)
    t = time.monotonic()
    pair.start()
    report(f"boot (both at once, to SSH): gw-a {pair.boot_seconds['gw-a']:.0f}s, gw-b {pair.boot_seconds['gw-b']:.0f}s")

    inventory = deploy.inventory(tmp_path / "hosts.yml", pair, ckptgw_wheel)
    for label in ("first run (the pair from scratch)", "second run (idempotence)"):
        run = deploy.deploy(ansible_bin, inventory)
        report(f"ansible-playbook site.yml, pair mode, {label}: {run.seconds:.0f}s, exit {run.returncode}; "
               + "; ".join(run.recap_lines))
        assert run.returncode == 0, run.tail()
        if label.startswith("first"):
            assert all(run.recap(node)["changed"] > 0 for node in pair.vms), run.tail()
            # The initial sync (gw-a's new file system to gw-b) runs in the background from here;
            # the second run goes on beside it, and Pacemaker starts the stack meanwhile.
            t_sync = time.monotonic()
        else:
            assert all(run.recap(node)["changed"] == 0 for node in pair.vms), run.tail()
    waited = drbd.wait_state(pair, "gw-a", 900, cs="Connected", ds="UpToDate/UpToDate")
    report(f"DRBD initial sync of {pair.data_size} in sync {time.monotonic() - t_sync:.0f}s after the first run "
           f"({waited:.0f}s waited after the second)")
    assert "disabled" in pair.out("gw-a", "systemctl is-enabled ckptgw.service", check=False)

    t0 = time.monotonic()
    _, status = cluster.wait_mon(pair, "gw-a", 600, "the stack active on gw-a", lambda s: stack.stack_on(s, "gw-a"))
    assert cluster.online(status) == {"gw-a", "gw-b"} and cluster.fence_device_started(status), status
    report(f"the stack active on gw-a: {time.monotonic() - t0:.0f}s after the sync")
    assert stack.unit_state(pair, "gw-a") == "active"
    assert stack.unit_state(pair, "gw-b") == "inactive", "ckptgw runs on the passive node"

    stack.mount_client(pair, "gw-b", MNT)
    stack.start_writer(pair, "gw-b", RUN_DIR, SHARD)
    before = rng.randint(3, 8)
    pair.wait_for("gw-b", f"test $(wc -l < /root/acks.log) -ge {before}", 600, f"{before} saves acknowledged")
    offset, err = stack.clock_offset(pair, "gw-b")
    rows = stack.acks(pair, "gw-b")
    per_save = (rows[-1][1] - rows[0][1]) / max(1, len(rows) - 1)
    time.sleep(rng.random() * per_save)          # the seeded kill point inside a save, not a wait for state
    assert stack.unit_state(pair, "gw-b") == "inactive"
    pair.power_cut("gw-a")
    t_kill = time.time()
    kill_b = t_kill + offset                     # the kill on gw-b's clock
    acked_before = len(stack.acks(pair, "gw-b"))

    took, status = cluster.wait_mon(pair, "gw-b", 900, "the stack active on gw-b after gw-a's fencing",
                                    lambda s: "OFFLINE: [ gw-a ]" in s and stack.stack_on(s, "gw-b"))
    assert cluster.online(status) == {"gw-b"}, status
    assert stack.unit_state(pair, "gw-b") == "active"
    assert stack.FLOATING_IP in pair.out("gw-b", "ip -4 -o addr show dev eth1")
    slots = pair.out("gw-b", f"sbd -d {cluster.SBD_DISK} list")
    assert any(line.split()[1:3] == ["gw-a", "reset"] for line in slots.splitlines()), slots

    # The client's next save, through the mount it had all along.
    pair.wait_for("gw-b", f"awk '$2 > {kill_b:.3f} {{ found = 1 }} END {{ exit !found }}' /root/acks.log", 600,
                  "a save acknowledged after the failover")
    stack.stop_writer(pair, "gw-b", 600)
    rows = stack.acks(pair, "gw-b")
    failed = stack.failed_saves(pair, "gw-b")
    first_after = next(r for r in rows if r[1] > kill_b)
    marks = stack.journal_marks(pair, "gw-b", kill_b)

    # Every acknowledged save, read back from the server (a remount drops the client's cache).
    pair.ssh("gw-b", f"umount {MNT}", timeout=300)
    stack.mount_client(pair, "gw-b", MNT)
    sums = dict(line.split()[::-1] for line in
                pair.out("gw-b", f"cd {RUN_DIR} && sha256sum shard-*", timeout=600).splitlines())
    lost = [i for i, _, h in rows if f"shard-{i:05d}" not in sums]
    torn = [i for i, _, h in rows if f"shard-{i:05d}" in sums and sums[f"shard-{i:05d}"] != h]
    assert not lost and not torn, f"acknowledged saves lost {lost}, torn {torn} (of {len(rows)})"
    out = stack.check(pair, "gw-b")
    assert "store is consistent" in out, out

    timeline = {"kill": 0.0, **{k: v - kill_b for k, v in sorted(marks.items(), key=lambda kv: kv[1])},
                "first acknowledged save": first_after[1] - kill_b}
    timelines.append(timeline)
    report(f"failover (seed {seed}; token {cluster.TOKEN_MS // 1000} s, SBD msgwait {cluster.SBD_MSGWAIT_S} s, "
           f"qemu TCG; times on gw-b's clock, kill placed to +-{err:.1f}s): "
           + " -> ".join(f"{k} {v:.1f}s" for k, v in timeline.items()))
    missing = [name for name, _ in stack.JOURNAL_MARKS if name not in marks]
    if missing:
        report(f"  not found in gw-b's journal: {', '.join(missing)}")
    report(f"  saves of {SHARD >> 10} KiB acknowledged: {acked_before} before the kill, {len(rows)} in all, "
           f"every one byte for byte on gw-b; lost 0, torn 0; ckptgw check clean; crm_mon saw the stack on gw-b "
           f"after {took:.0f}s of polling")
    # A save that failed was never acknowledged, so nothing is owed for it; but each is an error a
    # client saw (e.g. a RENAME the old server had done, re-sent to the new one in a new session:
    # ENOENT), and is reported.
    for line in failed:
        report(f"  save failed (not acknowledged): {line}")
    report(f"test total {time.monotonic() - t:.0f}s")
