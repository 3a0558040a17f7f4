"""Two gateway VMs (issue 38) from the HA node image, wired as a pair, under qemu (software emulation).

Each node is a tests/ansible GuestVM (qcow2 overlay on the cached image, SSH through user-net
hostfwd) with, beside that:
  - /dev/vdb: its own raw data disk, kept in the pair's folder across boots (DRBD's backing disk;
    raw, so `kill -9` of qemu is a power cut and never damages the image file itself);
  - /dev/vdc: the one raw SBD disk both nodes share (qemu's image locking off, share-rw on);
  - eth1 on the pair's own L2 segment (replication and cluster traffic) with a fixed MAC, which
    the image maps to a static address (guestimage.ha_address: gw-a 192.168.38.1, gw-b .2);
  - an i6300esb watchdog (SBD's), with qemu's action: reset the guest;
  - the hostname (`systemd.hostname=`), which DRBD's `on` sections and corosync go by;
  - with `s3_port`, the pair's S3, outside both nodes: a user-net guestfwd that makes
    S3_ADDRESS:S3_GUEST_PORT in each guest a connection (socat, one per connection) to the host's
    127.0.0.1:s3_port, where the test runs moto; it outlives either node, as a real bucket does.

The segment is a Linux bridge on the host (root) with one persistent tap per node, which the
node's qemu opens (`-netdev tap,ifname=`): the kernel switches the frames, so a qemu busy on a
loaded host delays its own guest's frames but never stops the other's (the qemu `socket,mcast=`
netdev used before stalled twice here: a qemu stopped sending its guest's frames for good after
bursts of DRBD resync traffic, NETDEV WATCHDOG in the guest, and the pair fenced itself). The taps
outlive their qemu: `kill -9` of a node leaves its tap without carrier (the bridge stops sending
to it) and the node booted again opens the same tap, on the same segment. The bridge has no
address (the host is not on the segment), STP off and forward delay 0 (a port forwards as soon as
its qemu opens the tap), and neither it nor this network namespace hands the frames to netfilter
(br_netfilter would run them through the host's iptables/nftables: `Pair._bridge_up` turns the
namespace's bridge-nf-call-* sysctls off while a pair's bridge exists, as the kernel ORs them with
the bridge's own options, and puts them back when the process's last one goes). Names:
BRIDGE_PREFIX, the test process's pid and a counter (`ckha<pid>-<n>`, the taps `...a` / `...b`);
made when the pair starts, deleted when it stops, and a crashed run's (its pid gone) at the next
pair's start. A node's root overlay is made afresh at each boot (only the data disks persist), so
what a test configures in /etc must be written again after a restart.
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ansible"))   # the one image builder
from guestimage import GuestImage, ha_address, ha_mac  # noqa: E402
from guestvm import GuestError, GuestVM  # noqa: E402

NODES = ("gw-a", "gw-b")
S3_ADDRESS = "10.0.2.100"      # in each guest: the host's S3 (guestfwd), the only thing it reaches
S3_GUEST_PORT = 9000
MEM_MIB = 1024
SSH_ATTEMPTS = 4
_SSH_NO_CONNECTION = re.compile(r"banner exchange|Connection timed out|Connection refused|kex_exchange_identification")
# The segment's host interfaces: bridge `ckha<pid hex>-<n hex>`, taps that name + the node's last
# letter (at most 4 + 6 + 1 + 2 + 1 = 14 characters: IFNAMSIZ is 16 with the NUL).
BRIDGE_PREFIX = "ckha"
_BRIDGE_NAME = re.compile(rf"^{BRIDGE_PREFIX}([0-9a-f]+)-[0-9a-f]+[ab]?$")
_PAIR_NUMBERS = itertools.count(1)
# br_netfilter hands bridged IPv4/IPv6/ARP frames to netfilter if the bridge's nf_call_* option
# OR this network namespace's sysctl is on (the kernel checks both): the sysctls go off too.
# (put back as they were when this process's last pair stops and no such bridge is left).
_BRIDGE_NF_SYSCTLS = [Path(f"/proc/sys/net/bridge/bridge-nf-call-{t}") for t in ("iptables", "ip6tables", "arptables")]
_BRIDGE_NF_WAS: dict[Path, str] = {}


class Pair:
    def __init__(self, image: GuestImage, *, data_disk: str = "512M", sbd_disk: str = "16M",
                 workdir: Path | None = None, s3_port: int | None = None):
        self.image = image
        self.s3_port = s3_port
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="ckptgw-ha-pair."))
        # The pair's own bridge and taps (made by start()), so concurrent pairs never hear each other.
        self.bridge = f"{BRIDGE_PREFIX}{os.getpid():x}-{next(_PAIR_NUMBERS) % 256:02x}"
        self.taps = {node: self.bridge + node[-1] for node in NODES}
        self._bridge_made = False
        self.data_size = data_disk
        self.data = {node: self.dir / f"data-{node}.raw" for node in NODES}
        self.sbd = self.dir / "sbd.raw"
        for disk, size in [*((d, data_disk) for d in self.data.values()), (self.sbd, sbd_disk)]:
            if not disk.exists():
                subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(disk), size], check=True)
        self.vms: dict[str, GuestVM] = {}
        self.boot_seconds: dict[str, float] = {}

    def _vm(self, node: str) -> GuestVM:
        # PCI slots from 0x10 up: qemu places these -device's before GuestVM's if=virtio drives
        # otherwise, and the SBD disk would become /dev/vda (the root the kernel is told).
        qemu_args = [
            "-netdev", f"tap,id=ha,ifname={self.taps[node]},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=ha,mac={ha_mac(node)},addr=0x10",
            # Shared by both qemus: no image lock, and the device allows a second writer.
            "-drive", f"if=none,id=sbd,file={self.sbd},format=raw,cache=writethrough,file.locking=off",
            "-device", "virtio-blk-pci,drive=sbd,share-rw=on,addr=0x11",
            "-device", "i6300esb,addr=0x12", "-action", "watchdog=reset",
        ]
        user_net = ""
        if self.s3_port is not None:     # ",," is a comma inside a qemu option value
            user_net = (f"guestfwd=tcp:{S3_ADDRESS}:{S3_GUEST_PORT}-"
                        f"cmd:socat STDIO TCP4:127.0.0.1:{self.s3_port},,nodelay")
        return GuestVM(self.image, mem_mib=MEM_MIB, cache_image=self.data[node], qemu_args=qemu_args,
                       kernel_args=f"systemd.hostname={node}", user_net=user_net)

    def start(self, *nodes: str, timeout: float = 600) -> None:
        """Boot the nodes at once (launched from this thread, which must outlive them)."""
        nodes = nodes or NODES
        self._bridge_up()
        for node in nodes:
            self.vms[node] = self._vm(node)
            self.vms[node].launch()
        for node in nodes:
            self.vms[node].wait_ready(timeout)
            self.boot_seconds[node] = self.vms[node].boot_seconds

    def _bridge_up(self) -> None:
        """The segment: the bridge and both taps (once per pair; a failback's boot reuses them),
        after removing those of crashed runs."""
        if self._bridge_made:
            return
        _remove_stale_segments()
        br = self.bridge
        _ip("link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0",
            "mcast_snooping", "0", "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0")
        self._bridge_made = True
        _ip("link", "set", br, "addrgenmode", "none")        # no IPv6 link-local: the host is not on it
        for tap in self.taps.values():
            _ip("tuntap", "add", tap, "mode", "tap")
            _ip("link", "set", tap, "addrgenmode", "none")
            _ip("link", "set", tap, "master", br, "up")
        _ip("link", "set", br, "up")
        for sysctl in _BRIDGE_NF_SYSCTLS:
            if sysctl.exists() and sysctl.read_text().strip() != "0":
                _BRIDGE_NF_WAS.setdefault(sysctl, sysctl.read_text())
                sysctl.write_text("0\n")
        opts = (Path("/sys/class/net") / br / "bridge")
        on = [o for o in ("stp_state", "forward_delay", "nf_call_iptables", "nf_call_ip6tables", "nf_call_arptables")
              if (opts / o).read_text().strip() != "0"]
        on += [str(s) for s in _BRIDGE_NF_SYSCTLS if s.exists() and s.read_text().strip() != "0"]
        if on:
            raise GuestError(f"the pair's bridge {br}: still on: {on}")

    def _bridge_down(self) -> None:
        if self._bridge_made:
            for name in [*self.taps.values(), self.bridge]:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
            self._bridge_made = False
        links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
        if _BRIDGE_NF_WAS and f": {BRIDGE_PREFIX}" not in links:
            for sysctl, value in _BRIDGE_NF_WAS.items():
                sysctl.write_text(value)
            _BRIDGE_NF_WAS.clear()

    def power_cut(self, node: str) -> None:
        """kill -9 the node's qemu: what its kernel had not written to its disks is gone."""
        self.vms[node].power_cut()

    def stop(self, keep: bool = False) -> None:
        """Kill every VM (no clean shutdown: nothing of a test's state is worth a slow poweroff)."""
        for vm in self.vms.values():
            vm.power_cut()
            vm.stop(keep=keep)
        self._bridge_down()
        if not keep:
            subprocess.run(["rm", "-rf", str(self.dir)])

    def ssh(self, node: str, command: str, *, timeout: float = 300, check: bool = True,
            input: bytes | None = None) -> subprocess.CompletedProcess:
        """Run `command` as root on the node; bytes in and out (stdin from `input`)."""
        vm = self.vms[node]
        for attempt in range(SSH_ATTEMPTS):
            proc = subprocess.run(["ssh", *vm.ssh_options(), "ansible@127.0.0.1", f"sudo sh -c {_quote(command)}"],
                                  input=input if input is not None else b"", capture_output=True, timeout=timeout)
            # ssh's own failure to connect (the command never ran): a guest busy taking over on an
            # emulated CPU may not answer the SSH banner within ConnectTimeout (20 s); try again.
            if proc.returncode != 255 or not _SSH_NO_CONNECTION.search(proc.stderr.decode(errors="replace")):
                break
            time.sleep(5)
        if check and proc.returncode != 0:
            raise GuestError(f"{node}: command failed ({proc.returncode}): {command}\n"
                             f"{proc.stdout.decode(errors='replace')[-2000:]}{proc.stderr.decode(errors='replace')[-2000:]}")
        return proc

    def out(self, node: str, command: str, **kw) -> str:
        return self.ssh(node, command, **kw).stdout.decode()

    def wait_for(self, node: str, command: str, timeout: float, what: str, interval: float = 2) -> float:
        """Poll until `command` succeeds on the node; returns the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if self.ssh(node, command, check=False, timeout=120).returncode == 0:
                    return time.monotonic() - t0
            except subprocess.TimeoutExpired:
                pass                 # a session the node's reset (or a stalled boot) left hanging
            time.sleep(interval)
        raise GuestError(f"{node}: {what} not reached in {timeout:.0f}s")

    def diagnostics(self) -> str:
        return "\n".join(f"=== {node}\n{vm.diagnostics()}" for node, vm in self.vms.items())

    def segment_stalls(self) -> str:
        """The nodes whose eth1 transmit queue the kernel found stuck (NETDEV WATCHDOG), or "".
        Seen twice (2026-11-29) with the segment on qemu's `socket,mcast=` netdev, before the
        bridge: a qemu stopped taking frames from its guest (tx_errors rising, TX packets frozen,
        9+ minutes) after a burst of DRBD resync traffic while the host's CPUs were taken by other
        work; both nodes lost each other at once. That is the harness's network, not the pair: a
        DRBD wait that times out (drbd.wait_state) says so with this, should it recur on the tap."""
        stuck = []
        for node in self.vms:
            try:
                log = self.out(node, "dmesg | grep 'NETDEV WATCHDOG' | grep eth1 | tail -1",
                               check=False, timeout=60)
            except subprocess.TimeoutExpired:
                continue
            if log.strip():
                stuck.append(f"{node}: {log.strip()}")
        if not stuck:
            return ""
        return ("the pair's segment stalled (qemu stopped sending a guest's eth1 frames to its tap; "
                "a harness fault, tests/ha/README): " + "; ".join(stuck))


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise GuestError(f"ip {' '.join(args)}: {proc.stderr.strip()} (the pair's segment needs root)")


def _remove_stale_segments() -> None:
    """Delete the bridges and taps of runs whose process is gone (a crashed or killed test)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for name in re.findall(r"^\d+: ([^:@\s]+)", links, re.M):
        m = _BRIDGE_NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1), 16)
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def _quote(command: str) -> str:
    return "'" + command.replace("'", "'\"'\"'") + "'"


def address(node: str) -> str:
    return ha_address(node)
