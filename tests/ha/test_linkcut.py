"""Issue 38's proof 2: the replication link cut while both nodes run fences exactly one side.

The pair as the role deploys it (scenario.bring_up), the stack active on gw-a, and a stock kernel
client on gw-a saving through the floating IP. Then gw-b's link on the pair's segment goes down
(`ip link set eth1 down` in the guest: corosync and DRBD lose each other, the SBD disk stays). Each
node now wants to fence the other; the role's priority-fencing-delay holds back the fencing of the
node running the group, so gw-a shoots gw-b first (SBD's poison pill; gw-b's watchdog resets it, and
the reboot brings its link back). What must hold:
  - exactly one side is fenced: gw-b reboots (its boot id changes), gw-a never does, no fencing
    of gw-a in its journal;
  - never two servers or two uploaders: ckptgw never runs on gw-b (polled until it is gone), and
    the one on gw-a is the same process before and after (its MainPID);
  - the client's saves go on through the same mount (DRBD freezes I/O on gw-a only until gw-b is
    fenced), and the next save after the cut succeeds;
  - after gw-b returns, it rejoins, DRBD resyncs what changed and the pair is in sync again;
  - lost 0, torn 0 of the acknowledged saves, `ckptgw check` clean, and after the drain the bucket
    (outside the pair) holds what the namespace holds.
A VM run of ~20 min here: not in CI (which runs one failover); CKPTGW_HA_LINKCUT=1 or the long mode.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

import cluster
import drbd
import scenario
import stack

pytestmark = [pytest.mark.ha, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("CKPTGW_LONG") != "1" and os.environ.get("CKPTGW_HA_LINKCUT") != "1",
                                 reason="a link cut is a ~20 min VM run: CKPTGW_HA_LINKCUT=1 or CKPTGW_LONG=1")]

MNT, RUN_DIR, SHARD = scenario.MNT, scenario.RUN_DIR, scenario.SHARD
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def test_a_cut_replication_link_fences_only_the_passive_node(pair, s3, ansible_bin, ckptgw_wheel, report, tmp_path):
    t = time.monotonic()
    scenario.bring_up(pair, ansible_bin, ckptgw_wheel, report, tmp_path, idempotence=False)
    boot = {node: pair.out(node, BOOT_ID).strip() for node in ("gw-a", "gw-b")}
    server_pid = pair.out("gw-a", "systemctl show -p MainPID --value ckptgw.service").strip()
    assert server_pid not in ("", "0")

    stack.mount_client(pair, "gw-a", MNT)
    stack.start_writer(pair, "gw-a", RUN_DIR, SHARD)
    pair.wait_for("gw-a", "test $(wc -l < /root/acks.log) -ge 5", 600, "5 saves acknowledged")
    cut_a = float(pair.out("gw-a", "date +%s.%N"))
    pair.ssh("gw-b", "ip link set eth1 down")
    acked_before = len(stack.acks(pair, "gw-a"))

    # Until gw-b is reset, ckptgw must never start there (it would be a second server and a
    # second uploader on the same bucket); poll its unit while it is up.
    polls = 0
    t_cut = time.monotonic()
    while time.monotonic() - t_cut < 900:
        try:
            proc = pair.ssh("gw-b", f"{BOOT_ID}; systemctl is-active ckptgw.service", check=False, timeout=60)
        except subprocess.TimeoutExpired:
            break                                       # reset under an open SSH session
        lines = proc.stdout.decode().split()
        if proc.returncode == 255 or (lines and lines[0] != boot["gw-b"]):
            break                                       # down, or already up again: it was reset
        assert lines[1:] == ["inactive"], f"ckptgw on gw-b while cut off: {lines[1:]}"
        polls += 1
        time.sleep(2)
    else:
        raise AssertionError("gw-b was not fenced within 900 s of the cut")
    pair.wait_for("gw-b", f"test \"$({BOOT_ID})\" != {boot['gw-b']}", 900, "gw-b back after its fencing")
    assert pair.out("gw-a", BOOT_ID).strip() == boot["gw-a"], "gw-a was fenced too"

    took, status = cluster.wait_mon(pair, "gw-a", 900, "gw-b online again, the stack still on gw-a",
                                    lambda s: cluster.online(s) == {"gw-a", "gw-b"} and stack.stack_on(s, "gw-a"))
    waited = drbd.wait_state(pair, "gw-a", 1800, cs="Connected", ds="UpToDate/UpToDate")
    unfenced = cluster.wait_unfenced(pair, "gw-a", 120)     # or gw-b could never take over again
    assert stack.unit_state(pair, "gw-b") == "inactive", "ckptgw runs on the passive node"
    if pair.out("gw-a", "systemctl show -p MainPID --value ckptgw.service").strip() != server_pid:
        lines = pair.out("gw-a", f"journalctl --no-pager -o short-unix --since @{int(cut_a) - 1} | "
                                 "grep -E 'ckptgw|[Ww]atchdog|gateway|cache-fs|gw-ip|drbd' | tail -60", check=False)
        raise AssertionError(f"the gateway on gw-a was restarted; its journal since the cut:\n{lines}")

    stack.wait_acknowledged_after(pair, "gw-a", cut_a, 600, "a save acknowledged after the cut")
    stack.stop_writer(pair, "gw-a", 600)
    rows = stack.acks(pair, "gw-a")
    first_after = next(r for r in rows if r[1] > cut_a)
    marks = stack.journal_marks(pair, "gw-a", cut_a, stack.LINKCUT_MARKS)
    assert "gw-a fenced" not in marks, marks
    assert "gw-b fenced" in marks, f"no fencing of gw-b in gw-a's journal: {marks}"
    resync = stack.journal_matches(pair, "gw-a", cut_a, stack.RESYNC_MARKS)
    drained, objects, versions, repeated = scenario.every_acknowledged_save_is_there(pair, "gw-a", "gw-a", s3, rows)

    timeline = {"cut": 0.0, **{k: v - cut_a for k, v in sorted(marks.items(), key=lambda kv: kv[1])},
                "first acknowledged save": first_after[1] - cut_a}
    report(f"link cut (gw-b's eth1 down; token {cluster.TOKEN_MS // 1000} s, priority-fencing-delay "
           f"{cluster.PRIORITY_FENCING_DELAY_S} s, SBD msgwait {cluster.SBD_MSGWAIT_S} s, qemu TCG; s after the cut, "
           "gw-a's clock): " + " -> ".join(f"{k} {v:.1f}s" for k, v in sorted(timeline.items(), key=lambda kv: kv[1])))
    report(f"  exactly one side fenced: gw-b reset (boot id changed), gw-a not (same boot id, no fencing of it in "
           f"its journal); ckptgw never ran on gw-b ({polls} polls while it was cut off), the one on gw-a the same "
           f"process throughout (MainPID {server_pid})")
    figure = stack.resync_figure(resync)
    if figure:
        report(f"  gw-b back in the cluster {took:.0f}s into polling; DRBD resync of what changed while it was "
               f"out: {figure[0]:.1f} MiB in {figure[1]} s; in sync {waited:.0f}s after that")
    else:
        report(f"  gw-b back in the cluster {took:.0f}s into polling; DRBD in sync {waited:.0f}s after that")
    report(f"  DRBD's fence constraint on gw-b lifted {unfenced:.0f}s after the sync")
    # the stall: DRBD freezes the volume's I/O from noticing the lost peer until Pacemaker has it fenced
    times = [r[1] for r in rows]
    gap, at = max((b - a, a) for a, b in zip(times, times[1:]) if b > cut_a)
    report(f"  saves of {SHARD >> 10} KiB acknowledged: {acked_before} before the cut, {len(rows)} in all, every one "
           f"byte for byte on gw-a; lost 0, torn 0; ckptgw check clean; the longest wait between two acknowledged "
           f"saves {gap:.1f}s, from {at - cut_a:.1f}s after the cut")
    scenario.report_s3(report, drained, objects, versions, repeated)
    for line in stack.failed_saves(pair, "gw-a"):
        report(f"  save failed (not acknowledged): {line}")
    report(f"test total {time.monotonic() - t:.0f}s")
