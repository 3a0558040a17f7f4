"""The anatomy of a small-file save (issue 37: "fdatasyncs and COMPOUNDs per file"): one nfs-rs
client saves small files (bench/nfsrs_throughput.py `save_small_file`) through a counting proxy
against `ckptgw serve` and NFS-Ganesha, while strace attached to the server counts its
fdatasync / fsync calls (bench/small_file_anatomy.py `wire_counts`). Reported, no bar: the
issue asks for the figures; the in-process breakdown (which ops, which syncs, crossings, where
the wall time goes) is `python -m bench.small_file_anatomy`."""
from __future__ import annotations

import shutil

from ..procs import quiesce_disk
from ..record import NotRunHere, Run, in_turn
from ..small_file_anatomy import wire_counts
from ..stack import ganesha, ganesha_missing, gateway, s3_server

PLOT = "small-file anatomy"


def run(run: Run) -> None:
    if shutil.which("strace") is None:
        raise NotRunHere("strace is not installed")
    missing = ganesha_missing()
    if missing:
        run.reference_missing(run.goals_of("anatomy."), f"not run: {missing}")
    files = max(30, int(run.sizes.small_seconds * 40))
    for rep in range(run.sizes.reps):
        got: dict[str, dict] = {}
        for side in in_turn(["gw", "ganesha"], rep):
            quiesce_disk()
            if side == "gw":
                with s3_server() as s3, gateway(run.workdir / f"anatomy-gw{rep}", s3.endpoint) as gw:
                    got["gw"] = wire_counts(gw.port, gw.pid, files, run.workdir, tag=f"anatomy-gw{rep}")
            elif not missing:
                with ganesha(run.workdir / f"anatomy-ganesha{rep}") as g:
                    got["ganesha"] = wire_counts(g.port, g.pid, files, run.workdir, tag=f"anatomy-ga{rep}")
        gw, ref = got["gw"], got.get("ganesha")
        run.add("anatomy.fdatasyncs", gw["fdatasyncs"], ref and ref["fdatasyncs"])
        run.add("anatomy.compounds", gw["COMPOUNDs"], ref and ref["COMPOUNDs"])
        for name, row in (("ckptgw", gw), ("NFS-Ganesha", ref)):
            if row is None:
                continue
            run.bar(PLOT, "per file", "COMPOUNDs", name, row["COMPOUNDs"])
            for kind in ("data", "dir", "index"):
                run.bar(PLOT, "per file", f"syncs: {kind}", name, row.get(f"syncs: {kind}", 0.0))
        if rep == 0:
            run.notes.append("small-file anatomy, per file (first repetition): ckptgw "
                             + ", ".join(f"{k} {v:.2f}" for k, v in gw.items())
                             + ("" if ref is None else "; NFS-Ganesha "
                                + ", ".join(f"{k} {v:.2f}" for k, v in ref.items())))
