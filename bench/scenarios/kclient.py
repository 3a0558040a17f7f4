"""The Linux kernel client (qemu guest, testkit/kclient) via bench/kclient_compare.run_one: dd write
conv=fsync, dd read after drop_caches, a sharded checkpoint save; ckptgw (`python -m nfsd`, the
server kclient_compare drives) vs NFS-Ganesha, alternating per repetition. Full mode only."""
from __future__ import annotations

import argparse

from ..procs import quiesce_disk
from ..record import Run, in_turn
from ..stack import ganesha_missing

GOALS = {"dd_write_MBps": "kclient.dd_write", "dd_read_MBps": "kclient.dd_read", "ckpt_save_MBps": "kclient.ckpt_save"}


def run(run: Run) -> None:
    from testkit.kclient import KclientUnavailable
    from testkit.kclient.vm import ensure_ready

    from .. import kclient_compare

    try:
        ensure_ready()
    except KclientUnavailable as e:
        run.mark(GOALS.values(), "not run", f"kernel-client harness unavailable: {e}")
        return
    missing = ganesha_missing()
    if missing:
        run.reference_missing(GOALS.values(), f"not run: {missing}")
    args = argparse.Namespace(dd_mib=run.sizes.kclient_dd_mib, files=8, file_mib=32, parallel=4, vers="4.1",
                              timeout=1800)
    kinds = ["ckptgw"] + ([] if missing else ["ganesha"])
    for rep in range(run.sizes.reps):
        got = {}
        for kind in in_turn(kinds, rep):
            quiesce_disk()
            wd = run.workdir / f"kclient{rep}"
            wd.mkdir(parents=True, exist_ok=True)
            got[kind] = kclient_compare.run_one(kind, args, wd)
        for key, gid in GOALS.items():
            ref = got.get("ganesha", {}).get(key)
            run.add(gid, got["ckptgw"][key], ref)
            run.bar("kernel client", "MB/s", key.replace("_MBps", ""), "ckptgw", got["ckptgw"][key])
            if ref is not None:
                run.bar("kernel client", "MB/s", key.replace("_MBps", ""), "NFS-Ganesha", ref)
    for key, gid in GOALS.items():
        run.ratio_goal_line("kernel client", gid, "NFS-Ganesha", key.replace("_MBps", ""))
