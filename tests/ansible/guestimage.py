"""A Debian 12 disk image for the Ansible deployment test, built once and cached.

The image is a bootable root file system (mmdebstrap, then `mkfs.ext4 -d`) with:
  - systemd as PID 1, sshd, sudo and a deploy user `ansible` (key-only, passwordless sudo),
    as a fleet host would look before Ansible touches it;
  - Debian's own kernel and initramfs (copied out next to the image, so qemu boots them
    directly and the guest has the matching modules for its NFS client);
  - every system package the role would otherwise apt-install (apt under software
    emulation costs minutes per package);
  - a wheelhouse of ckptgw's Python dependencies (with the tryout extra's: the guest has no S3)
    at /opt/ckptgw-wheelhouse, so the role's offline install (`ckptgw_wheelhouse`) runs without an
    index, inside a guest that has no network beyond its forwarded SSH port; its exact versions
    are the image's constraints.txt, the pins the role installs with in the test.

Cache: $CKPTGW_ANSIBLE_IMAGE_CACHE (default /var/cache/ckptgw-ansible-image)/<hash>/, where the
hash covers everything the image is made from (the build functions in this file, the package
list, the suite and the project's dependency list). A build goes to a temporary folder and is
renamed into place when complete, under a file lock, so a crashed or concurrent build never
leaves a half image.

Run directly to build (or show) the image:  python3 tests/ansible/guestimage.py  (--ha: the HA node
image of issue 38, a layer on this one; see the end of this file)
"""
from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path(os.environ.get("CKPTGW_ANSIBLE_IMAGE_CACHE", "/var/cache/ckptgw-ansible-image"))
SUITE = "bookworm"
DEPLOY_USER = "ansible"
GUEST_WHEELHOUSE = "/opt/ckptgw-wheelhouse"
DISK_SIZE = "4G"

# What a freshly provisioned fleet host has (the brief's base set) plus what the role would
# apt-install on it (python3-venv; python3-packaging for Ansible's pip module; e2fsprogs for the
# cache disk; python3-apt for Ansible's apt module), the guest kernel, and nfs-common for the
# test's own NFS mount.
PACKAGES = [
    "systemd-sysv", "udev", "openssh-server", "sudo", "iproute2",
    "python3", "python3-venv", "python3-packaging", "python3-apt", "e2fsprogs",
    "nfs-common",
    "linux-image-amd64", "initramfs-tools",
]

# Timers that would wake apt, man-db & co. in the middle of a test under emulation.
MASKED_UNITS = ["apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer",
                "fstrim.timer", "e2scrub_reap.service"]


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class GuestImage:
    """A built image: its folder and the files in it."""
    root: Path

    @property
    def disk(self) -> Path:
        return self.root / "disk.raw"

    @property
    def kernel(self) -> Path:
        return self.root / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.root / "initrd.img"

    @property
    def ssh_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def constraints(self) -> Path:
        """NAME==VERSION of every wheel in the guest's wheelhouse (the role's ckptgw_constraints)."""
        return self.root / "constraints.txt"

    @property
    def manifest(self) -> dict:
        return json.loads((self.root / "manifest.json").read_text())


def project_dependencies() -> list[str]:
    """ckptgw's dependencies and its tryout extra's (the test runs the embedded S3)."""
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return sorted(project["dependencies"] + project["optional-dependencies"]["tryout"])


def image_key() -> str:
    """Hash of every input of the image: change one and a new image is built."""
    h = hashlib.sha256()
    for recipe in (_build, _configure, _wheelhouse, _boot_files):      # what shapes the image, not the
        h.update(inspect.getsource(recipe).encode())                    # tooling around it
    h.update(json.dumps({"suite": SUITE, "packages": PACKAGES, "masked": MASKED_UNITS,
                         "deps": project_dependencies()}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def cached_image() -> GuestImage | None:
    folder = CACHE_ROOT / image_key()
    return GuestImage(folder) if (folder / "manifest.json").exists() else None


def ensure_image(log=print) -> tuple[GuestImage, bool]:
    """The cached image, built first if missing. Returns (image, built_now)."""
    ensure_host_tools(log)
    image = cached_image()
    if image:
        return image, False
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one build at a time; the loser reuses it
        image = cached_image()
        if image:
            return image, False
        image = _build(CACHE_ROOT / image_key(), log)
        _prune(keep=image.root, log=log)
        return image, True


def _prune(keep: Path, log) -> None:
    """Drop images of older recipes (a VM still running on one keeps its open file)."""
    for old in CACHE_ROOT.iterdir():
        if old != keep and old.is_dir() and (old / "manifest.json").exists():
            log(f"guest image: removing outdated {old}")
            shutil.rmtree(old, ignore_errors=True)


def _run(cmd: list[str], log, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(cmd[:3])}... failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return proc


HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "ssh-keygen": "openssh-client",
              "ssh": "openssh-client", "qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils"}


def ensure_host_tools(log=print) -> None:
    """Install the Debian packages the image build and the VM need, when missing (as root)."""
    if os.geteuid() != 0:
        raise ImageError("building and booting the guest image needs root (mmdebstrap, image ownership)")
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)})
    if not missing:
        return
    log(f"guest image: apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        _run(cmd, log, env=env)


def _build(final: Path, log) -> GuestImage:
    started = time.monotonic()
    work = final.with_name(f".build-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        rootfs = work / "rootfs"
        log(f"guest image: mmdebstrap {SUITE} -> {rootfs}")
        _run(["mmdebstrap", "--variant=apt", "--include=" + ",".join(PACKAGES),
              "--aptopt=Acquire::Languages \"none\"", "--dpkgopt=path-exclude=/usr/share/doc/*",
              "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
              "--skip=cleanup/apt/lists",          # keeps apt's lists, so an apt check needs no network
              SUITE, str(rootfs)], log)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ckptgw-ansible-test",
              "-f", str(work / "id_ed25519")], log)
        _configure(rootfs, (work / "id_ed25519.pub").read_text(), log)
        _wheelhouse(rootfs / GUEST_WHEELHOUSE.lstrip("/"), work / "constraints.txt", log)
        _boot_files(rootfs, work)
        log("guest image: mkfs.ext4 -d")
        _run(["mkfs.ext4", "-q", "-F", "-L", "ckptgw-root", "-d", str(rootfs), str(work / "disk.raw"), DISK_SIZE],
             log)
        shutil.rmtree(rootfs)
        manifest = {"key": final.name, "suite": SUITE, "packages": PACKAGES, "deploy_user": DEPLOY_USER,
                    "wheelhouse": GUEST_WHEELHOUSE, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "build_seconds": round(time.monotonic() - started, 1)}
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log(f"guest image: built {final} in {time.monotonic() - started:.0f}s")
    return GuestImage(final)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _configure(rootfs: Path, pubkey: str, log) -> None:
    """Make the tree a bootable, reachable host: fstab, DHCP, hostname, deploy user."""
    _write(rootfs / "etc/fstab", "/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    _write(rootfs / "etc/hostname", "ckptgw-test\n")
    _write(rootfs / "etc/hosts", "127.0.0.1 localhost\n127.0.1.1 ckptgw-test\n::1 localhost ip6-localhost\n")
    # qemu's user network: DHCP from 10.0.2.2, DNS at 10.0.2.3.
    _write(rootfs / "etc/systemd/network/20-wired.network", "[Match]\nName=eth* en*\n\n[Network]\nDHCP=ipv4\n")
    resolv = rootfs / "etc/resolv.conf"
    if resolv.is_symlink():
        resolv.unlink()
    _write(resolv, "nameserver 10.0.2.3\n")
    _write(rootfs / "etc/ssh/sshd_config.d/ckptgw-test.conf",
           "PasswordAuthentication no\nUseDNS no\n")
    _write(rootfs / f"etc/sudoers.d/{DEPLOY_USER}", f"{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    _run(["chroot", str(rootfs), "useradd", "--create-home", "--shell", "/bin/bash", DEPLOY_USER], log)
    ssh_dir = rootfs / "home" / DEPLOY_USER / ".ssh"
    _write(ssh_dir / "authorized_keys", pubkey, 0o600)
    ssh_dir.chmod(0o700)
    _run(["chroot", str(rootfs), "chown", "-R", f"{DEPLOY_USER}:{DEPLOY_USER}", f"/home/{DEPLOY_USER}/.ssh"], log)
    _run(["systemctl", f"--root={rootfs}", "enable", "systemd-networkd.service"], log)
    _run(["systemctl", f"--root={rootfs}", "mask", *MASKED_UNITS], log)
    # A root console on the serial line helps when a boot goes wrong (console.log).
    _write(rootfs / "etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf",
           "[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %I $TERM\n")


def _wheelhouse(target: Path, constraints: Path, log) -> None:
    """Wheels for ckptgw's dependencies (not ckptgw itself: the role copies that one), and the
    constraints file pinning exactly them. Built here with the host's CPython 3.11 for
    linux-x86_64: the guest's python3 is 3.11 too."""
    target.mkdir(parents=True, exist_ok=True)
    reqs = target.parent / "ckptgw-requirements.txt"
    reqs.write_text("\n".join(project_dependencies()) + "\n")
    log(f"guest image: pip wheel {len(project_dependencies())} dependencies -> {target}")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(target), "-r", str(reqs)], log)
    reqs.unlink()
    pins = []
    for wheel in sorted(target.iterdir()):
        wheel.chmod(0o644)
        name, version = wheel.name.split("-")[:2]          # NAME-VERSION-...whl, NAME normalized
        pins.append(f"{name.replace('_', '-').lower()}=={version}\n")
    constraints.write_text("".join(pins))


def _boot_files(rootfs: Path, work: Path) -> None:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageError(f"no kernel or initrd in {rootfs / 'boot'}")
    shutil.copy2(kernels[-1], work / "vmlinuz")
    shutil.copy2(initrds[-1], work / "initrd.img")


# -- the HA node image (issue 38): the deploy image plus the cluster stack -------------------------
# A layer on the image above, not a second recipe: its disk is a copy of the deploy image's with
# these packages apt-installed in a chroot. The deploy image's key and content stay as they are.
# crmsh rather than pcs: pcs drives the cluster through its pcsd daemon (Ruby) on every node, which
# costs CPU and boot time under emulation; crmsh is a client only, and the tests write corosync.conf
# themselves. fence-agents carries fence_sbd, the fence device over the SBD disk. psmisc: the
# Filesystem agent refuses to run without its fuser (resource-agents only recommends it).
HA_PACKAGES = ["drbd-utils", "pacemaker", "corosync", "crmsh", "sbd", "resource-agents", "fence-agents", "psmisc"]
# Installed, not started at boot: the tests configure them first (Debian's default corosync.conf
# would otherwise form a one-node cluster on every boot).
HA_DISABLED_UNITS = ["corosync.service", "pacemaker.service", "sbd.service", "drbd.service"]
# The pair's shared segment: eth1 gets a fixed MAC per node, and the image a static address for
# each (no DHCP there). Node N is 52:54:00:38:00:0N = 192.168.38.N.
HA_NODES = {"gw-a": 1, "gw-b": 2, "client": 3}
HA_NET = "192.168.38"
HA_VENV = "/opt/ckptgw/venv"


def ha_mac(node: str) -> str:
    return f"52:54:00:38:00:{HA_NODES[node]:02x}"


def ha_address(node: str) -> str:
    return f"{HA_NET}.{HA_NODES[node]}"


def ha_image_key() -> str:
    h = hashlib.sha256(image_key().encode())
    h.update(inspect.getsource(_ha_layer).encode())
    h.update(json.dumps({"packages": HA_PACKAGES, "disabled": HA_DISABLED_UNITS, "nodes": HA_NODES,
                         "net": HA_NET, "venv": HA_VENV}, sort_keys=True).encode())
    return "ha-" + h.hexdigest()[:16]


def ensure_ha_image(log=print) -> tuple[GuestImage, bool]:
    """The HA node image, built (with the deploy image under it) if missing. Returns (image, built_now)."""
    base, _ = ensure_image(log)
    final = CACHE_ROOT / ha_image_key()
    if (final / "manifest.json").exists():
        return GuestImage(final), False
    with open(CACHE_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "manifest.json").exists():
            _ha_layer(base, final, log)
            for old in CACHE_ROOT.glob("ha-*"):         # older HA layers; the deploy image's prune
                if old != final:                        # removes them too when it is rebuilt
                    shutil.rmtree(old, ignore_errors=True)
        return GuestImage(final), True


def _umount(mounts: list[Path]) -> None:
    for m in reversed(mounts):
        subprocess.run(["umount", str(m)], capture_output=True)
    mounts.clear()


def _ha_layer(base: GuestImage, final: Path, log) -> None:
    started = time.monotonic()
    work = final.with_name(f".build-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    mnt = work / "mnt"
    mounts: list[Path] = []
    try:
        for name in ("vmlinuz", "initrd.img", "id_ed25519", "id_ed25519.pub", "constraints.txt"):
            shutil.copy2(base.root / name, work / name)
        _run(["cp", "--sparse=always", str(base.disk), str(work / "disk.raw")], log)
        mnt.mkdir()
        _run(["mount", "-o", "loop", str(work / "disk.raw"), str(mnt)], log)
        mounts.append(mnt)
        for fs in ("proc", "sys", "dev"):
            _run(["mount", "--bind", f"/{fs}", str(mnt / fs)], log)
            mounts.append(mnt / fs)
        resolv = (mnt / "etc/resolv.conf").read_text()
        (mnt / "etc/resolv.conf").write_text(Path("/etc/resolv.conf").read_text())   # the host's DNS
        _write(mnt / "usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)      # no daemon starts
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        log(f"guest image: apt-get install {' '.join(HA_PACKAGES)} (chroot)")
        _run(["chroot", str(mnt), "apt-get", "update", "-q"], log, env=env)
        _run(["chroot", str(mnt), "apt-get", "install", "-y", "-q", "--no-install-recommends",
              "-o", "Dpkg::Options::=--path-exclude=/usr/share/doc/*", *HA_PACKAGES], log, env=env)
        _run(["chroot", str(mnt), "apt-get", "clean"], log)
        (mnt / "usr/sbin/policy-rc.d").unlink()
        (mnt / "etc/resolv.conf").write_text(resolv)
        _run(["systemctl", f"--root={mnt}", "disable", *HA_DISABLED_UNITS], log)
        for node, n in HA_NODES.items():
            _write(mnt / f"etc/systemd/network/10-ha-{node}.network",
                   f"[Match]\nMACAddress={ha_mac(node)}\n\n[Link]\nRequiredForOnline=no\n\n"
                   f"[Network]\nAddress={ha_address(node)}/24\n")
        with open(mnt / "etc/hosts", "a") as hosts:
            hosts.writelines(f"{ha_address(node)} {node}\n" for node in HA_NODES)
        # The gateway's dependencies, where the role puts them (/opt/ckptgw/venv), installed here at
        # native speed from the image's own wheelhouse (pip under emulation takes minutes); the
        # tests add ckptgw's wheel of the checkout (pip --no-deps). The service account as the role
        # makes it, in the image, so both nodes have the same uid (the cache volume moves between them).
        log("guest image: /opt/ckptgw/venv with ckptgw's dependencies (chroot)")
        _run(["chroot", str(mnt), "python3", "-m", "venv", HA_VENV], log)
        _run(["chroot", str(mnt), f"{HA_VENV}/bin/pip", "install", "--quiet", "--no-index", "--find-links",
              GUEST_WHEELHOUSE, *project_dependencies()], log, env=env)
        _run(["chroot", str(mnt), "useradd", "--system", "--user-group", "--shell", "/usr/sbin/nologin",
              "--home-dir", "/var/lib/ckptgw", "--no-create-home", "--comment", "ckptgw NFS checkpoint gateway",
              "ckptgw"], log)
        versions = _run(["chroot", str(mnt), "dpkg-query", "-W", *HA_PACKAGES, "linux-image-*"], log).stdout
    except BaseException:
        _umount(mounts)
        shutil.rmtree(work, ignore_errors=True)       # a failed layer leaves nothing behind
        raise
    _umount(mounts)
    manifest = {**base.manifest, "key": final.name, "base": base.root.name, "ha_packages": HA_PACKAGES,
                "versions": dict(line.split("\t", 1) for line in versions.splitlines() if "\t" in line),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - started, 1)}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    mnt.rmdir()
    work.rename(final)
    log(f"guest image: built HA layer {final} in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    t0 = time.monotonic()
    img, built = ensure_ha_image() if sys.argv[1:] == ["--ha"] else ensure_image()
    print(json.dumps({"image": str(img.root), "built_now": built, "seconds": round(time.monotonic() - t0, 1),
                      **img.manifest}, indent=2))
