"""What one report run collects: its sizes (per mode), the values of every goal per repetition,
series for the plots, CPU seconds per process, and what could not run and why."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .goals import BY_ID, GOALS, Goal, sign, threshold
from .stats import Spread

MiB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    reps: int                  # repetitions of every side-by-side comparison
    stream_mib: int            # the 1-stream file (8 streams: 1/8 each)
    small_seconds: float       # per small-file loop
    acklat_writes: int         # FILE_SYNC writes (and local fdatasyncs) per repetition
    save_shards: int           # checkpoint save: shards, one client each
    save_shard_mib: int
    drain_files: int
    drain_file_mib: int
    restart_mib: int           # the checkpoint read back after a restart
    scale_files: int           # "many files" (the 1M in full mode) vs 1k
    lookup_probes: int
    rss_save_mib: int          # saved while the gateway's RSS is sampled
    kclient: bool              # run the qemu kernel-client scenarios
    kclient_dd_mib: int = 256
    budget_s: int = 0          # the wall-clock budget the issue sets for the mode


MODES = {
    "full": Sizes(reps=3, stream_mib=256, small_seconds=5, acklat_writes=1000, save_shards=8, save_shard_mib=32,
                  drain_files=4, drain_file_mib=32, restart_mib=256, scale_files=1_000_000, lookup_probes=2000,
                  rss_save_mib=8192, kclient=True, kclient_dd_mib=256, budget_s=30 * 60),
    "quick": Sizes(reps=3, stream_mib=32, small_seconds=1.5, acklat_writes=200, save_shards=4, save_shard_mib=8,
                   drain_files=2, drain_file_mib=16, restart_mib=32, scale_files=20_000, lookup_probes=300,
                   rss_save_mib=256, kclient=False, budget_s=5 * 60),
    "smoke": Sizes(reps=3, stream_mib=8, small_seconds=0.5, acklat_writes=50, save_shards=2, save_shard_mib=8,
                   drain_files=1, drain_file_mib=16, restart_mib=16, scale_files=3_000, lookup_probes=100,
                   rss_save_mib=64, kclient=False, budget_s=3 * 60),
}
SCALE_BASE_FILES = 1000


def in_turn(sides, rep: int) -> list:
    """The order of `sides` in repetition `rep`: as given in even repetitions, reversed in odd
    ones, so a drift in the host's load (and the writeback one side leaves behind) hits every
    side alike."""
    sides = list(sides)
    return sides if rep % 2 == 0 else sides[::-1]


class NotRunHere(Exception):
    """A scenario cannot run on this host (a tool is missing): reported as "not run", exit 2."""


@dataclass
class GoalResult:
    goal: Goal
    ckptgw: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    status: str = "not run"          # ran | not run | skipped | failed
    note: str = ""                   # why not run / skipped / failed, or a remark
    reference_note: str = ""         # e.g. why the reference column is empty

    @property
    def figures(self) -> list[float]:
        return [self.goal.figure(c, r) for c, r in zip(self.ckptgw, self.reference)]

    def spread(self, which: str) -> Spread | None:
        return Spread.of(self.figures if which == "figure" else getattr(self, which))

    @property
    def met(self) -> bool | None:
        s = self.spread("figure")
        if s is None or self.goal.met is None:
            return None
        return self.goal.met(s.median)


@dataclass
class Run:
    mode: str
    sizes: Sizes
    workdir: Path
    outdir: Path
    results: dict[str, GoalResult] = field(default_factory=lambda: {g.id: GoalResult(g) for g in GOALS})
    series: dict[str, dict] = field(default_factory=dict)      # plot name -> data
    cpu: list[dict] = field(default_factory=list)              # per server run: CPU s per process
    scenarios: list[dict] = field(default_factory=list)        # name, status, note, seconds
    notes: list[str] = field(default_factory=list)
    profiles: list[dict] = field(default_factory=list)         # bench/flame.py summaries

    def add(self, goal_id: str, ckptgw: float, reference: float | None = None) -> None:
        """One repetition's side-by-side pair (reference None: the reference did not run)."""
        r = self.results[goal_id]
        r.status = "ran"
        r.ckptgw.append(ckptgw)
        if reference is not None:
            r.reference.append(reference)

    def reference_missing(self, goal_ids, why: str) -> None:
        for gid in goal_ids:
            self.results[gid].reference_note = why

    def mark(self, goal_ids, status: str, note: str) -> None:
        """Goals a scenario could not measure (status 'not run', 'skipped' or 'failed')."""
        for gid in goal_ids:
            r = self.results[gid]
            if r.status == "ran" and status == "failed":
                r.note = f"failed after {len(r.ckptgw)} repetition(s): {note}"
                continue
            r.status, r.note = status, note

    def goals_of(self, scenario_goal_prefix: str) -> list[str]:
        return [gid for gid in BY_ID if gid.startswith(scenario_goal_prefix)]

    def bar(self, plot: str, unit: str, group: str, label: str, value: float) -> None:
        """One repetition's value of bar `label` within `group` (plotted as median, min-max);
        `unit` is the group's (its y axis)."""
        p = self.series.setdefault(plot, {"kind": "bars", "unit": unit, "data": {}})
        p.setdefault("units", {})[group] = unit
        p["data"].setdefault(group, {}).setdefault(label, []).append(value)

    def median(self, plot: str, label: str, group: str | None = None) -> float | None:
        """The median of bar `label` in `group` (bars) or of the samples of `label` (CDF)."""
        data = self.series.get(plot, {}).get("data", {})
        values = (data.get(group, {}) if group is not None else data).get(label)
        return statistics.median(values) if values else None

    def goal_line(self, plot: str, value: float | None, text: str, group: str | None = None) -> None:
        """A goal drawn into a plot as a dashed line at `value`: across bar group `group`, or
        across a CDF's x axis or a timeline's y axis (group None). Nothing when value is None
        (its reference was not measured)."""
        if value is not None and plot in self.series:
            self.series[plot].setdefault("goals", []).append({"group": group, "value": value, "text": text})

    def ratio_goal_line(self, plot: str, gid: str, of_label: str, group: str | None = None,
                        subject: str = "") -> None:
        """Goal `gid`'s bar drawn as a line: its ratio times the median of `of_label` (in bar
        group `group`), labelled "goal: [subject] ≥ x times of_label"."""
        x, ref = threshold(gid), self.median(plot, of_label, group)
        lead = f"{subject} " if subject else ""
        self.goal_line(plot, ref and ref * x, f"goal: {lead}{sign(gid)} {x:g}x {of_label}", group)

    def samples(self, plot: str, unit: str, label: str, values) -> None:
        """Latency samples of `label` (plotted as a CDF)."""
        p = self.series.setdefault(plot, {"kind": "cdf", "unit": unit, "data": {}})
        p["data"].setdefault(label, []).extend(values)

    def timeline(self, plot: str, unit: str, label: str, points) -> None:
        """[(seconds, value)] of one repetition (plotted as a line per repetition)."""
        p = self.series.setdefault(plot, {"kind": "timeline", "unit": unit, "data": {}})
        p["data"].setdefault(label, []).append([(float(t), float(v)) for t, v in points])
