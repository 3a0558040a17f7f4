"""The README's first screen states what the committed benchmark report measured, and nothing else
(issue 39): its table's date, commit, ratios and verdicts are those of bench/results/results.json.
A new report committed without the README's table following it fails here; so does a figure typed
into the table that the report does not hold. Reads files only: never a speed of this machine."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## What the latest benchmark report measured"

# README row (its first cell starts with this) -> the report's goals, in the order the row's
# "ratio" column lists them
ROWS = {
    "nfs-rs: write, 1 stream": ["nfsrs.write1"],
    "nfs-rs: write, 8 streams": ["nfsrs.write8"],
    "nfs-rs: read": ["nfsrs.read1"],
    "nfs-rs: small-file saves": ["nfsrs.small1", "nfsrs.small8"],
    # one verdict per row: each kernel-client figure and each cores figure has met or missed its
    # goal apart from the others in some report (2026-11-28, 2026-11-29)
    "Linux kernel client in a qemu guest: dd write": ["kclient.dd_write"],
    "Linux kernel client in a qemu guest: sharded save": ["kclient.ckpt_save"],
    "Linux kernel client in a qemu guest: dd read": ["kclient.dd_read"],
    "p99 ack": ["acklat.p99"],
    "server CPU per COMPOUND": ["request.compound_cpu"],
    "server CPU per RPC NULL": ["request.null_cpu"],
    "server user CPU per MiB": ["request.user_cpu_per_mib"],
    "thread crossings": ["request.crossings_write", "request.crossings_read"],
    "3 checkpoint saves": ["s3indep.faulty_over_clean"],
    "the same shards uploaded by boto3": ["s3indep.boto3_over_gateway"],
    "uploader drain rate": ["drain.rate"],
    "bytes PUT": ["drain.amplification"],
    "peak RSS": ["scale.rss"],
    "all cores, 8 write streams": ["cores.write8_of_bound"],
    "all cores, 8-client small files": ["cores.small8_of_bound"],
    "read of the last checkpoint": ["restart.read"],
}


def _report():
    return json.loads((ROOT / "bench" / "results" / "results.json").read_text())


def _table():
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md lacks the section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return section, rows[0], rows[2:]          # header, separator, rows


def _median(goal: dict) -> float:
    return statistics.median(goal["figures"])


def _same(shown: str, value: float) -> bool:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9


def test_the_table_is_the_committed_reports():
    report = _report()
    section, header, rows = _table()
    assert header == ["measured", "ckptgw", "reference", "ratio", "goal"], header
    assert report["meta"]["started"][:10] in section, "the README's table names another report's date"
    assert f"commit {report['facts']['ckptgw commit']}" in section, "the README's table names another commit"
    seen = set()
    for row in rows:
        label, ckptgw, _reference, ratio, verdict = row
        key = next((k for k in ROWS if label.startswith(k)), None)
        assert key, f"README row {label!r} is not one the report measures (add it to ROWS)"
        seen.add(key)
        goals = [report["goals"][g] for g in ROWS[key]]
        assert all(g["status"] == "ran" for g in goals), (label, [g["status"] for g in goals])
        if ratio:
            shown = re.findall(r"\d+(?:\.\d+)?", ratio)
            assert len(shown) == len(goals), (label, ratio)
            for s, g, name in zip(shown, goals, ROWS[key]):
                assert _same(s, _median(g)), f"{label}: {s} shown, the report's median {name} is {_median(g):.3f}"
        else:                                  # a bar on the figure itself (peak RSS)
            (s,) = re.findall(r"\d+(?:\.\d+)?", ckptgw)
            assert _same(s, _median(goals[0])), (label, ckptgw, _median(goals[0]))
        met = {g["met"] for g in goals}
        assert len(met) == 1, (label, "one verdict per row")
        expect = {True: "met", False: "not met", None: "reported"}[met.pop()]
        assert verdict.endswith(expect) and not (expect == "met" and "not met" in verdict), (label, verdict, expect)
    assert seen == set(ROWS), sorted(set(ROWS) - seen)
