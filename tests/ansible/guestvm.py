"""Boot the cached Debian image under qemu (software emulation) and reach it over SSH.

The base image is never written: each VM runs on a qcow2 overlay in its own run folder, with a
second, empty virtio disk (/dev/vdb) that the inventory names as the cache disk. Networking is
qemu's user mode with restrict=on: the guest reaches nothing but its forwarded SSH port on the
host's 127.0.0.1, so the role's offline install path is what gets exercised.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from guestimage import DEPLOY_USER, GuestImage

# x86-64-v2 without `-cpu max`'s SMAP, which makes every user copy costly under TCG.
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16"


class GuestError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """preexec_fn: the VM dies with the test process, even on SIGKILL."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GuestVM:
    def __init__(self, image: GuestImage, *, smp: int = 1, mem_mib: int = 2048, cache_disk: str = "2G",
                 cache_image: Path | None = None, qemu_args: list[str] = (), kernel_args: str = "",
                 user_net: str = ""):
        self.image = image
        self.smp, self.mem_mib, self.cache_disk = smp, mem_mib, cache_disk
        self.cache_image = cache_image     # a raw file kept across boots (power-cut test), else a fresh one
        self.qemu_args, self.kernel_args = list(qemu_args), kernel_args    # extra devices (tests/ha)
        self.user_net = user_net           # more user-net options, e.g. a guestfwd (tests/ha's S3)
        self.rundir = Path(tempfile.mkdtemp(prefix="ckptgw-ansible-vm."))
        self.ssh_port = 0
        self.proc: subprocess.Popen | None = None
        self.boot_seconds: float | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 420) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start qemu, not waiting for SSH: several VMs boot at once when launched from one thread
        (PR_SET_PDEATHSIG kills a VM when the *thread* that started it ends)."""
        overlay = self.rundir / "root.qcow2"
        cache = self.cache_image or self.rundir / "cache.raw"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(self.image.disk),
                        str(overlay)], check=True)
        if not cache.exists():
            subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(cache), self.cache_disk], check=True)
        self.ssh_port = free_port()
        cmd = ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
               "-machine", "q35,accel=tcg", "-cpu", TCG_CPU, "-smp", str(self.smp), "-m", str(self.mem_mib),
               "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
               "-append", f"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet {self.kernel_args}".rstrip(),
               "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
               "-drive", f"file={cache},if=virtio,format=raw,cache=unsafe",
               "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22"
               + (f",{self.user_net}" if self.user_net else ""),
               "-device", "virtio-net-pci,netdev=n0", "-device", "virtio-rng-pci",
               "-serial", f"file:{self.rundir / 'console.log'}", *self.qemu_args]
        self._launched = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(self.rundir / "qemu.log", "wb"),
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_ready(self, timeout: float = 420) -> None:
        self._wait_for_ssh(self._launched + timeout)
        self.boot_seconds = time.monotonic() - self._launched

    def _wait_for_ssh(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise GuestError(f"qemu exited ({self.proc.returncode}) before SSH answered:\n{self.diagnostics()}")
            try:
                if self.ssh("true", timeout=15, check=False).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(3)
        raise GuestError(f"SSH did not answer on 127.0.0.1:{self.ssh_port} in time:\n{self.diagnostics()}")

    def stop(self, keep: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.ssh("sudo systemctl poweroff", timeout=20, check=False)
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep:
            shutil.rmtree(self.rundir, ignore_errors=True)

    def power_cut(self) -> None:
        """SIGKILL qemu: the guest's page cache and unflushed state are gone, as in a power cut;
        what it had written to its (raw) disks is in the host's page cache and stays."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "GuestVM":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(keep=os.environ.get("CKPTGW_ANSIBLE_KEEP_VM") == "1")

    # -- access ----------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        return ["-i", str(self.image.ssh_key), "-p", str(self.ssh_port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-o", "IdentitiesOnly=yes"]

    def ssh(self, command: str, *, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run `command` as the deploy user (use sudo for root)."""
        proc = subprocess.run(["ssh", *self.ssh_options(), f"{DEPLOY_USER}@127.0.0.1", command],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise GuestError(f"guest command failed ({proc.returncode}): {command}\n{proc.stdout}{proc.stderr}")
        return proc

    def diagnostics(self) -> str:
        out = []
        for name in ("qemu.log", "console.log"):
            p = self.rundir / name
            if p.exists():
                out.append(f"--- {name} (tail)\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)
