"""KernelClient: run a shell command in a throw-away QEMU VM whose Linux kernel NFSv4 client has
mounted an NFS server listening on this host's loopback.

One `run()` = one VM boot (about 5 s under TCG). The guest sees the host's root filesystem
read-only (9p, with a tmpfs overlay; /tmp is an empty tmpfs), so repository scripts run at their
host paths. Its network reaches only the server port: slirp with restrict=on and a guestfwd
10.0.2.100:PORT -> socat -> 127.0.0.1:PORT. See README.md beside this file.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from testkit.loopback import free_port as _free_loopback_port, listening

from .image import BootImage, KclientError, prepare

GUEST_LIB = Path(__file__).resolve().parent / "guest_lib.sh"
GUEST_IP = "10.0.2.15"
SERVER_IP = "10.0.2.100"  # the guestfwd address standing for the host's 127.0.0.1:PORT
EXIT_TIMEOUT = 124
EXIT_HARNESS = 125
# TCG CPU: x86-64-v2 (wheels needing SSE4.2/POPCNT work) without SMAP, whose stac/clac around
# every user copy makes NFS I/O about 1.7x slower under TCG.
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16"
# boot-time savers under TCG; none of them matters to the NFS client
FAST_BOOT = "mitigations=off cryptomgr.notests apparmor=0 audit=0 nokaslr i8042.noaux i8042.nokbd i8042.nopnp"
STALL_RE = re.compile(r"rcu.{0,40} stall|soft lockup|blocked for more than|watchdog: BUG")
VERSIONS = ("4.0", "4.1", "4.2")


@dataclass
class KclientResult:
    rc: int                      # the command's exit status; 124 timeout; 125 harness failure
    stdout: str
    stderr: str
    timings: dict                # boot_s (qemu start -> command start), command_s, total_s
    harness_error: str | None = None   # why rc is 125 (mount failure, boot failure, ...)
    timed_out: bool = False
    dmesg: str = ""              # guest kernel log at the end of the run
    mount_log: str = ""
    umount_log: str = ""
    console: str = ""            # guest serial console (boot messages, init's log lines)
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def describe(self, tail: int = 40) -> str:
        """Everything useful for a failure message."""
        parts = [f"rc={self.rc} timings={self.timings}"]
        if self.harness_error:
            parts.append(f"harness error: {self.harness_error}")
        if self.timed_out:
            parts.append("timed out (VM killed)")
        for name in ("stdout", "stderr", "mount_log", "umount_log", "dmesg"):
            text = getattr(self, name).strip()
            if name == "dmesg":  # one line per drop_caches would crowd out what matters
                text = "\n".join(ln for ln in text.splitlines() if "drop_caches:" not in ln)
            if text:
                parts.append(f"--- {name} (last {tail} lines):\n" + "\n".join(text.splitlines()[-tail:]))
        if not self.dmesg and self.console.strip():
            parts.append("--- console:\n" + "\n".join(self.console.splitlines()[-tail:]))
        return "\n".join(parts)

    def check(self) -> "KclientResult":
        """Raise AssertionError with the full story unless the command succeeded."""
        if self.rc != 0:
            raise AssertionError("kernel-client command failed: " + self.describe())
        return self


def _set_pdeathsig() -> None:
    """preexec_fn: qemu dies with us even if we are SIGKILLed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass




class KernelClient:
    """The Linux NFSv4 client against 127.0.0.1:port, one VM per run().

    export: the path mounted (source 10.0.2.100:<export>); vers: "4.0", "4.1" or "4.2";
    opts: extra mount options ("hard,timeo=50,actimeo=0"; a vers=/port= there wins);
    mount=False: the command mounts and unmounts itself, with
        mount -i -t nfs4 -o "$KCLIENT_NFS_OPTS" "$KCLIENT_NFS_SOURCE" "$KCLIENT_MNT"
    cache_dir: where the initramfs and vmlinux are kept (default $CKPTGW_KCLIENT_CACHE or
    /var/cache/ckptgw-kclient); install: apt-get what is missing (scripts/install-system-deps.sh).
    The constructor prepares the boot image and raises image.KclientUnavailable when qemu or the
    kernel cannot be had (see testkit.kclient.require for the pytest policy)."""

    def __init__(self, port: int, export: str = "/", vers: str = "4.1", opts: str = "",
                 mount: bool = True, mnt: str = "/mnt", cache_dir: str | os.PathLike | None = None,
                 mem_mib: int = 2048, smp: int = 1, install: bool = True, umount_wait: int = 30):
        if not 0 < int(port) < 65536:
            raise ValueError(f"bad port {port!r}")
        if vers not in VERSIONS:
            raise ValueError(f"vers must be one of {VERSIONS}, not {vers!r}")
        if not export.startswith("/"):
            raise ValueError(f"export must start with /: {export!r}")
        if not mnt.startswith("/") or mnt.rstrip("/") in ("", "/proc", "/sys", "/dev", "/run", "/tmp", "/kclient"):
            raise ValueError(f"bad guest mount point {mnt!r}")
        self.port, self.export, self.vers, self.mount = int(port), export, vers, mount
        self.mnt = mnt.rstrip("/")
        self.user_opts = [o for o in opts.split(",") if o]
        self.mem_mib, self.smp, self.umount_wait = mem_mib, max(1, smp), umount_wait
        self.image: BootImage = prepare(Path(cache_dir) if cache_dir else None, install=install)

    # ------------------------------------------------------------------ options and files

    def nfs_opts(self, cb_port: int) -> str:
        keys = {o.split("=", 1)[0] for o in self.user_opts}
        opts = []
        if not keys & {"vers", "nfsvers", "minorversion"}:
            opts.append(f"vers={self.vers}")
        if "port" not in keys:
            opts.append(f"port={self.port}")
        # NFSv4.0 callbacks: advertise the host loopback, where slirp forwards cb_port into the
        # guest (the guest's own address is unreachable from the host). 4.1+ use the fore channel.
        if "clientaddr" not in keys:
            opts.append("clientaddr=127.0.0.1")
        opts += self.user_opts
        opts.append(f"addr={SERVER_IP}")  # mount -i (no mount.nfs helper) needs the address
        return ",".join(opts)

    def _write_rundir(self, rundir: Path, command: str, env: dict, cwd: str, cb_port: int) -> None:
        opts = self.nfs_opts(cb_port)
        source = f"{SERVER_IP}:{self.export}"
        config = {
            "KC_OVERLAY_SIZE": "50%", "KC_MNT": self.mnt, "KC_HOSTNAME": f"kclient-{uuid.uuid4().hex[:8]}",
            "KC_GUEST_IP": GUEST_IP, "KC_NFS_SOURCE": source, "KC_NFS_OPTS": opts,
            "KC_DO_MOUNT": "1" if self.mount else "0", "KC_UMOUNT_WAIT": str(self.umount_wait),
            "KC_TMP_KEEP": " ".join(_host_tmp_paths(cwd)),
        }
        (rundir / "config").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in config.items()))
        genv = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
            "TERM": "dumb", "LANG": "C.UTF-8", "USER": "root", "KCLIENT": "1",
            "KCLIENT_MNT": self.mnt, "KCLIENT_PORT": str(self.port), "KCLIENT_EXPORT": self.export,
            "KCLIENT_VERS": self.vers, "KCLIENT_NFS_SOURCE": source, "KCLIENT_NFS_OPTS": opts,
            "KCLIENT_RUNDIR": "/kclient", "KCLIENT_GUEST_LIB": str(GUEST_LIB),
        }
        genv.update({k: str(v) for k, v in env.items()})
        script = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in genv.items())
        script += f"cd {shlex.quote(cwd)} 2>/dev/null || cd /\n"
        script += f"exec /bin/sh -c {shlex.quote(command)}\n"
        (rundir / "run.sh").write_text(script)

    def qemu_argv(self, rundir: Path, cb_port: int) -> list[str]:
        append = (f"console=ttyS0 quiet panic=-1 {FAST_BOOT} nfs.nfs4_unique_id={uuid.uuid4().hex} "
                  f"nfs.callback_tcpport={cb_port}")
        # slirp starts one socat per guest TCP connection, so reconnects after a server restart work
        fwd = f"cmd:socat -b262144 STDIO TCP4:127.0.0.1:{self.port},,nodelay"
        return [
            "qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "pc", "-m", str(self.mem_mib), "-smp", str(self.smp),
            "-accel", "tcg,thread=multi" if self.smp > 1 else "tcg", "-cpu", TCG_CPU,
            "-no-reboot", "-kernel", self.image.kernel, "-initrd", self.image.initrd, "-append", append,
            "-serial", f"file:{rundir / 'console.log'}",
            "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev", f"local,id=kcrun,path={rundir},security_model=none",
            "-device", "virtio-9p-pci,fsdev=kcrun,mount_tag=kcrun",
            "-netdev", (f"user,id=n0,restrict=on,net=10.0.2.0/24,"
                        f"guestfwd=tcp:{SERVER_IP}:{self.port}-{fwd},"
                        f"hostfwd=tcp:127.0.0.1:{cb_port}-{GUEST_IP}:{cb_port}"),
            "-device", "virtio-net-pci,netdev=n0,romfile=",
            "-device", "virtio-serial-pci",
            "-chardev", f"file,id=kcout,path={rundir / 'stdout.log'}",
            "-device", "virtserialport,chardev=kcout,name=kclient.stdout",
            "-chardev", f"file,id=kcerr,path={rundir / 'stderr.log'}",
            "-device", "virtserialport,chardev=kcerr,name=kclient.stderr",
        ]

    # ------------------------------------------------------------------ running

    def run(self, command: str, timeout: float = 600, env: dict | None = None, cwd: str | None = None,
            keep: bool | None = None, host_calls: dict[str, Callable[[], object]] | None = None) -> KclientResult:
        """Boot, (mount,) run `command` with /bin/sh -c in the guest, (unmount,) power off.

        env: extra guest variables; cwd: guest working dir (default: this process's cwd);
        host_calls: functions the guest may ask the host to run while it waits, e.g. {"restart":
        server.restart}; in the guest: `. "$KCLIENT_GUEST_LIB"; kc_host_call restart` (returns 1
        with the error on stderr if the function raised; each name runs once per boot, so call
        `restart.2` for a second restart);
        keep: keep the run dir (console.log, dmesg.txt, ...) and name it in result.extra
        (default: $CKPTGW_KCLIENT_KEEP=1). Never raises for guest-side failures: see result.rc."""
        if keep is None:
            keep = os.environ.get("CKPTGW_KCLIENT_KEEP") == "1"
        if self.mount and not listening(self.port, timeout=3):
            return KclientResult(EXIT_HARNESS, "", "", {}, harness_error=(
                f"nothing accepts TCP on 127.0.0.1:{self.port} (is the server running?)"))
        rundir = Path(tempfile.mkdtemp(prefix="ckptgw-kclient-run."))
        rundir.chmod(0o755)
        try:
            cb_port = _free_loopback_port()
            self._write_rundir(rundir, command, env or {}, cwd or os.getcwd(), cb_port)
            for n in ("stdout.log", "stderr.log", "console.log"):
                (rundir / n).touch()
            result = self._boot(rundir, cb_port, timeout, host_calls or {})
            if keep:
                result.extra["rundir"] = str(rundir)
            return result
        finally:
            if not keep:
                shutil.rmtree(rundir, ignore_errors=True)

    @staticmethod
    def _serve_host_calls(rundir: Path, host_calls: dict[str, Callable[[], object]], served: set[str]) -> None:
        """The guest asks for a host call by creating call.NAME in the run dir (a 9p share without
        caching) and waits for done.NAME or failed.NAME."""
        for req in rundir.glob("call.*"):
            name = req.name[len("call."):]
            if name in served:
                continue
            served.add(name)
            fn = host_calls.get(name, host_calls.get(name.split(".", 1)[0]))  # "restart.2" -> "restart"
            try:
                if fn is None:
                    raise KeyError(f"no host call named {name!r} (have: {sorted(host_calls)})")
                fn()
            except Exception as e:  # reported to the guest, which fails its script with it
                (rundir / f"failed.{name}").write_text(f"{type(e).__name__}: {e}\n")
            else:
                (rundir / f"done.{name}").touch()

    def _boot(self, rundir: Path, cb_port: int, timeout: float,
              host_calls: dict[str, Callable[[], object]]) -> KclientResult:
        t0 = time.monotonic()
        with open(rundir / "qemu.log", "wb") as qlog:
            proc = subprocess.Popen(self.qemu_argv(rundir, cb_port), stdin=subprocess.DEVNULL, stdout=qlog,
                                    stderr=qlog, preexec_fn=_set_pdeathsig, start_new_session=True)
            t_cmd_start = None
            timed_out = False
            served: set[str] = set()
            try:
                while proc.poll() is None:
                    if t_cmd_start is None and (rundir / "t_cmd_start").exists():
                        t_cmd_start = time.monotonic()
                    self._serve_host_calls(rundir, host_calls, served)  # unknown names fail fast
                    if time.monotonic() - t0 > timeout:
                        timed_out = True
                        break
                    time.sleep(0.1)
            finally:  # also on KeyboardInterrupt / pytest-timeout: never leave a VM behind
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        t_end = time.monotonic()

        def rd(name: str) -> str:
            try:
                return (rundir / name).read_text(errors="replace")
            except OSError:
                return ""

        def fnum(name: str) -> float | None:
            try:
                return float(rd(name))
            except ValueError:
                return None

        cs, ce = fnum("t_cmd_start"), fnum("t_cmd_end")
        timings = {
            "boot_s": round(t_cmd_start - t0, 2) if t_cmd_start else None,
            "command_s": round(ce - cs, 2) if cs is not None and ce is not None else None,
            "total_s": round(t_end - t0, 2),
        }
        res = KclientResult(rc=EXIT_HARNESS, stdout=rd("stdout.log"), stderr=rd("stderr.log"), timings=timings,
                            dmesg=rd("dmesg.txt"), mount_log=rd("mount.log").strip(),
                            umount_log=rd("umount.log").strip(), console=rd("console.log"))
        rcs = rd("rc").strip()
        if timed_out:
            res.rc, res.timed_out = EXIT_TIMEOUT, True
            if STALL_RE.search(res.console):
                res.harness_error = "timeout; the guest kernel reported a CPU stall or hung task (host overloaded?)"
        elif rcs:
            res.rc = int(rcs)
        elif rd("mount-failed"):
            res.harness_error = (f"NFS mount of {SERVER_IP}:{self.export} -o {self.nfs_opts(cb_port)} failed: "
                                 f"{res.mount_log}")
        elif rd("init-error"):
            res.harness_error = f"guest init failed: {rd('init-error').strip()}"
        else:
            res.harness_error = (f"the VM stopped without an exit status (qemu exit {proc.returncode}): "
                                 f"{rd('qemu.log').strip()[-1500:]}")
        if "timeout" in res.umount_log:
            res.extra["umount_timeout"] = True
        return res


def ensure_ready(cache_dir: str | os.PathLike | None = None, install: bool = True) -> BootImage:
    """Install/build everything a KernelClient needs (used by install.sh and the pytest guard)."""
    return prepare(Path(cache_dir) if cache_dir else None, install=install)


__all__ = ["KernelClient", "KclientResult", "KclientError", "ensure_ready", "EXIT_TIMEOUT", "EXIT_HARNESS"]


def _host_tmp_paths(cwd: str) -> list[str]:
    """Host paths under /tmp that the guest must still see although its /tmp is a fresh tmpfs:
    this repository (guest scripts, GUEST_LIB), the Python environment the guest runs, and the
    command's working directory. A clone under /tmp (as CI may make) would otherwise vanish."""
    repo = Path(__file__).resolve().parents[2]
    keep = []
    for p in (str(repo), os.path.realpath(sys.prefix), os.path.realpath(cwd)):
        if p.startswith("/tmp/") and " " not in p and not any(p == k or p.startswith(k + "/") for k in keep):
            keep = [k for k in keep if not k.startswith(p + "/")] + [p]
    return keep
