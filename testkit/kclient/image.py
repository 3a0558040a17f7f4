"""Boot artefacts for the kernel-client VM: host packages, the initramfs and the PVH vmlinux.

Everything is derived from what Debian installs on the host (linux-image-amd64, busybox-static),
built once into a cache directory and rebuilt by itself when an input changes (the file name carries
a hash of init.sh, the kernel version, the module files and busybox).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
INIT_SH = HERE / "init.sh"
INSTALL_SH = HERE.parent.parent / "scripts" / "install-system-deps.sh"
IMAGE_FORMAT = "ckptgw-kclient-1"

# Modules the guest needs; their dependencies come from modules.dep.
WANTED_MODULES = [
    "virtio_pci", "virtio_net", "virtio_console", "9pnet_virtio", "9p",
    "overlay", "sunrpc", "auth_rpcgss", "lockd", "nfs_acl", "nfs", "nfsv4",
]
SIG_MAGIC = b"~Module signature appended~\n"


class KclientUnavailable(Exception):
    """qemu (or another host package the VM needs) is missing and cannot be installed."""


class KclientError(Exception):
    """The harness itself failed (bad cache, unreadable kernel, ...)."""


@dataclass(frozen=True)
class BootImage:
    kernel: str      # what qemu -kernel gets: the PVH vmlinux, or the bzImage if it has no PVH note
    initrd: str
    kver: str


def default_cache_dir() -> Path:
    return Path(os.environ.get("CKPTGW_KCLIENT_CACHE", "/var/cache/ckptgw-kclient"))


# --------------------------------------------------------------------------- host packages

def _is_static_elf(path: str) -> bool:
    """True if the ELF file at path has no PT_INTERP, i.e. it runs without a dynamic loader."""
    try:
        with open(path, "rb") as f:
            hdr = f.read(64)
            if hdr[:4] != b"\x7fELF" or hdr[4] != 2:
                return False
            phoff = int.from_bytes(hdr[32:40], "little")
            phentsize = int.from_bytes(hdr[54:56], "little")
            phnum = int.from_bytes(hdr[56:58], "little")
            f.seek(phoff)
            for _ in range(phnum):
                if int.from_bytes(f.read(phentsize)[0:4], "little") == 3:  # PT_INTERP
                    return False
            return True
    except OSError:
        return False


def _find_busybox(cache: Path) -> str | None:
    for p in ("/bin/busybox", "/usr/bin/busybox", str(cache / "busybox-static" / "bin" / "busybox")):
        if os.path.exists(p) and _is_static_elf(p):
            return p
    return None


def _fetch_busybox_static(cache: Path) -> None:
    """The dynamic `busybox` package is installed (busybox-static would replace it): unpack
    busybox-static into the cache instead of installing it."""
    log = cache / "apt.log"
    with tempfile.TemporaryDirectory(dir=cache) as tmp, open(log, "ab") as lf:
        if subprocess.call(["apt-get", "download", "busybox-static"], cwd=tmp, stdout=lf, stderr=lf):
            subprocess.call(["apt-get", "update"], stdout=lf, stderr=lf)
            if subprocess.call(["apt-get", "download", "busybox-static"], cwd=tmp, stdout=lf, stderr=lf):
                raise KclientUnavailable(f"cannot download busybox-static (see {log})")
        deb = next(n for n in os.listdir(tmp) if n.endswith(".deb"))
        shutil.rmtree(cache / "busybox-static", ignore_errors=True)
        subprocess.check_call(["dpkg-deb", "-x", os.path.join(tmp, deb), str(cache / "busybox-static")],
                              stdout=lf, stderr=lf)


def _version_key(s: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]


def find_kernel() -> tuple[str, str] | None:
    """Newest /boot/vmlinuz-* that has its modules installed: (path, version)."""
    found = []
    for name in os.listdir("/boot") if os.path.isdir("/boot") else []:
        kver = name[len("vmlinuz-"):]
        if name.startswith("vmlinuz-") and os.path.exists(f"/lib/modules/{kver}/modules.dep"):
            found.append((_version_key(kver), f"/boot/{name}", kver))
    return max(found)[1:] if found else None


def _missing() -> list[str]:
    missing = [exe for exe in ("qemu-system-x86_64", "socat") if not shutil.which(exe)]
    if find_kernel() is None:
        missing.append("a kernel in /boot with /lib/modules (linux-image-amd64)")
    return missing


def ensure_host_packages(cache: Path, install: bool = True) -> str:
    """Make sure qemu, socat, a kernel and a static busybox exist; returns the busybox path.

    Installs through scripts/install-system-deps.sh when something is missing (and `install`).
    Raises KclientUnavailable with the reason when they cannot be had."""
    if _missing() and install:
        if os.geteuid() != 0:
            raise KclientUnavailable(f"missing {', '.join(_missing())} and not root to install it")
        if not shutil.which("apt-get"):
            raise KclientUnavailable(f"missing {', '.join(_missing())} and no apt-get to install it")
        r = subprocess.run(["bash", str(INSTALL_SH)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode:
            raise KclientUnavailable(f"{INSTALL_SH.name} failed: {r.stdout.strip()[-1500:]}")
    if _missing():
        raise KclientUnavailable(f"missing {', '.join(_missing())} (run scripts/install-system-deps.sh)")
    bb = _find_busybox(cache)
    if bb is None and install and shutil.which("dpkg-deb"):
        _fetch_busybox_static(cache)
        bb = _find_busybox(cache)
    if bb is None:
        raise KclientUnavailable("no static busybox (install busybox-static)")
    return bb


# --------------------------------------------------------------------------- initramfs

class _Cpio:
    """Writer for the 'newc' cpio format that the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 1

    def _add(self, name: str, mode: int, data: bytes = b"") -> None:
        name_b = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_b), 0)
        self.ino += 1
        rec = ("070701" + "".join("%08X" % v for v in fields)).encode() + name_b
        rec += b"\0" * (-len(rec) % 4) + data
        rec += b"\0" * (-len(rec) % 4)
        self.parts.append(rec)

    def dir(self, name: str) -> None:
        self._add(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._add(name, stat.S_IFREG | mode, data)

    def bytes(self) -> bytes:
        self._add("TRAILER!!!", 0)
        return b"".join(self.parts)


def _strip_ext(rel: str) -> str:
    for ext in (".xz", ".gz", ".zst"):
        if rel.endswith(ext):
            return rel[: -len(ext)]
    return rel


def _mod_name(rel: str) -> str:
    return os.path.basename(_strip_ext(rel))[:-3].replace("-", "_")


def _read_module(path: str) -> bytes:
    data = Path(path).read_bytes()
    if path.endswith(".xz"):
        data = lzma.decompress(data)
    elif path.endswith(".gz"):
        data = gzip.decompress(data)
    elif path.endswith(".zst"):
        data = subprocess.run(["zstd", "-dc", path], check=True, stdout=subprocess.PIPE).stdout
    # Drop the appended signature: without MODULE_SIG_FORCE the kernel then loads the module
    # without the RSA check (it only taints itself), which saves boot time under TCG.
    if data.endswith(SIG_MAGIC):
        info = data[-len(SIG_MAGIC) - 12:-len(SIG_MAGIC)]
        end = len(data) - len(SIG_MAGIC) - 12 - int.from_bytes(info[8:12], "big")
        if end > 0:
            data = data[:end]
    return data


def _module_order(kver: str) -> list[str]:
    """WANTED_MODULES plus their dependencies, dependencies first (paths relative to moddir)."""
    moddir = f"/lib/modules/{kver}"
    deps: dict[str, list[str]] = {}
    byname: dict[str, str] = {}
    for line in Path(moddir, "modules.dep").read_text().splitlines():
        if ":" in line:
            mod, rest = line.split(":", 1)
            deps[mod] = rest.split()
            byname[_mod_name(mod)] = mod
    builtin_file = Path(moddir, "modules.builtin")
    builtin = {_mod_name(x) for x in builtin_file.read_text().split()} if builtin_file.exists() else set()
    order: list[str] = []
    seen: set[str] = set()

    def visit(mod: str) -> None:
        if mod not in seen:
            seen.add(mod)
            for d in deps.get(mod, []):
                visit(d)
            order.append(mod)

    for name in WANTED_MODULES:
        if name in byname:
            visit(byname[name])
        elif name not in builtin:
            raise KclientError(f"kernel module {name} not found for {kver}")
    return order


def _build_initramfs(busybox: str, kver: str, cache: Path) -> str:
    init = INIT_SH.read_bytes()
    order = _module_order(kver)
    moddir = f"/lib/modules/{kver}"
    h = hashlib.sha256(IMAGE_FORMAT.encode() + init + kver.encode())
    for p in [os.path.join(moddir, m) for m in order] + [busybox]:
        st = os.stat(p)
        h.update(f"{p}:{st.st_size}:{int(st.st_mtime)}".encode())
    # left uncompressed: gunzip under TCG costs about 0.5 s per boot
    out = cache / f"initrd-{kver}-{h.hexdigest()[:16]}.cpio"
    if out.exists():
        return str(out)
    c = _Cpio()
    for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "lib", "lib/modules",
              moddir[1:]):
        c.dir(d)
    c.file("bin/busybox", Path(busybox).read_bytes(), 0o755)
    c.file("init", init, 0o755)
    # The kernel's request-key upcall (NFSv4 owner name mapping) runs in the initramfs root:
    # hand it to the host's tools inside the guest's root.
    c.file("sbin/request-key",
           b"#!/bin/busybox sh\n[ -x /newroot/sbin/request-key ] || exit 1\n"
           b"exec /bin/busybox chroot /newroot /sbin/request-key \"$@\"\n", 0o755)
    made: set[str] = set()
    rels = []
    for m in order:
        rel = _strip_ext(m)
        parts = rel.split("/")
        for i in range(1, len(parts)):
            d = f"{moddir[1:]}/{'/'.join(parts[:i])}"
            if d not in made:
                made.add(d)
                c.dir(d)
        c.file(f"{moddir[1:]}/{rel}", _read_module(os.path.join(moddir, m)))
        rels.append(f"{kver}/{rel}")
    c.file("modules.order", ("\n".join(rels) + "\n").encode())
    tmp = out.with_name(out.name + f".tmp.{os.getpid()}")
    tmp.write_bytes(c.bytes())
    os.rename(tmp, out)
    for old in cache.glob("initrd-*.cpio"):  # images of an older init.sh or kernel
        if old != out:
            old.unlink(missing_ok=True)
    return str(out)


# --------------------------------------------------------------------------- vmlinux (PVH boot)

def _has_pvh_note(path: str) -> bool:
    """True if the ELF carries XEN_ELFNOTE_PHYS32_ENTRY, so qemu can boot it directly (PVH)."""
    with open(path, "rb") as f:
        hdr = f.read(64)
        if hdr[:4] != b"\x7fELF" or hdr[4] != 2:
            return False
        phoff = int.from_bytes(hdr[32:40], "little")
        phentsize = int.from_bytes(hdr[54:56], "little")
        phnum = int.from_bytes(hdr[56:58], "little")
        notes = []
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            if int.from_bytes(ph[0:4], "little") == 4:  # PT_NOTE
                notes.append((int.from_bytes(ph[8:16], "little"), int.from_bytes(ph[32:40], "little")))
        for off, size in notes:
            f.seek(off)
            d = f.read(size)
            i = 0
            while i + 12 <= len(d):
                namesz, descsz, typ = (int.from_bytes(d[i + j:i + j + 4], "little") for j in (0, 4, 8))
                if d[i + 12:i + 12 + namesz].rstrip(b"\0") == b"Xen" and typ == 18:
                    return True
                i += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def _extract_vmlinux(kernel: str, cache: Path) -> str | None:
    """The uncompressed ELF vmlinux inside a bzImage, cached; None if it cannot boot via PVH.
    PVH skips SeaBIOS and the decompressor: about 3 s less per boot under TCG."""
    st = os.stat(kernel)
    out = cache / f"vmlinux-{os.path.basename(kernel)}-{st.st_size}-{int(st.st_mtime)}"
    if out.exists():
        return str(out)
    if out.with_suffix(".nopvh").exists():
        return None
    data = Path(kernel).read_bytes()
    for magic, kind in ((b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x1f\x8b\x08", "gzip")):
        i = data.find(magic)
        while i >= 0:
            try:
                if kind == "xz":
                    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[i:])
                elif kind == "gzip":
                    elf = zlib.decompressobj(31).decompress(data[i:])
                elif shutil.which("zstd"):
                    elf = subprocess.run(["zstd", "-dc"], input=data[i:], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL).stdout
                else:
                    break
            except (lzma.LZMAError, zlib.error, EOFError):
                elf = b""
            if elf[:4] == b"\x7fELF":
                tmp = out.with_name(out.name + f".tmp.{os.getpid()}")
                tmp.write_bytes(elf)
                if _has_pvh_note(str(tmp)):
                    os.rename(tmp, out)
                    return str(out)
                tmp.unlink()
            i = data.find(magic, i + 1)
    out.with_suffix(".nopvh").touch()
    return None


@contextmanager
def _cache_lock(cache: Path):
    with open(cache / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def prepare(cache: Path | None = None, install: bool = True) -> BootImage:
    """Host packages + cached kernel/initramfs; raises KclientUnavailable or KclientError."""
    cache = Path(cache) if cache else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KclientError(f"cannot create the cache dir {cache}: {e}") from e
    with _cache_lock(cache):
        busybox = ensure_host_packages(cache, install)
        kernel, kver = find_kernel()  # type: ignore[misc]  # ensure_host_packages checked it
        if not os.access(kernel, os.R_OK):
            raise KclientError(f"cannot read {kernel} (run as root)")
        initrd = _build_initramfs(busybox, kver, cache)
        return BootImage(kernel=_extract_vmlinux(kernel, cache) or kernel, initrd=initrd, kver=kver)
