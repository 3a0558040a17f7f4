"""A throw-away NFS-Ganesha (Debian nfs-ganesha + nfs-ganesha-vfs) on 127.0.0.1:PORT, NFSv4 only:
the reference server for bench/kclient_compare.py and for checking the e2e scenarios themselves
(CKPTGW_E2E_SERVER=ganesha).

No rpcbind/NLM/RQUOTA/UDP; `Graceless = true` so OPENs work at once after a (re)start instead of
waiting out a 90 s grace period. Stops only the process it started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from testkit.loopback import listening

from .childserver import ChildServer
from .image import INSTALL_SH, KclientUnavailable

VFS_FSAL = "/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so"

CONFIG = """\
NFS_CORE_PARAM {{
    NFS_Port = {port};
    Bind_addr = 127.0.0.1;
    Protocols = 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSv4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = {root}/recov;
    Minor_Versions = 1, 2;
    Delegations = false;
}}
EXPORT {{
    Export_Id = 1;
    Path = {root}/export;
    Pseudo = {pseudo};
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 4;
    Transports = TCP;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
"""


def ensure_ganesha() -> None:
    if shutil.which("ganesha.nfsd") and os.path.exists(VFS_FSAL):
        return
    r = subprocess.run(["bash", str(INSTALL_SH), "--bench"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode or not shutil.which("ganesha.nfsd"):
        raise KclientUnavailable(f"cannot install nfs-ganesha: {r.stdout.strip()[-1000:]}")




class GaneshaServer(ChildServer):
    """ganesha.nfsd exporting <root>/export as <pseudo> on 127.0.0.1:port."""
    STOP_WAIT = 15.0
    LOG_TAIL_LINES = 40

    def __init__(self, root: str | os.PathLike, port: int, pseudo: str = "/checkpoints"):
        self.root, self.port, self.pseudo = Path(root), port, pseudo
        self.export_dir = self.root / "export"
        self.log_path = self.root / "ganesha.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> None:
        ensure_ganesha()
        if listening(self.port):
            raise RuntimeError(f"port {self.port} is already in use")
        for d in ("export", "recov"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        conf = self.root / "ganesha.conf"
        conf.write_text(CONFIG.format(port=self.port, root=self.root, pseudo=self.pseudo))
        with open(self.root / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                ["ganesha.nfsd", "-F", "-f", str(conf), "-L", str(self.log_path), "-p", str(self.root / "ganesha.pid")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ganesha did not start: {self.log_tail()}")
            time.sleep(0.1)


    def __enter__(self) -> "GaneshaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
