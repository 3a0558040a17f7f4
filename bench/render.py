"""REPORT.md and its PNG plots (matplotlib, Agg backend: no display needed) from a Run."""
from __future__ import annotations

import re
from pathlib import Path

from .goals import GOALS
from .record import GoalResult, Run
from .stats import Spread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    return f"{v:.3g}" if a < 10 else f"{v:,.1f}" if a < 1000 else f"{v:,.0f}"


def _fig(v: float) -> str:
    """A judged figure: two decimals, so '= 1.00' and '≥ 1.6x' can be read off."""
    return f"{v:.2f}" if abs(v) < 1000 else f"{v:,.0f}"


def _spread(s: Spread | None, fmt=_num) -> str:
    return "—" if s is None else f"{fmt(s.min)} / {fmt(s.median)} / {fmt(s.max)} (n={s.n})"


def _met(r: GoalResult) -> str:
    if r.status != "ran":
        return r.status
    if not r.reference:
        return "not run (no reference)"
    m = r.met
    return "reported" if m is None else ("**yes**" if m else "**no**")


def goal_rows(run: Run) -> list[list[str]]:
    rows = []
    for g in GOALS:
        r = run.results[g.id]
        ck, ref, fig = r.spread("ckptgw"), r.spread("reference"), r.spread("figure")
        if r.status == "ran":
            ref_cell = _num(ref.median) if ref else (r.reference_note or "not run")
            fig_cell = f"{_fig(fig.median)} ({g.figure_name})" if fig else "—"
        else:
            ref_cell = fig_cell = "—"
        note = f" — {r.status}: {r.note}" if r.status != "ran" else (f" — {r.note}" if r.note else "")
        rows.append([g.scenario, f"{g.title} [{g.unit}]{note}", _num(ck.median) if ck else "—",
                     f"{ref_cell} ({g.reference})", fig_cell, g.bar, _met(r), _spread(fig, _fig), _spread(ck)])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in esc])


def markdown(run: Run, meta: dict, facts: dict, plots: list[str]) -> str:
    out = [f"# ckptgw benchmark report (issue 15): {run.mode} mode", ""]
    if meta.get("banner"):
        out += [f"> **{meta['banner']}**", ""]
    over = " **over budget**" if meta["seconds"] > run.sizes.budget_s else ""
    out += [f"`{meta['command']}` — started {meta['started']}, took {meta['seconds']:.0f} s "
            f"(budget for {run.mode} mode: {run.sizes.budget_s // 60} min{over}), exit status {meta['exit']}"
            f" ({meta['exit_meaning']}).", "",
            "Every figure is measured side by side with its reference in the same repetition (fresh servers, "
            "alternating order); ratios are per repetition, and the goal is judged on their median.", "",
            "## Machine", "", _table(["fact", "value"], [[k, v] for k, v in facts.items()]
                                     + [["load average at start (1/5/15 min)", meta["load_start"]],
                                        ["load average at end (1/5/15 min)", meta["load_end"]]]
                                     + ([["CPU other processes used during the run (average)",
                                          f"{meta['others_cpu']:.2f}"]] if "others_cpu" in meta else [])), "",
            f"Sizes ({run.mode}): " + ", ".join(f"{k}={v}" for k, v in vars(run.sizes).items()), "",
            "## Goals", "",
            _table(["scenario", "figure", "ckptgw (median)", "reference (median)", "judged figure (median)",
                    "goal", "met?", "judged figure min / median / max", "ckptgw min / median / max"],
                   goal_rows(run)), "",
            "## Scenarios", "",
            _table(["scenario", "status", "seconds", "note"],
                   [[s["name"], s["status"], f"{s['seconds']:.0f}", s["note"]] for s in run.scenarios]), ""]
    if run.cpu:
        procs = sorted({p for c in run.cpu for p in c["cpu_s"]})
        out += ["## CPU seconds per process", "",
                "utime + stime from /proc/PID/stat over the measured phase (moto runs at SCHED_IDLE and nice 19; its CPU is the "
                "test S3's, not the gateway's).", "",
                _table(["phase", "server", "rep", "wall s"] + [f"{p} CPU s" for p in procs],
                       [[c["scenario"], c["server"], str(c["rep"]), f"{c['wall_s']:.1f}"]
                        + [f"{c['cpu_s'][p]:.1f}" if p in c["cpu_s"] else "" for p in procs] for c in run.cpu]), ""]
    out += _profiles(run)
    out += ["## Plots", ""]
    out += [f"![{p}]({p})" for p in plots] + [""]
    if run.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in run.notes] + [""]
    return "\n".join(out)


def _profiles(run: Run) -> list[str]:
    if not run.profiles:
        return []
    out = ["## Profiles", "",
           "py-spy on `ckptgw serve` (its uploader draining to moto), sampling every thread 100 times a second "
           "without pausing it (bench/flame.py). Busy: samples while running ÷ samples possible over the time "
           "watched, per thread (pools summed, so a pool of 4 can reach 4.0); one core is 1.0 over all threads. "
           "Without pausing the process py-spy cannot always tell a wait from work, so waits "
           "(`select`, `Condition.wait`, a pool's idle `_worker`) still show among the frames.", ""]
    for p in run.profiles:
        out += [f"### {p['load']}", "",
                f"{p['samples']:,} samples over {p['seconds']:.1f} s.", "",
                _table(["thread", "threads", "busy (cores)"],
                       [[name, str(t["threads"]), f"{t['busy']:.2f}"] for name, t in p["threads"].items()]), "",
                _table(["where the samples are (innermost frame)", "share of samples"],
                       [[f, f"{share:.1%}"] for f, share in p["top"]]), "",
                f"![{p['flame']}]({p['flame']})", ""]
    return out


GOAL_STYLES = ({"color": "black", "ls": "--"}, {"color": "dimgrey", "ls": "-."}, {"color": "black", "ls": ":"})
DPI = 110


def _goal_lines(ax, spec: dict, group: str | None, vertical: bool = False) -> None:
    """The plot's goal lines (Run.goal_line) for `group`, each its own style, in the legend."""
    mine = [g for g in spec.get("goals", []) if g["group"] == group]
    for g, style in zip(mine, GOAL_STYLES * len(mine)):
        (ax.axvline if vertical else ax.axhline)(g["value"], label=g["text"], lw=1.3, **style)


def plot_all(run: Run, outdir: Path) -> list[str]:
    """Every series as a PNG: bars (one panel per group, its own unit on the y axis), CDFs and
    timelines (one line per repetition), each with its goal drawn as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for name, spec in run.series.items():
        kind, unit, data = spec["kind"], spec["unit"], spec["data"]
        if not data:
            continue
        if kind == "bars":
            groups = list(data)
            fig, axes = plt.subplots(1, len(groups), figsize=(max(5.0, 4.2 * len(groups)), 4.8),
                                     squeeze=False)
            for ax, group in zip(axes[0], groups):
                labels = list(data[group])
                spreads = [Spread.of(data[group][lb]) for lb in labels]
                med = [s.median for s in spreads]
                err = [[s.median - s.min for s in spreads], [s.max - s.median for s in spreads]]
                ax.bar(range(len(labels)), med, yerr=err, capsize=4, color=[f"C{i}" for i in range(len(labels))])
                ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=9)
                ax.set_title(group, fontsize=10)
                ax.set_ylabel(spec.get("units", {}).get(group, unit), fontsize=10)
                _goal_lines(ax, spec, group)
                if any(g["group"] == group for g in spec.get("goals", [])):
                    ax.legend(fontsize=8, loc="best", framealpha=0.9)
            fig.suptitle(f"{name} (median, bars: min-max over repetitions)", fontsize=11)
        elif kind == "cdf":
            fig, ax = plt.subplots(figsize=(8.0, 5.0))
            for label, xs in data.items():
                if not xs:
                    continue
                xs = sorted(xs)
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{label} (n={len(xs)})")
            ax.set_xscale("log")
            ax.set_xlabel(f"{unit} (log scale)", fontsize=10)
            ax.set_ylabel("fraction of operations", fontsize=10)
            ax.axhline(0.99, color="grey", lw=0.5, ls=":", label="p99")
            _goal_lines(ax, spec, None, vertical=True)
            ax.legend(fontsize=8)
            ax.set_title(f"{name}: CDF", fontsize=11)
        else:
            fig, ax = plt.subplots(figsize=(8.0, 5.0))
            for i, (label, runs) in enumerate(data.items()):
                for j, pts in enumerate(runs):
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{i}", alpha=0.8,
                            label=label if j == 0 else None)
            ax.set_xlabel("seconds", fontsize=10)
            ax.set_ylabel(unit, fontsize=10)
            _goal_lines(ax, spec, None)
            ax.legend(fontsize=8)
            ax.set_title(f"{name} (one line per repetition)", fontsize=11)
        fig.tight_layout()
        fname = f"{slug(name)}.png"
        fig.savefig(outdir / fname, dpi=DPI)
        plt.close(fig)
        files.append(fname)
    return files
