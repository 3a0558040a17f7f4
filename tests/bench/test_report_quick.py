"""The benchmark report's harness cannot rot: `bash scripts/bench --smoke` (the one documented
command, at its smallest sizes) runs every scenario once and writes a well-formed REPORT.md with
a row per goal and valid PNG plots. Never a speed: the figures are whatever this machine gives.

It installs what the command installs (NFS-Ganesha via apt as root, matplotlib via the `bench`
extra), so the reference column is exercised too; where Ganesha cannot be installed, the report
must say "not run" for it and the command exit 2, which this test accepts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.goals import GOALS  # noqa: E402
from bench.render import PNG_MAGIC  # noqa: E402

# the plots every smoke run must draw (kernel client: full mode only)
EXPECTED_PLOTS = ("nfs-rs-throughput.png", "ack-latency.png", "cores.png", "save-vs-s3-faults.png",
                  "drain-over-time.png", "restart-read.png", "scale.png", "lookup-getattr-latency.png",
                  "rss-while-saving.png", "rss-during-nfs-rs-throughput.png", "per-request.png",
                  "small-file-anatomy.png")
FULL_ONLY = ("kclient.",)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-results")
    r = subprocess.run(["bash", str(REPO / "scripts" / "bench"), "--smoke", "--out", str(out)], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    return out, r


def test_the_command_finishes_without_a_failed_scenario(report):
    out, r = report
    assert r.returncode in (0, 2), f"exit {r.returncode}\n{r.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    failed = [s for s in results["scenarios"] if s["status"] == "failed"]
    assert not failed, failed
    unmeasured = {gid: g for gid, g in results["goals"].items()
                  if g["status"] == "not run" or (g["status"] == "ran" and not g["reference"])}
    not_run = [s for s in results["scenarios"] if s["status"] == "not run"]
    # exit 2 exactly when something could not run here, and the report says why for each
    assert (r.returncode == 2) == bool(unmeasured or not_run), (r.returncode, unmeasured, not_run)
    assert all(g["note"] or g["reference_note"] for g in unmeasured.values()), unmeasured
    assert all(s["note"] for s in not_run), not_run


def test_every_goal_has_a_row_with_values(report):
    out, _ = report
    text = (out / "REPORT.md").read_text()
    results = json.loads((out / "results.json").read_text())
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    for g in GOALS:
        row = [ln for ln in rows if f"| {g.title} [" in ln.replace("\\|", "|")]
        assert len(row) == 1, (g.id, row)
        res = results["goals"][g.id]
        if g.id.startswith(FULL_ONLY):
            assert res["status"] == "skipped", (g.id, res)
            continue
        if res["status"] == "ran":
            assert len(res["ckptgw"]) >= 3, (g.id, res)
            if res["reference"]:
                assert len(res["figures"]) == len(res["ckptgw"]), (g.id, res)
                assert "| **yes** |" in row[0] or "| **no** |" in row[0] or "| reported |" in row[0], row[0]
    for section in ("## Machine", "## Goals", "## Scenarios", "## CPU seconds per process", "## Plots",
                    "load average at start", "load average at end"):
        assert section in text, section


def test_plots_are_png_and_linked(report):
    out, _ = report
    text = (out / "REPORT.md").read_text()
    for name in EXPECTED_PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, name
        assert f"]({name})" in text, name


def test_ganesha_column_is_filled_when_ganesha_is_installed(report):
    out, _ = report
    results = json.loads((out / "results.json").read_text())
    nfsrs = {gid: g for gid, g in results["goals"].items() if gid.startswith("nfsrs.")}
    if shutil.which("ganesha.nfsd") and os.geteuid() == 0:
        assert all(len(g["reference"]) == len(g["ckptgw"]) >= 3 for g in nfsrs.values()), nfsrs
    else:
        assert all(g["reference_note"].startswith("not run") for g in nfsrs.values()), nfsrs


def test_profiles_have_a_flame_graph_and_name_where_the_samples_are(report):
    """The profile scenario (py-spy, the `bench` extra that scripts/bench installs): per load, a
    busy share per thread, the innermost frames by samples, and a flame graph SVG."""
    out, _ = report
    results = json.loads((out / "results.json").read_text())
    text = (out / "REPORT.md").read_text()
    profiles = results["profiles"]
    assert [p["load"] for p in profiles] == ["small-file saves, 8 clients", "8 streams of 1 MiB durable writes"]
    assert "## Profiles" in text
    for p in profiles:
        assert p["samples"] > 0 and p["top"] and "MainThread" in p["threads"], p
        assert sum(share for _, share in p["top"]) <= 1.0001
        data = (out / p["flame"]).read_text()
        assert p["flame"].endswith(".svg") and "<svg" in data[:1000] and len(data) > 1000, p["flame"]
        assert f"]({p['flame']})" in text

