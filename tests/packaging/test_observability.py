"""The alert rules and the Grafana dashboard (ansible/roles/ckptgw/files/, their one home): the
alert rules load in promtool and fire as their unit test says; the dashboard has the shape Grafana
needs and valid PromQL; every metric either names is one the daemon exposes (a renamed metric
breaks this test, not a production alert)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE_FILES = REPO / "ansible" / "roles" / "ckptgw" / "files"
RULES = ROLE_FILES / "ckptgw-alerts.yml"
RULES_TEST = Path(__file__).resolve().parent / "ckptgw-alerts.test.yml"
DASHBOARD = ROLE_FILES / "ckptgw-dashboard.json"

# What Grafana needs to import and draw the dashboard (its full schema is a TypeScript/CUE model
# with no published JSON Schema): a uid and title, panels with unique ids, a type, a position,
# a Prometheus datasource and targets whose expr is PromQL, and template variables with names.
DATASOURCE = {"type": "object", "required": ["type", "uid"],
              "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string", "minLength": 1}}}
SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array", "items": {
            "type": "object", "required": ["name", "type"],
            "properties": {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                           "type": {"enum": ["datasource", "query", "custom", "constant", "interval"]}}}}}},
        "panels": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["id", "type", "title", "gridPos", "datasource", "targets"],
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "type": {"enum": ["timeseries", "stat", "gauge", "bargauge", "table", "heatmap"]},
                "title": {"type": "string", "minLength": 1},
                "datasource": DATASOURCE,
                "gridPos": {"type": "object", "required": ["x", "y", "w", "h"], "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 23},
                    "y": {"type": "integer", "minimum": 0},
                    "w": {"type": "integer", "minimum": 1, "maximum": 24},
                    "h": {"type": "integer", "minimum": 1}}},
                "targets": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["refId", "expr", "datasource"],
                    "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"},
                                   "expr": {"type": "string", "minLength": 1},
                                   "datasource": DATASOURCE}}}}}},
    },
}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: bash scripts/install-system-deps.sh installs it"
    return path


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {"CkptgwDown", "CkptgwTargetMissing", "CkptgwWritersStalled", "CkptgwRestartFlapping",
            "CkptgwDirtyBytesGrowing", "CkptgwOldestDirtyDataOld", "CkptgwUploadErrors", "CkptgwCacheNearFull",
            "CkptgwS3Throttling", "CkptgwPairDegraded", "CkptgwPairFenceStateUnknown"} <= names


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def markdown_anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (lower case, punctuation dropped,
    spaces as dashes)."""
    anchors = set()
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_every_alert_has_a_runbook_in_operations_md():
    docs = REPO / "docs" / "operations.md"
    anchors = markdown_anchors(docs.read_text())
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md" and (REPO / path) == docs, (rule["alert"], url)
        assert anchor == rule["alert"].lower() and anchor in anchors, (rule["alert"], url)


def test_every_alert_is_unit_tested_firing_and_not_firing():
    cases = [case for t in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in t["alert_rule_test"]]
    for name in {r["alert"] for r in alert_rules()}:
        mine = [c for c in cases if c["alertname"] == name]
        assert [c for c in mine if c["exp_alerts"]], f"{name}: no test in which it fires"
        assert [c for c in mine if not c["exp_alerts"]], f"{name}: no test in which it stays quiet"


def test_promtool_unit_tests_of_the_alerts_pass():
    r = subprocess.run([promtool(), "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60,
                       cwd=RULES_TEST.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_dashboard_has_what_grafana_needs():
    d = dashboard()
    jsonschema.validate(d, SCHEMA)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in d["panels"]:
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
    variables = {v["name"] for v in d["templating"]["list"]}
    used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", json.dumps(d["panels"]))) - {"__rate_interval", "__interval"}
    assert used <= variables, used - variables


def test_dashboard_shows_s3_latency_failures_and_the_uploader_limiter():
    exprs = dashboard_exprs()
    def uses(*parts):
        return [e for e in exprs if all(re.search(p, e) for p in parts)]
    assert uses(r"histogram_quantile\(0\.99,", r"by \(le, operation\)", r"ckptgw_s3_request_duration_seconds_bucket")
    assert uses(r"by \(operation, code\)", r"ckptgw_s3_request_failures_total")
    for name in ("ckptgw_upload_concurrency_limit", "ckptgw_upload_requests_in_flight",
                 "ckptgw_cache_read_through_bytes_total", "ckptgw_cache_evicted_bytes_total"):
        assert uses(name), name


def test_dashboard_queries_are_valid_promql(tmp_path):
    """promtool parses each expr as a recording rule (Grafana's variables replaced by values)."""
    def concrete(expr: str) -> str:
        return expr.replace("$__rate_interval", "5m").replace("$instance", ".*")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"ckptgw:dashboard_expr_{i}", "expr": concrete(e)} for i, e in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def exposed_names(text: str) -> set[str]:
    """Series names the exposition declares (# TYPE lines: a labelled family with no sample yet,
    such as NFS ops before the first client, still declares itself)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names |= {name.removesuffix("_total") + s for s in suffixes.get(kind, ("",))}
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return names


def test_every_metric_used_is_exposed_by_the_daemon(tmp_path):
    from testkit.appliance_live import LiveDaemon
    # one of an HA pair, so the ckptgw_pair_* series exist (no DRBD here: state unknown, degraded)
    daemon = LiveDaemon(tmp_path, "--pair-drbd-device", "/dev/drbd0")
    try:
        daemon.start()
        host_port = daemon.status["metrics"]
        with urllib.request.urlopen(f"http://{host_port}/metrics", timeout=30) as resp:
            exposed = exposed_names(resp.read().decode())
    finally:
        daemon.close()
    used = set()
    for expr in dashboard_exprs() + rule_exprs():
        used |= set(re.findall(r"\b(?:ckptgw|process)_[a-z0-9_]+\b", expr))
    missing = used - exposed
    assert not missing, f"used by the rules or the dashboard but not exposed: {sorted(missing)}; exposed: {sorted(exposed)}"
