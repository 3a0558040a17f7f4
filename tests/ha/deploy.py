"""The gateway pair deployed by the Ansible role (issue 38): ansible/site.yml in pair mode against
both nodes of a Pair at once, over their forwarded SSH ports, as an operator deploys a real pair.

The role does what the harness once did by hand (drbd.py, cluster.py, the CIB of the stack): ckptgw's
wheel of this checkout into the venv (offline, from the image's wheelhouse), the config, the unit
(installed, never enabled), the DRBD resource with its metadata, the first file system on gw-a, the
SBD header on the shared disk, corosync.conf, and the Pacemaker resources loaded through gw-a.
What stays test code: the inventory below (the test's choices of addresses and disks, the S3
endpoint: moto on the host, outside the pair, reached through pairvm's guestfwd), each node's
watchdog device (the i6300esb, found by its identity: q35 also has an iTCO watchdog, probed in either
order) and the timers stretched for emulation (token 10 s, SBD watchdog 20 s / msgwait 40 s,
stonith-timeout 90 s).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ansible"))   # playbook, guestimage
import cluster  # noqa: E402
import drbd  # noqa: E402
import stack  # noqa: E402
from guestimage import DEPLOY_USER, GUEST_WHEELHOUSE  # noqa: E402
from pairvm import NODES, S3_ADDRESS, S3_GUEST_PORT, Pair, address  # noqa: E402
from playbook import PlaybookRun, run_playbook  # noqa: E402

S3_BUCKET = "ckptgw"


def group_vars(pair: Pair, wheel: Path) -> dict:
    return {
        # ckptgw: this checkout's wheel, pinned to the image's wheelhouse (the guests have no index)
        "ckptgw_wheel": str(wheel),
        "ckptgw_constraints": str(pair.image.constraints),
        "ckptgw_wheelhouse": GUEST_WHEELHOUSE,
        # S3 outside the pair (the test's moto on the host, through each node's guestfwd): the
        # bucket outlives either node, and the test reads it after the failover
        "ckptgw_s3_endpoint": f"http://{S3_ADDRESS}:{S3_GUEST_PORT}",
        "ckptgw_s3_bucket": S3_BUCKET,
        "ckptgw_s3_access_key": "testing",
        "ckptgw_s3_secret_key": "testing",
        "ckptgw_cache_dir": stack.CACHE,
        "ckptgw_reserve": "64MiB",                  # the tests' volume is 512 MiB
        "ckptgw_exports": [{"path": stack.EXPORT, "networks": ["192.168.38.0/24", "127.0.0.0/8"],
                            "access": "rw", "squash": "none"}],
        # the pair
        "ckptgw_pair_enabled": True,
        # in NODES order, always: the role numbers corosync's nodes by it, and a node that
        # rejoins under another number never merges with the running one (seen in the failback)
        "ckptgw_pair_nodes": [{"name": node, "address": address(node)} for node in NODES if node in pair.vms],
        "ckptgw_pair_drbd_disk": drbd.BACKING,
        "ckptgw_pair_drbd_device": drbd.DEVICE,
        "ckptgw_pair_drbd_resource": drbd.RESOURCE,
        "ckptgw_pair_floating_ip": stack.FLOATING_IP,
        "ckptgw_pair_floating_nic": "eth1",
        "ckptgw_pair_sbd_device": cluster.SBD_DISK,
        # stretched for emulated CPUs (cluster.py)
        "ckptgw_pair_corosync_token": cluster.TOKEN_MS,
        "ckptgw_pair_sbd_watchdog_timeout": cluster.SBD_WATCHDOG_S,
        "ckptgw_pair_sbd_msgwait": cluster.SBD_MSGWAIT_S,
        "ckptgw_pair_stonith_timeout": f"{cluster.STONITH_TIMEOUT_S}s",
        "ckptgw_pair_priority_fencing_delay": cluster.PRIORITY_FENCING_DELAY_S,
    }


def inventory(path: Path, pair: Pair, wheel: Path) -> Path:
    hosts = {}
    for node, vm in pair.vms.items():
        hosts[node] = {
            "ansible_host": "127.0.0.1",
            "ansible_port": vm.ssh_port,
            "ansible_user": DEPLOY_USER,
            "ansible_ssh_private_key_file": str(pair.image.ssh_key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ckptgw_pair_sbd_watchdog_device": cluster.watchdog_device(pair, node),
        }
    path.write_text(yaml.safe_dump({"ckptgw_gateways": {"hosts": hosts, "vars": group_vars(pair, wheel)}}))
    return path


def deploy(ansible_bin: Path, inv: Path, *args: str, **extra) -> PlaybookRun:
    """ansible/site.yml on both nodes; keyword arguments become -e variables."""
    if extra:
        args = (*args, "-e", json.dumps(extra))
    return run_playbook(ansible_bin, inv, *args, timeout=2400)
