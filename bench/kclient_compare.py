#!/usr/bin/env python3
"""ckptgw vs NFS-Ganesha through the real Linux NFSv4 client (testkit/kclient VM), same run.

For each server: one VM boot that does a dd write (bs=1M, conv=fsync), a dd read after
drop_caches, and a checkpoint save (FILES files, PARALLEL writers, each name.tmp + fsync + rename
inside step_0.tmp/, then the directory renamed to step_0/); see bench/kclient_guest.sh.
Prints MB/s and seconds per server and the ckptgw/ganesha ratio (>1 means ckptgw is faster).

    python3 bench/kclient_compare.py [--dd-mib 512] [--files 8 --file-mib 32 --parallel 4]
                                     [--servers ckptgw,ganesha] [--vers 4.1] [--json out.json]

Numbers are from a TCG-emulated guest (about 30 MB/s for Ganesha on a 2-core host, see
testkit/kclient/README.md): compare the ratio, not the absolute values. One VM at a time.
Ganesha comes from `scripts/install-system-deps.sh --bench` (installed on first use).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.ckptgw_server import EXPORT, CkptgwServer  # noqa: E402  (the server command lives there)
from testkit.loopback import free_port  # noqa: E402
from testkit.kclient import KernelClient  # noqa: E402
from testkit.kclient.ganesha import GaneshaServer  # noqa: E402

GUEST_SCRIPT = REPO / "bench" / "kclient_guest.sh"


def run_one(kind: str, args: argparse.Namespace, workdir: Path) -> dict:
    root = workdir / kind
    root.mkdir()
    server = CkptgwServer(root, free_port()) if kind == "ckptgw" else GaneshaServer(root, free_port(), pseudo=EXPORT)
    server.start()
    try:
        kc = KernelClient(server.port, export=EXPORT, vers=args.vers)
        env = {"DD_MIB": args.dd_mib, "CKPT_FILES": args.files, "CKPT_FILE_MIB": args.file_mib,
               "CKPT_PARALLEL": args.parallel}
        res = kc.run(f"sh {GUEST_SCRIPT}", timeout=args.timeout, env=env, cwd=str(REPO))
    finally:
        server.stop()
    if res.rc != 0:
        raise SystemExit(f"{kind}: guest benchmark failed\n{res.describe()}\n--- server log:\n{server.log_tail()}")
    out = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "RESULT":
            out[parts[1]] = float(parts[2])
    missing = {"dd_write_s", "dd_read_s", "ckpt_save_s"} - out.keys()
    if missing:
        raise SystemExit(f"{kind}: no result for {sorted(missing)}\n{res.describe()}")
    ckpt_mib = args.files * args.file_mib
    return {
        "dd_write_MBps": args.dd_mib * 1.048576 / out["dd_write_s"], "dd_write_s": out["dd_write_s"],
        "dd_read_MBps": args.dd_mib * 1.048576 / out["dd_read_s"], "dd_read_s": out["dd_read_s"],
        "ckpt_save_MBps": ckpt_mib * 1.048576 / out["ckpt_save_s"], "ckpt_save_s": out["ckpt_save_s"],
        "boot_s": res.timings.get("boot_s"),
    }


def table(results: dict, args: argparse.Namespace) -> str:
    kinds = list(results)
    rows = [("metric", *kinds, "ratio ckptgw/ganesha" if {"ckptgw", "ganesha"} <= set(kinds) else "")]
    labels = {
        "dd_write_MBps": f"dd write {args.dd_mib} MiB conv=fsync (MB/s)",
        "dd_write_s": "  seconds",
        "dd_read_MBps": f"dd read {args.dd_mib} MiB after drop_caches (MB/s)",
        "dd_read_s": "  seconds",
        "ckpt_save_MBps": f"checkpoint {args.files}x{args.file_mib} MiB, {args.parallel} writers (MB/s)",
        "ckpt_save_s": "  seconds",
    }
    for key, label in labels.items():
        vals = [results[k][key] for k in kinds]
        ratio = ""
        if {"ckptgw", "ganesha"} <= set(kinds):
            a, b = results["ckptgw"][key], results["ganesha"][key]
            # for seconds a smaller value is better: report speed-up either way (>1 = ckptgw faster)
            ratio = f"{(a / b if key.endswith('MBps') else b / a):.2f}x"
        rows.append((label, *(f"{v:.1f}" if key.endswith("MBps") else f"{v:.2f}" for v in vals), ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dd-mib", type=int, default=512)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mib", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--servers", default="ckptgw,ganesha")
    ap.add_argument("--vers", default="4.1", choices=["4.1", "4.2"])
    ap.add_argument("--timeout", type=float, default=1800, help="per VM boot, seconds")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    kinds = [k for k in args.servers.split(",") if k]
    if not kinds or set(kinds) - {"ckptgw", "ganesha"}:
        ap.error("--servers takes ckptgw and/or ganesha")
    results = {}
    with tempfile.TemporaryDirectory(prefix="kclient-compare-") as tmp:
        for kind in kinds:
            print(f"== {kind}", file=sys.stderr, flush=True)
            results[kind] = run_one(kind, args, Path(tmp))
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
