"""The pieces the gateway-pair tests share (issue 38): the pair deployed by the role with the stack
active on gw-a, and the checks every scenario ends with (each acknowledged save byte for byte on
the gateway, `ckptgw check` clean, the bucket outside the pair holding what the namespace holds)."""
from __future__ import annotations

import hashlib
import os
import time

import cluster
import deploy
import drbd
import stack

MNT = "/mnt/ckpt"
RUN_DIR = f"{MNT}/run"
SHARD = 256 << 10


def bring_up(pair, ansible_bin, ckptgw_wheel, report, tmp_path, idempotence: bool = True) -> None:
    """Boot both nodes, deploy the pair with the role (then, with `idempotence`, again: nothing
    changes), wait for DRBD's initial sync and for the stack active on gw-a (never on gw-b)."""
    pair.start()
    report(f"boot (both at once, to SSH): gw-a {pair.boot_seconds['gw-a']:.0f}s, gw-b {pair.boot_seconds['gw-b']:.0f}s")

    inventory = deploy.inventory(tmp_path / "hosts.yml", pair, ckptgw_wheel)
    labels = ("first run (the pair from scratch)", "second run (idempotence)")
    for label in labels[:2 if idempotence else 1]:
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
           f"({waited:.0f}s waited after the last)")
    assert "disabled" in pair.out("gw-a", "systemctl is-enabled ckptgw.service", check=False)

    t0 = time.monotonic()
    _, status = cluster.wait_mon(pair, "gw-a", 600, "the stack active on gw-a", lambda s: stack.stack_on(s, "gw-a"))
    assert cluster.online(status) == {"gw-a", "gw-b"} and cluster.fence_device_started(status), status
    report(f"the stack active on gw-a: {time.monotonic() - t0:.0f}s after the sync")
    assert stack.unit_state(pair, "gw-a") == "active"
    assert stack.unit_state(pair, "gw-b") == "inactive", "ckptgw runs on the passive node"


def every_acknowledged_save_is_there(pair, client: str, server: str, s3, rows) -> tuple:
    """Every acknowledged save read back on `client` from the gateway (active on `server`),
    `ckptgw check` clean on `server`, and after the drain the bucket holding what the namespace
    holds. The client's save loop must be stopped. Returns (drain seconds, the objects, their
    versions, keys PUT more than once)."""
    # A remount drops the client's cache, so the bytes come from the server; 4.2 for `ckptgw wait`.
    pair.ssh(client, f"umount {MNT}", timeout=300)
    stack.mount_client(pair, client, MNT, vers="4.2")
    # Its time grows with the saves: past the cache volume (~425 MiB, ~1,600 shards) a read in name
    # order misses on nearly every file and hydrates it from S3, ~6 shards/s here (the failback's ~3,400
    # saves ran out of a flat 600 s on 2026-11-29, still reading); 0.5 s a shard is ~3x that.
    sums = dict(line.split()[::-1] for line in
                pair.out(client, f"cd {RUN_DIR} && sha256sum shard-*",
                         timeout=max(600, 0.5 * len(rows))).splitlines())
    lost = [i for i, _, h in rows if f"shard-{i:05d}" not in sums]
    torn = [i for i, _, h in rows if f"shard-{i:05d}" in sums and sums[f"shard-{i:05d}"] != h]
    assert not lost and not torn, f"acknowledged saves lost {lost}, torn {torn} (of {len(rows)})"
    out = stack.check(pair, server)
    assert "store is consistent" in out, out

    # After the drain, S3 (outside the pair) holds what the namespace holds, each key written
    # once: an upload or a move's copy the dead node had S3 apply but never recorded is adopted
    # by the survivor, not sent again (exactly once, issue 38: uploader/worker.py `_adopt`,
    # `_copy`), so every key has one version.
    t_drain = time.monotonic()
    stack.wait_uploaded(pair, client, RUN_DIR, 900)
    drained = time.monotonic() - t_drain
    prefix = os.path.relpath(RUN_DIR, MNT) + "/"            # key = export-relative path (no bucket prefix)
    files = {prefix + name for name in pair.out(client, f"ls -A {RUN_DIR}").split()}
    versions, current = stack.bucket_objects(s3.client, deploy.S3_BUCKET, prefix)
    objects = {key for key in current if not key.endswith("/")}          # not the directory marker
    assert objects == files, (f"in S3, not in the namespace: {sorted(objects - files)}; "
                              f"in the namespace, not in S3: {sorted(files - objects)}")
    wrong = [i for i, _, h in rows if hashlib.sha256(s3.client.get_object(
        Bucket=deploy.S3_BUCKET, Key=f"{prefix}shard-{i:05d}")["Body"].read()).hexdigest() != h]
    assert not wrong, f"acknowledged shards with other bytes in S3: {wrong}"
    differing = {key: [v["ETag"] for v in vs] for key, vs in versions.items() if len({v["ETag"] for v in vs}) > 1}
    assert not differing, f"keys written with different contents: {differing}"
    repeated = sorted(key for key in objects if len(versions[key]) > 1)
    assert not repeated, (f"keys written more than once (same bytes, not exactly once): "
                          f"{ {key: [(v['VersionId'], v['ETag']) for v in versions[key]] for key in repeated} }")
    return drained, objects, versions, repeated


def report_s3(report, drained, objects, versions, repeated) -> None:
    report(f"  S3 outside the pair after the drain (`ckptgw wait`, {drained:.0f}s after the read-back): "
           f"{len(objects)} objects = the files of the namespace, each acknowledged shard's bytes; "
           f"{sum(len(versions[k]) for k in objects)} versions, keys PUT more than once (same bytes): "
           f"{', '.join(repeated) or 'none'}")
