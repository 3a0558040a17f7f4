"""Every `ckptgw` admin command against a live daemon (embedded S3), human and --json."""
from __future__ import annotations

import importlib.util
import json
import os
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.appliance_live import LiveDaemon, nfs_client

pytestmark = pytest.mark.timeout(300)

A = os.urandom(100_000)
B = os.urandom(3 << 20)
C = b"step two\n" * 1000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = LiveDaemon(tmp_path_factory.mktemp("live")).start()
    client = nfs_client(d)
    client.mkdir("run1")
    client.mkdir("run2")
    for path, data in (("run1/a.bin", A), ("run1/b.bin", B), ("run2/c.txt", C)):
        with client.open(path, "wb") as f:
            f.write(data)
    d.client = client
    yield d
    client.close()
    assert d.stop() == 0
    d.notify.close()


def rows(text: str) -> dict[str, list[str]]:
    """A table's rows by first column."""
    return {line.split()[0]: line.split() for line in text.strip().splitlines()[1:]}


def s3_client(daemon):
    import boto3
    from appliance.embedded_s3 import CREDENTIALS
    return boto3.client("s3", endpoint_url=daemon.status["s3"]["endpoint"], region_name="us-east-1",
                        aws_access_key_id=CREDENTIALS[0], aws_secret_access_key=CREDENTIALS[1])


def test_status(daemon):
    st = daemon.cli_json("status")
    assert st["tryout"] is True and st["nfs"]["running"] and st["upload"]["running"]
    assert st["cache"]["used"] >= len(A) + len(B) + len(C)
    assert st["cache"]["capacity"] > 0 and st["nfs"]["clients"] >= 1
    r = daemon.cli("status")
    assert r.exit_code == 0
    text = r.stdout
    assert "TRY-OUT" in text and "cache used" in text and " of " in text
    assert "MiB" in text or "KiB" in text


def test_ls_flush_and_states(daemon):
    before = daemon.cli_json("ls", "-R", "/checkpoints/run1")
    states = {e["path"]: e["state"] for e in before["entries"]}
    assert set(states) == {"run1", "run1/a.bin", "run1/b.bin"}
    r = daemon.cli("flush", "--wait", "--timeout", "120", "/checkpoints/run1")
    assert r.exit_code == 0, r.stderr
    assert "in S3" in r.stdout
    after = daemon.cli_json("ls", "--state", "clean", "run1")
    assert daemon.cli_json("ls", "--state", "dirty", "--state", "queued", "-R", "run1")["entries"] == []
    assert {e["path"]: e["state"] for e in after["entries"]} == {"run1/a.bin": "clean", "run1/b.bin": "clean"}
    assert {e["path"]: e["size"] for e in after["entries"]} == {"run1/a.bin": len(A), "run1/b.bin": len(B)}
    human = daemon.cli("ls", "/checkpoints/run1")
    assert human.exit_code == 0
    table = rows(human.stdout)
    assert table["run1/b.bin"][1:] == ["reg", "3.0", "MiB", "clean"]
    assert human.stdout.splitlines()[0].split() == ["PATH", "TYPE", "SIZE", "STATE", "PIN"]
    # the object is really there, byte for byte
    body = s3_client(daemon).get_object(Bucket="ckptgw", Key="run1/b.bin")["Body"].read()
    assert body == B
    res = daemon.cli_json("flush", "--wait", "run2")
    assert res["pending_files"] == 0 and res["total_bytes"] == len(C)


def test_flush_times_out_while_a_writer_holds_the_file(daemon):
    f = daemon.client.open("run2/open.bin", "wb")
    try:
        f.write(b"x" * 4096)
        r = daemon.cli("flush", "--wait", "--timeout", "1", "run2")
        assert r.exit_code == 4
        assert r.stderr.startswith("ckptgw: flush of run2 timed out after 1s")
        assert r.stderr.count("\n") == 1
    finally:
        f.close()
    assert daemon.cli("flush", "--wait", "--timeout", "120", "run2").exit_code == 0


def test_verify(daemon):
    # above the multipart threshold (16 MiB): the embedded S3 (moto) reports its composite
    # checksum with neither "-N" nor a type, and verify called it corrupt (issue 39, bug 1)
    daemon.client.mkdir("big")
    with daemon.client.open("big/model.pt", "wb") as f:
        f.write(os.urandom(17 << 20))
    assert daemon.cli("flush", "--wait", "--timeout", "120").exit_code == 0
    res = daemon.cli_json("verify", "run1")
    assert res["checked"] == 2 and res["ok"] == 2 and res["mismatches"] == []
    assert res["matched_by"] == {"full-object": 2, "composite": 0, "object bytes": 0}
    res = daemon.cli_json("verify", "big")
    assert (res["checked"], res["ok"], res["mismatches"]) == (1, 1, []), res
    assert res["matched_by"] == {"full-object": 0, "composite": 1, "object bytes": 0}
    r = daemon.cli("verify", "/checkpoints")
    assert r.exit_code == 0 and "0 differ" in r.stdout
    # replace an object behind the gateway's back: verify must notice and exit 1. Other
    # bytes for sure: A[:-1] + b"!" was A itself when A ended in "!" (1 run in 256), the
    # CI run in which verify "missed" the replacement (tests/uploader/test_verify.py)
    s3_client(daemon).put_object(Bucket="ckptgw", Key="run1/a.bin", Body=A[:-1] + bytes([A[-1] ^ 0xFF]))
    r = daemon.cli("verify", "run1")
    assert r.exit_code == 1 and "1 differ" in r.stdout and "run1/a.bin" in r.stdout, (
        r.stdout, daemon.cli_json("ls", "-R", "run1"), daemon.read_log()[-3000:])
    res = json.loads(daemon.cli("verify", "run1", "--json").stdout)
    assert [m["path"] for m in res["mismatches"]] == ["run1/a.bin"]
    s3_client(daemon).put_object(Bucket="ckptgw", Key="run1/a.bin", Body=A)   # restore for other tests


def test_pin_unpin(daemon):
    r = daemon.cli("pin", "run1")
    assert r.exit_code == 0 and r.stdout.strip() == "pinned 2 file(s) under run1"
    assert all(e["pinned"] for e in daemon.cli_json("ls", "run1")["entries"])
    assert "pinned" in rows(daemon.cli("ls", "run1").stdout)["run1/a.bin"]
    res = daemon.cli_json("unpin", "run1")
    assert (res["path"], res["files"], res["pinned"]) == ("run1", 2, False)
    assert not any(e["pinned"] for e in daemon.cli_json("ls", "run1")["entries"])
    assert daemon.cli_json("pin", "run2/c.txt")["files"] == 1


def test_evict_is_refused_in_tryout_mode(daemon):
    r = daemon.cli("evict", "run1")
    assert r.exit_code == 3 and "try-out mode" in r.stderr
    r = daemon.cli("evict", "run1", "--json")
    assert r.exit_code == 3


def test_import_and_warmup(daemon):
    data = os.urandom(200_000)
    s3_client(daemon).put_object(Bucket="ckptgw", Key="imported/model.pt", Body=data)
    r = daemon.cli("import")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("imported 1 object(s)")
    again = daemon.cli_json("import")
    assert again["imported"] == 0 and again["already_present"] >= 1     # local data wins
    [entry] = daemon.cli_json("ls", "imported")["entries"]
    assert entry["state"] == "absent" and entry["size"] == len(data)
    res = daemon.cli_json("warmup", "imported")
    assert res["files"] == 1 and res["bytes"] >= len(data)
    [entry] = daemon.cli_json("ls", "imported")["entries"]
    assert entry["state"] == "clean"
    with daemon.client.open("imported/model.pt", "rb") as f:
        assert f.read() == data
    r = daemon.cli("warmup", "imported")
    assert r.exit_code == 0 and r.stdout.strip() == "nothing to fetch: every file under imported is in the cache"


def test_retention_and_lifecycle(daemon):
    """No series configured: plans are empty; the commands answer in both forms."""
    if importlib.util.find_spec("uploader.retention") is None:
        for group, action in (("retention", "plan"), ("lifecycle", "plan")):
            r = daemon.cli(group, action)
            assert r.exit_code == 3
            assert r.stderr.strip() == f"ckptgw: {group} {action} is not available in this version."
        return
    res = daemon.cli_json("retention", "plan")
    assert res["actions"] == [] and res["summary"]["checkpoints"] == 0
    r = daemon.cli("retention", "plan")
    assert r.exit_code == 0 and "nothing to do" in r.stdout
    r = daemon.cli("retention", "apply")
    assert r.exit_code == 0 and "nothing to do" in r.stdout
    assert daemon.cli("retention", "log").exit_code == 0
    assert isinstance(daemon.cli_json("retention", "log")["entries"], list)
    plan = daemon.cli_json("lifecycle", "plan")
    assert "actions" in plan and "in_sync" in plan
    assert daemon.cli("lifecycle", "plan").exit_code == 0


def test_clients_and_exports(daemon):
    res = daemon.cli_json("clients")
    assert len(res["clients"]) >= 1 and res["clients"][0]["minorversion"] == 1
    assert res["clients"][0]["peer"].startswith("127.0.0.1")
    r = daemon.cli("clients")
    assert r.exit_code == 0 and r.stdout.split("\n")[0].split()[:3] == ["CLIENTID", "PEER", "NFS"]
    assert "4.1" in r.stdout
    assert daemon.cli_json("exports")["exports"] == [
        {"path": "/checkpoints", "networks": ["127.0.0.0/8"], "access": "rw", "squash": "none",
         "anon_uid": 65534, "anon_gid": 65534, "owner": None, "mode": None, "secure": False}]
    r = daemon.cli("exports")
    assert rows(r.stdout)["/checkpoints"] == ["/checkpoints", "127.0.0.0/8", "rw", "none", "65534:65534",
                                              "insecure"]


def test_check(daemon):
    assert daemon.cli_json("check") == {"consistent": True, "problems": []}
    r = daemon.cli("check")
    assert r.exit_code == 0 and r.stdout.strip() == "store is consistent"


def test_errors_are_one_sentence_with_exit_codes(daemon, tmp_path):
    r = daemon.cli("ls", "/checkpoints/nope")
    assert r.exit_code == 5 and r.stderr == "ckptgw: /checkpoints/nope does not exist in the cache.\n"
    r = daemon.cli("pin", "../etc")
    assert r.exit_code == 2 and "must not contain '..'" in r.stderr
    from click.testing import CliRunner
    from appliance.cli import main
    r = CliRunner().invoke(main, ["--socket", str(tmp_path / "none.sock"), "status"])
    assert r.exit_code == 7 and "Is `ckptgw serve` running?" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")
def test_cli_as_another_user_is_refused(daemon):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # child: become nobody, run the command
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            res = daemon.cli("status")
            os.write(w, json.dumps([res.exit_code, res.stderr]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        exit_code, stderr = json.loads(f.read())
    os.waitpid(pid, 0)
    assert exit_code == 6, stderr
    assert stderr.startswith("ckptgw: permission denied on the admin socket")


def test_admin_over_tcp_needs_the_token(live_daemon, tmp_path):
    d = live_daemon("--admin-listen", "127.0.0.1:0", "--admin-token", "t0ken-for-tests")
    tcp = d.status["admin_tcp"]
    assert tcp and tcp.startswith("127.0.0.1:")
    from click.testing import CliRunner
    from appliance.cli import main
    r = CliRunner().invoke(main, ["--admin", tcp, "--token", "t0ken-for-tests", "exports", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["exports"][0]["path"] == "/checkpoints"
    r = CliRunner().invoke(main, ["--admin", tcp, "--token", "guess", "status"])
    assert r.exit_code == 6 and r.stderr == "ckptgw: missing or wrong admin token.\n"
    assert "t0ken-for-tests" not in d.read_log()


def scrape(daemon) -> dict:
    url = f"http://{daemon.cli_json('status')['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_endpoint(daemon):
    assert daemon.cli("flush", "--wait", "--timeout", "120").exit_code == 0
    m = scrape(daemon)
    assert m[("ckptgw_upload_queue_depth", ())] == 0
    assert m[("ckptgw_upload_bytes_total", ())] >= len(A) + len(B) + len(C)
    assert m[("ckptgw_cache_bytes", (("state", "dirty"),))] == 0
    assert m[("ckptgw_cache_bytes", (("state", "clean"),))] >= len(A) + len(B)
    assert sum(v for (name, _), v in m.items() if name == "ckptgw_s3_requests_total") > 0
    assert ("ckptgw_upload_retries_total", ()) in m and ("ckptgw_upload_throttles_total", ()) in m
    assert m[("ckptgw_upload_oldest_dirty_age_seconds", ())] == 0
    # the live uploader's limiter: a limit of at least one request, nothing in flight once flushed
    assert m[("ckptgw_upload_concurrency_limit", ())] >= 1
    assert m[("ckptgw_upload_requests_in_flight", ())] == 0
    assert ("ckptgw_cache_read_through_bytes_total", ()) in m and ("ckptgw_cache_evicted_bytes_total", ()) in m
    assert m[("ckptgw_nfs_clients", ())] >= 1


def test_metrics_count_nfs_ops(daemon):
    daemon.client.listdir("run1")
    m = scrape(daemon)
    ops = {labels: v for (name, labels), v in m.items() if name == "ckptgw_nfs_ops_total"}
    assert any(dict(labels)["op"] == "WRITE" and v >= 3 for labels, v in ops.items())
    assert m[("ckptgw_nfs_written_bytes_total", ())] >= len(A) + len(B) + len(C)
    assert any(name == "ckptgw_nfs_op_duration_seconds_bucket" for name, _ in m)
