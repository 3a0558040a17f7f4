"""The issue-15 benchmark report: every performance goal, measured side by side with its
reference, written to bench/results/REPORT.md with PNG plots and results.json.

    python -m bench.report [--quick | --smoke] [--out bench/results] [--only SCENARIO ...]
    bash scripts/bench [--quick | --smoke] ...       # installs what it needs first

Modes: full (the reported figures; under 30 min on a quiet 2-core host), --quick (small sizes,
under 5 min; the kernel-client scenarios are skipped), --smoke (the smallest sizes, for CI: it
checks the harness, never a speed).

Exit status: 0 every goal of the mode was measured against its reference; 2 some goal or
reference could not run here (e.g. NFS-Ganesha missing), named in the report; 1 a scenario
failed (its error is in the report). Goals missed do not change the exit status: it is a report.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import machine, procs, render  # noqa: E402
from bench.record import MODES, NotRunHere, Run  # noqa: E402
from bench.scenarios import anatomy, kclient, nfs, profile, request, s3, scale  # noqa: E402

# name, function, goal-id prefixes it measures, runs in quick/smoke modes
SCENARIOS = (
    ("nfs-rs throughput, ack latency, cores", nfs.run, ("nfsrs.", "acklat.", "cores."), True),
    ("save vs S3 faults", s3.save_vs_faults, ("s3indep.",), True),
    ("drain", s3.drain, ("drain.",), True),
    ("restart read", s3.restart_read, ("restart.",), True),
    ("scale: start-up and lookups", scale.startup_and_lookup, ("scale.startup", "scale.lookup"), True),
    ("RSS while saving", scale.rss_while_saving, ("scale.rss",), True),
    ("per request: what a COMPOUND costs the server", request.run, ("request.",), True),
    ("small-file anatomy: fdatasyncs and COMPOUNDs per file", anatomy.run, ("anatomy.",), True),
    ("kernel client", kclient.run, ("kclient.",), False),
    ("profile: where the gateway's time goes", profile.run, (), True),
)
EXIT_MEANING = {0: "every goal measured against its reference", 1: "a scenario failed",
                2: "some goal or reference could not run here"}


def _goal_ids(run: Run, prefixes) -> list[str]:
    return [gid for p in prefixes for gid in run.goals_of(p)]


def run_scenarios(run: Run, only: list[str] | None) -> None:
    for name, fn, prefixes, in_small_modes in SCENARIOS:
        gids = _goal_ids(run, prefixes)
        if only and not any(o in name for o in only):
            run.mark(gids, "skipped", "not selected (--only)")
            run.scenarios.append({"name": name, "status": "skipped", "seconds": 0, "note": "--only"})
            continue
        if not (in_small_modes or run.sizes.kclient):
            run.mark(gids, "skipped", f"full mode only (not in {run.mode} mode)")
            run.scenarios.append({"name": name, "status": "skipped", "seconds": 0, "note": f"{run.mode} mode"})
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        status, note = "ran", ""
        try:
            fn(run)
        except NotRunHere as e:
            status, note = "not run", str(e)
            run.mark(gids, "not run", note)
        except Exception as e:
            status, note = "failed", f"{type(e).__name__}: {e}".splitlines()[0][:300]
            traceback.print_exc()
            run.mark(gids, "failed", note)
        secs = time.monotonic() - t0
        print(f"   {status} in {secs:.0f} s {note}", file=sys.stderr, flush=True)
        run.scenarios.append({"name": name, "status": status, "seconds": secs, "note": note})


def exit_status(run: Run) -> int:
    if any(s["status"] == "failed" for s in run.scenarios):
        return 1
    if any(s["status"] == "not run" for s in run.scenarios):
        return 2
    for r in run.results.values():
        if r.status == "not run" or (r.status == "ran" and not r.reference):
            return 2
    return 0


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in machine.load_average())


OTHERS_LOADED = 0.25     # CPUs: other processes' average use during a run that flags it loaded


def cpu_sample(proc_stat: str | None = None, ours: float | None = None
               ) -> tuple[float, float, float]:
    """(monotonic seconds, CPU seconds every process of the host has run since boot, CPU
    seconds of this process and its descendants); `proc_stat` and `ours` stand for
    /proc/stat's text and procs.cpu_seconds(our pid) in tests.

    The host's processes: user + nice + system of /proc/stat's "cpu" line (guest time is
    inside user). Not irq and softirq: interrupt time is in no process's times, and here it
    is mostly the benchmark's own loopback traffic; not steal (other machines'). Ours: our
    utime + stime, our live descendants' and, through cutime + cstime, every descendant
    reaped (the gateways, moto, Ganesha, the kernel client's qemu and the helper scripts a
    scenario starts are its children, waited for: their time moves from live to reaped)."""
    if proc_stat is None:
        with open("/proc/stat") as f:
            proc_stat = f.read()
    if ours is None:
        ours = procs.cpu_seconds(os.getpid())
    fields = proc_stat.split("\n", 1)[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"not /proc/stat's first line: {fields[:1]}")
    user, nice, system = (int(x) for x in fields[1:4])
    return time.monotonic(), (user + nice + system) / os.sysconf("SC_CLK_TCK"), ours


def others_cpu(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """How many CPUs processes other than this one and its descendants used on average
    between two cpu_sample()s. Kernel threads count as others (among them the benchmark's
    writeback and journal commits: small beside OTHERS_LOADED); so does a descendant that
    escapes its parent (none does here)."""
    (t0, host0, ours0), (t1, host1, ours1) = start, end
    return max(0.0, (host1 - host0) - (ours1 - ours0)) / max(t1 - t0, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where REPORT.md and plots go")
    ap.add_argument("--workdir", default="/var/tmp", help="scratch space for stores and servers")
    ap.add_argument("--only", action="append", help="run only scenarios whose name contains this")
    ap.add_argument("--label", default="", help="a remark for the report's banner (e.g. 'loaded machine')")
    args = ap.parse_args(argv)
    mode_name = args.mode or "full"
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in [*args.out.glob("*.png"), *args.out.glob("*.svg"), args.out / "REPORT.md",
                  args.out / "results.json"]:
        stale.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ckptgw-report-", dir=args.workdir))
    run = Run(mode_name, MODES[mode_name], work, args.out)
    started = datetime.now(timezone.utc)
    load_start, t0, cpu_start = _load(), time.monotonic(), cpu_sample()
    facts = machine.facts()
    try:
        run_scenarios(run, args.only)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds, others = time.monotonic() - t0, others_cpu(cpu_start, cpu_sample())
    code = exit_status(run)
    banner = []
    if mode_name != "full":
        banner.append(f"{mode_name} mode: small sizes, not the reported figures")
    if others > OTHERS_LOADED:
        banner.append(f"the host was loaded: other processes used {others:.2f} CPU on average "
                      f"(of {os.cpu_count()}; over {OTHERS_LOADED} flags a run)")
    if args.label:
        banner.append(args.label)
    meta = {"command": "python -m bench.report" + (f" --{mode_name}" if mode_name != "full" else ""),
            "started": started.strftime("%Y-%m-%d %H:%M UTC"), "seconds": seconds, "exit": code,
            "exit_meaning": EXIT_MEANING[code], "load_start": load_start, "load_end": _load(),
            "others_cpu": round(others, 3),
            "banner": "; ".join(banner)}
    plots = render.plot_all(run, args.out)
    (args.out / "REPORT.md").write_text(render.markdown(run, meta, facts, plots))
    (args.out / "results.json").write_text(json.dumps({
        "meta": meta, "facts": facts, "sizes": asdict(run.sizes), "scenarios": run.scenarios, "cpu": run.cpu,
        "notes": run.notes, "profiles": run.profiles, "series": run.series, "goals": {gid: {"status": r.status, "note": r.note, "reference_note": r.reference_note,
                                            "ckptgw": r.ckptgw, "reference": r.reference, "figures": r.figures,
                                            "met": r.met} for gid, r in run.results.items()}}, indent=1))
    print(f"wrote {args.out / 'REPORT.md'} and {len(plots)} plot(s); exit {code}: {EXIT_MEANING[code]}",
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
