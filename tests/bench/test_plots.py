"""The report's plots as issue 39 asks: each bar panel with its own unit, the goal drawn as a
line where the goal has a bar, nothing drawn for a goal whose reference did not run."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.goals import threshold
from bench.record import Run
from bench.render import PNG_MAGIC, plot_all

pytest.importorskip("matplotlib")


def test_bar_panels_keep_their_units_and_goals_become_lines(tmp_path: Path):
    run = Run(mode="quick", sizes=None, workdir=tmp_path, outdir=tmp_path)
    for v in (100.0, 110.0, 120.0):
        run.bar("throughput", "MB/s", "write 1 stream", "ckptgw", v)
        run.bar("throughput", "MB/s", "write 1 stream", "NFS-Ganesha", 2 * v)
        run.bar("throughput", "files/s", "small files", "ckptgw", v / 10)
    assert run.series["throughput"]["units"] == {"write 1 stream": "MB/s", "small files": "files/s"}
    assert run.median("throughput", "NFS-Ganesha", "write 1 stream") == 220.0
    assert threshold("nfsrs.write1") == 1.0
    run.ratio_goal_line("throughput", "nfsrs.write1", "NFS-Ganesha", "write 1 stream")
    run.ratio_goal_line("throughput", "nfsrs.small1", "NFS-Ganesha", "small files")   # no reference: no line
    run.samples("ack", "ms", "local", [1.0, 2.0, 3.0])
    run.goal_line("ack", 5.0, "goal: p99 ≤ local p99 + 2 ms")
    run.goal_line("not a plot", 1.0, "ignored")
    assert run.series["throughput"]["goals"] == [
        {"group": "write 1 stream", "value": 220.0, "text": "goal: ≥ 1x NFS-Ganesha"}]
    assert run.series["ack"]["goals"] == [{"group": None, "value": 5.0, "text": "goal: p99 ≤ local p99 + 2 ms"}]
    files = plot_all(run, tmp_path)
    assert files == ["throughput.png", "ack.png"]
    for name in files:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
