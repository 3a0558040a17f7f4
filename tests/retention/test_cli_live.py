"""The operator's view against a live `ckptgw serve` (embedded S3): checkpoints saved over NFS
(nfs-rs), pin with a reason, `retention plan|apply|log`, `ls`, `lifecycle plan|sync`."""
import json
import textwrap
import time

from click.testing import CliRunner

from appliance.cli import main as cli_main
from testkit.appliance_live import LiveDaemon, nfs_client

CONFIG = """
[[retention.series]]
name = "live"
pattern = "runs/step_{step}"
keep_last = 2
min_age = "0s"
expire_after = "2s"
"""


def test_pin_plan_apply_log_and_lifecycle_through_the_cli(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent(CONFIG))
    d = LiveDaemon(tmp_path, "--export", "/checkpoints:127.0.0.0/8:rw:none:insecure", config=config).start()
    try:
        c = nfs_client(d)
        c.mkdir("runs")
        for step in range(1, 6):
            c.mkdir(f"runs/step_{step:04d}")
            with c.open(f"runs/step_{step:04d}/model.pt", "wb") as f:
                f.write(bytes([step]) * 2048)
        r = d.cli("flush", "--wait", "--timeout", "60", "/checkpoints/runs")
        assert r.exit_code == 0, r.stderr
        r = d.cli("pin", "/checkpoints/runs/step_0001", "--reason", "keep me")
        assert r.exit_code == 0, r.stderr
        time.sleep(2.5)                                   # everything is now past expire_after

        plan = d.cli_json("retention", "plan")
        deletes = sorted(a["checkpoint"] for a in plan["actions"] if a["action"] == "delete")
        assert deletes == ["runs/step_0002", "runs/step_0003"]
        text = d.cli("retention", "plan").stdout
        assert "ACTION" in text.splitlines()[0] and "expire_after=2s" in text

        # without --yes: shows the plan and asks; "n" applies nothing
        r = CliRunner().invoke(cli_main, ["--socket", str(d.socket), "retention", "apply"], input="n\n")
        assert r.exit_code == 1 and "nothing applied" in r.stderr
        assert d.cli_json("ls", "/checkpoints/runs")["entries"].__len__() == 5

        r = d.cli("retention", "apply", "--yes")
        assert r.exit_code == 0 and "applied 5 action(s)" in r.stdout, (r.stdout, r.stderr)   # 2 deletes, 3 tags
        entries = {e["path"]: e for e in d.cli_json("ls", "/checkpoints/runs")["entries"]}
        assert sorted(entries) == ["runs/step_0001", "runs/step_0004", "runs/step_0005"]
        assert entries["runs/step_0001"]["pin_reason"] == "keep me"
        assert "pinned (keep me)" in d.cli("ls", "/checkpoints/runs").stdout

        log = d.cli_json("retention", "log")["entries"]
        assert {e["checkpoint"] for e in log if e.get("action") == "delete" and e["status"] == "done"} == {
            "runs/step_0002", "runs/step_0003"}
        assert any(e.get("action") == "pin" and e.get("reason") == "keep me" for e in log)
        assert "delete" in d.cli("retention", "log").stdout
        events = [e for e in d.log_events() if e.get("event") == "retention_audit"]
        assert any(e.get("action") == "delete" for e in events)

        lc = d.cli_json("lifecycle", "plan")
        assert not lc["in_sync"]
        r = d.cli("lifecycle", "sync", "--yes")
        assert r.exit_code == 0 and "written" in r.stdout, (r.stdout, r.stderr)
        assert d.cli_json("lifecycle", "plan")["in_sync"]
        assert json.dumps(d.cli_json("lifecycle", "plan")["desired"]).count("ckptgw-live-expirable") == 1
    finally:
        d.close()
