"""An HA pair's replication state (appliance/pair.py, issue 38): /proc/drbd (DRBD 8.4) read into
in sync / syncing / degraded / unknown, DRBD's fence constraints read from the CIB and weighed in,
and shown by `ckptgw status` and the ckptgw_pair_* metrics."""
from __future__ import annotations

import os
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from appliance import config as configmod
from appliance.cli import _fences_text, _pair_text
from appliance.metrics import OpStats, StatusCollector
from appliance.pair import (DEGRADED, IN_SYNC, SYNCING, UNKNOWN, FenceConstraint, FenceReader, Fences, judge_fences,
                            minor_of, parse_fence_constraints, parse_proc_drbd, read_fences, read_pair)
from testkit.appliance_live import LiveDaemon

HEADER = ("version: 8.4.11 (api:1/proto:86-101)\n"
          "srcversion: 8BC8C1A1E5C4D9DD3C5D1D1 \n")


def proc(line: str, counters: str = "ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0",
         minor: int = 0) -> str:
    return HEADER + f" {minor}: {line}\n    {counters}\n"


def test_connected_and_both_disks_up_to_date_is_in_sync():
    st = parse_proc_drbd(proc("cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----"),
                         "/dev/drbd0")
    assert (st.state, st.connection, st.role, st.peer_role, st.disk, st.peer_disk) == \
        (IN_SYNC, "Connected", "Primary", "Secondary", "UpToDate", "UpToDate")
    assert st.out_of_sync_bytes == 0 and not st.degraded and st.peer_connected and st.problem is None


def test_peer_gone_is_degraded_and_says_what_acknowledged_means_now():
    st = parse_proc_drbd(proc("cs:WFConnection ro:Primary/Unknown ds:UpToDate/DUnknown C r-----",
                              "ns:0 nr:0 dw:4096 dr:0 al:1 bm:1 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:4096"),
                         "/dev/drbd0")
    assert st.state == DEGRADED and st.degraded and not st.peer_connected
    assert st.out_of_sync_bytes == 4096 * 1024
    assert "this node's disk only" in st.problem and "WFConnection" in st.problem


def test_a_resync_is_syncing_and_still_degraded():
    text = HEADER + (" 0: cs:SyncSource ro:Primary/Secondary ds:UpToDate/Inconsistent C r-----\n"
                     "    ns:1024 nr:0 dw:0 dr:2048 al:0 bm:1 lo:0 pe:1 ua:0 ap:0 ep:1 wo:f oos:524288\n"
                     "\t[==>.................] sync'ed: 12.5% (512/584)M\n")
    st = parse_proc_drbd(text, "/dev/drbd0")
    assert (st.state, st.out_of_sync_bytes, st.peer_connected, st.degraded) == \
        (SYNCING, 512 << 20, True, True)


def test_connected_with_a_disk_not_up_to_date_is_degraded():
    st = parse_proc_drbd(proc("cs:Connected ro:Primary/Secondary ds:UpToDate/Diskless C r-----"),
                         "/dev/drbd0")
    assert st.state == DEGRADED and st.peer_connected and "UpToDate/Diskless" in st.problem


def test_the_right_minor_is_read():
    text = (proc("cs:Connected ro:Secondary/Primary ds:UpToDate/UpToDate C r-----")
            + " 1: cs:StandAlone ro:Primary/Unknown ds:UpToDate/DUnknown   r-----\n"
              "    ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:8\n")
    assert parse_proc_drbd(text, "/dev/drbd0").state == IN_SYNC
    one = parse_proc_drbd(text, "/dev/drbd1")
    assert (one.state, one.connection, one.out_of_sync_bytes) == (DEGRADED, "StandAlone", 8192)


def test_a_resource_that_is_not_up_or_drbd_9_or_no_module_is_unknown(tmp_path):
    down = parse_proc_drbd(HEADER, "/dev/drbd0")
    assert down.state == UNKNOWN and down.degraded and "drbdadm up" in down.problem
    nine = parse_proc_drbd("version: 9.2.8 (api:2/proto:86-122)\n", "/dev/drbd0")
    assert nine.state == UNKNOWN and "DRBD 9" in nine.problem
    gone = read_pair("/dev/drbd0", str(tmp_path / "nothing"))
    assert gone.state == UNKNOWN and "drbd module loaded" in gone.problem
    f = tmp_path / "drbd"
    f.write_text(proc("cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----"))
    assert read_pair("/dev/drbd0", str(f)).state == IN_SYNC


def test_only_drbd_devices_are_accepted(tmp_path):
    assert minor_of("/dev/drbd12") == 12
    for bad in ("/dev/sda1", "drbd0", "/dev/drbd", "/dev/drbd0p1"):
        with pytest.raises(ValueError):
            minor_of(bad)
    cfg = tmp_path / "ckptgw.toml"
    cfg.write_text('[pair]\ndrbd_device = "/dev/sdb"\n')
    with pytest.raises(configmod.ConfigError, match=r"ckptgw.toml:2: pair.drbd_device: expected a DRBD device"):
        configmod.load(str(cfg))
    cfg.write_text('[pair]\ndrbd_device = ""\n')
    assert configmod.load(str(cfg)).pair.drbd_device is None


def _metrics(status: dict) -> str:
    reg = CollectorRegistry()
    reg.register(StatusCollector(lambda: status, OpStats()))
    return generate_latest(reg).decode()


def test_metrics_of_a_pair_and_none_for_a_single_gateway():
    st = parse_proc_drbd(proc("cs:WFConnection ro:Primary/Unknown ds:UpToDate/DUnknown C r-----",
                              "ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:2"),
                         "/dev/drbd0")
    text = _metrics({"pair": st.as_dict()})
    assert "ckptgw_pair_degraded 1.0" in text
    assert "ckptgw_pair_peer_connected 0.0" in text
    assert "ckptgw_pair_out_of_sync_bytes 2048.0" in text
    assert ('ckptgw_pair_info{connection="WFConnection",device="/dev/drbd0",disk="UpToDate",'
            'peer_disk="DUnknown",peer_role="Unknown",role="Primary",state="degraded"} 1.0') in text
    assert "ckptgw_pair" not in _metrics({})
    assert "ckptgw_pair_fence_constraints -1.0" in text       # not read: unknown


def test_status_line_says_the_state_and_why():
    ok = parse_proc_drbd(proc("cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----"),
                         "/dev/drbd0").as_dict()
    assert _pair_text(ok) == "in sync (Primary, peer Secondary, /dev/drbd0)"
    bad = parse_proc_drbd(proc("cs:WFConnection ro:Primary/Unknown ds:UpToDate/DUnknown C r-----",
                               "ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:1024"),
                          "/dev/drbd0").as_dict()
    assert _pair_text(bad) == ("DEGRADED (Primary, peer Unknown, /dev/drbd0, 1.0 MiB to copy): peer not "
                               "connected (WFConnection): acknowledged writes are on this node's disk only")
    assert _pair_text(parse_proc_drbd(HEADER, "/dev/drbd0").as_dict()).startswith("unknown: /dev/drbd0")


def test_a_live_gateway_of_a_pair_reports_it_in_status(tmp_path):
    daemon = LiveDaemon(tmp_path, "--pair-drbd-device", "/dev/drbd0")
    try:
        daemon.start()
        st = daemon.cli_json("status")
        assert st["pair"] == read_pair("/dev/drbd0", fences=FenceReader()).as_dict()   # what this host says
        assert st["pair"]["device"] == "/dev/drbd0"
        if not os.path.exists("/proc/drbd"):                         # a host without DRBD: unknown
            assert (st["pair"]["state"], st["pair"]["degraded"]) == (UNKNOWN, True)
        if st["pair"]["fence_constraints"] is None:                  # no cluster here: unknown, and why
            assert st["pair"]["fence_constraints_error"]
        out = daemon.cli("status").stdout
        assert "pair" in out and "fence constraints" in out
    finally:
        daemon.close()


# ---- DRBD's fence constraints (crm-fence-peer.sh's drbd-fence-by-handler-*) ----------------------

IN_SYNC_PROC = proc("cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----")
PEER_GONE_PROC = proc("cs:WFConnection ro:Primary/Unknown ds:UpToDate/DUnknown C r-----")

# `cibadmin --query --scope constraints` on the role's pair (templates/pair.crm.j2) after gw-b was
# lost and gw-a took over: DRBD 8.4's crm-fence-peer.sh placed its constraint (Pacemaker 2.1 keeps the
# role Master it was written with). Attribute order as Pacemaker prints them back.
ROLE_CONSTRAINTS = """
  <rsc_location id="first-promotion" rsc="drbd-clone">
    <rule score="50" role="Master" id="first-promotion-rule">
      <expression operation="eq" attribute="#uname" value="gw-a" id="first-promotion-rule-expression"/>
    </rule>
  </rsc_location>
  <rsc_colocation id="gw-on-primary" score="INFINITY" rsc="gw" with-rsc="drbd-clone" with-rsc-role="Master"/>
  <rsc_order id="gw-after-promote" kind="Mandatory" first="drbd-clone" first-action="promote" then="gw" then-action="start"/>
"""
FENCE_84 = """  <rsc_location rsc="drbd-clone" id="drbd-fence-by-handler-r0-drbd-clone">
    <rule role="Master" score="-INFINITY" id="drbd-fence-by-handler-r0-rule-drbd-clone">
      <expression attribute="#uname" operation="ne" value="gw-a" id="drbd-fence-by-handler-r0-expr-drbd-clone"/>
    </rule>
  </rsc_location>
"""
# DRBD 9's crm-fence-peer.9.sh on a newer Pacemaker (--role=Promoted): one expression per UpToDate
# node, numbered by DRBD node id
FENCE_9 = FENCE_84.replace("r0-", "r1-").replace('"Master"', '"Promoted"').replace('"gw-a"', '"gw-b"') \
    .replace("-expr-", "-expr-1-")
CONSTRAINTS_84 = f"<constraints>{ROLE_CONSTRAINTS}{FENCE_84}</constraints>\n"
CONSTRAINTS_9 = f"<constraints>\n{FENCE_9}</constraints>\n"
# a fence agent's location (ckptgw_pair_stonith_resources) is no DRBD fence constraint
NONE_LEFT = (f'<constraints>{ROLE_CONSTRAINTS}  <rsc_location id="fence-gw-a-away" rsc="fence-gw-a" node="gw-a" '
             'score="-INFINITY"/>\n</constraints>\n')


def test_fence_constraints_are_found_with_the_node_they_keep_promotion_on():
    assert parse_fence_constraints(CONSTRAINTS_84) == (
        FenceConstraint("drbd-fence-by-handler-r0-drbd-clone", "drbd-clone", "Master", ("gw-a",)),)
    assert parse_fence_constraints(CONSTRAINTS_9) == (
        FenceConstraint("drbd-fence-by-handler-r1-drbd-clone", "drbd-clone", "Promoted", ("gw-b",)),)
    assert parse_fence_constraints(NONE_LEFT) == ()
    assert parse_fence_constraints("<constraints/>") == ()
    # a whole CIB, too
    cib = f'<cib epoch="12"><configuration>{CONSTRAINTS_84}</configuration><status/></cib>'
    assert [c.id for c in parse_fence_constraints(cib)] == ["drbd-fence-by-handler-r0-drbd-clone"]
    with pytest.raises(ValueError, match="not XML"):
        parse_fence_constraints("Signon to CIB failed: Transport endpoint is not connected")


def cib(stdout: str = "", returncode: int = 0, stderr: str = ""):
    """A stand-in for running cibadmin: counts its calls."""
    def run(timeout):
        run.calls += 1
        return subprocess.CompletedProcess(["cibadmin"], returncode, stdout, stderr)
    run.calls = 0
    return run


def test_a_constraint_left_after_the_resync_makes_an_in_sync_pair_degraded():
    st = read_pair_from(IN_SYNC_PROC, CONSTRAINTS_84)
    assert (st.state, st.degraded, st.peer_connected) == (DEGRADED, True, True)
    assert st.problem == (
        "DRBD fence constraint drbd-fence-by-handler-r0-drbd-clone is left after the resync (promotion "
        "only on gw-a): the peer cannot be promoted, a failover would be refused; `crm configure delete "
        "drbd-fence-by-handler-r0-drbd-clone` once the peer is UpToDate (it is now), or rerun the playbook")
    assert st.as_dict()["fence_constraints"] == [
        {"id": "drbd-fence-by-handler-r0-drbd-clone", "rsc": "drbd-clone", "role": "Master", "only_on": ["gw-a"]}]
    two = read_pair_from(IN_SYNC_PROC, f"<constraints>{ROLE_CONSTRAINTS}{FENCE_84}{FENCE_9}</constraints>")
    assert "constraints drbd-fence-by-handler-r0-drbd-clone, drbd-fence-by-handler-r1-drbd-clone are left" in two.problem
    assert "(promotion only on gw-a, gw-b)" in two.problem and "delete drbd-fence-by-handler-r0-drbd-clone " \
        "drbd-fence-by-handler-r1-drbd-clone`" in two.problem


def test_in_sync_without_a_constraint_stays_in_sync():
    st = read_pair_from(IN_SYNC_PROC, NONE_LEFT)
    assert (st.state, st.degraded, st.problem, st.fence_constraints, st.fence_constraints_error) == \
        (IN_SYNC, False, None, (), None)


def test_while_degraded_anyway_a_constraint_is_expected_and_only_listed():
    st = read_pair_from(PEER_GONE_PROC, CONSTRAINTS_84)
    assert st.state == DEGRADED and st.problem.startswith("peer not connected (WFConnection)")
    assert [c.id for c in st.fence_constraints] == ["drbd-fence-by-handler-r0-drbd-clone"]
    resync = judge_fences(parse_proc_drbd(HEADER + " 0: cs:SyncSource ro:Primary/Secondary ds:UpToDate/Inconsistent C r-----\n"
                                                   "    oos:1024\n", "/dev/drbd0"),
                          Fences(parse_fence_constraints(CONSTRAINTS_84)))
    assert resync.state == SYNCING and resync.problem.startswith("resynchronising")


def read_pair_from(proc_text: str, constraints_xml: str, **cib_kw):
    return judge_fences(parse_proc_drbd(proc_text, "/dev/drbd0"), read_fences(cib(constraints_xml, **cib_kw)))


def test_constraints_that_cannot_be_read_are_unknown_and_change_nothing():
    def raising(exc):
        def run(timeout):
            raise exc
        return run
    cases = {
        "cibadmin not found": raising(FileNotFoundError(2, "No such file or directory")),
        "cannot run cibadmin (Permission denied)": raising(PermissionError(13, "Permission denied")),
        "did not answer within 5s": raising(subprocess.TimeoutExpired(["cibadmin"], 5)),
        "failed (exit 102: Could not connect to the CIB: Transport endpoint is not connected)":
            cib(returncode=102, stderr="Could not connect to the CIB: Transport endpoint is not connected\n"),
        "failed (exit 13: Could not connect to the CIB: Permission denied): is the gateway's user in the "
        "haclient group": cib(returncode=13, stderr="Could not connect to the CIB: Permission denied\n"),
        "printed not XML": cib("garbage"),
    }
    for said, run in cases.items():
        fences = read_fences(run)
        assert fences.constraints is None and said in fences.error, (said, fences.error)
        for text in (IN_SYNC_PROC, PEER_GONE_PROC):
            before = parse_proc_drbd(text, "/dev/drbd0")
            after = judge_fences(before, fences)
            assert (after.state, after.problem) == (before.state, before.problem)
            assert after.fence_constraints is None and after.fence_constraints_error == fences.error
            assert after.as_dict()["fence_constraints"] is None


def test_cibadmin_runs_without_a_shell_and_is_bounded(tmp_path, monkeypatch):
    """The real runner: argv, no shell, found on PATH; missing or too slow is unknown, not a crash."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_fences().error.startswith("cibadmin not found")
    fake = tmp_path / "cibadmin"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\n'
                    f"cat <<'EOF'\n{CONSTRAINTS_84}EOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")       # the fake first; sh, cat, sleep after it
    assert [c.id for c in read_fences().constraints] == ["drbd-fence-by-handler-r0-drbd-clone"]
    assert (tmp_path / "argv").read_text() == "--query --scope constraints\n"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fences = read_fences(timeout=0.5)
    assert fences.constraints is None and "did not answer within 0.5s" in fences.error


def test_the_cib_is_read_at_most_once_per_ttl_whoever_asks():
    now = [100.0]
    run = cib(CONSTRAINTS_84)
    reader = FenceReader(run, clock=lambda: now[0], ttl=5.0)
    first = reader.read()
    for _ in range(10):                     # a status and scrapes within the ttl: one cibadmin
        assert reader.read() is first
    now[0] += 4.9
    reader.read()
    assert run.calls == 1
    now[0] += 0.2
    reader.read()
    assert run.calls == 2
    now[0] -= 50                            # a clock going back does not pin the old reading
    reader.read()
    assert run.calls == 3
    st = read_pair("/dev/drbd0", "/nonexistent", fences=reader)
    assert st.state == UNKNOWN and st.fence_constraints[0].id == "drbd-fence-by-handler-r0-drbd-clone"
    assert run.calls == 3


def test_metrics_and_status_show_the_fence_constraints():
    left = read_pair_from(IN_SYNC_PROC, CONSTRAINTS_84).as_dict()
    text = _metrics({"pair": left})
    assert "ckptgw_pair_degraded 1.0" in text and "ckptgw_pair_fence_constraints 1.0" in text
    assert 'state="degraded"' in text
    assert _pair_text(left).startswith("DEGRADED (Primary, peer Secondary, /dev/drbd0): DRBD fence constraint "
                                       "drbd-fence-by-handler-r0-drbd-clone is left after the resync")
    assert _fences_text(left) == "drbd-fence-by-handler-r0-drbd-clone (promotion only on gw-a)"
    ok = read_pair_from(IN_SYNC_PROC, NONE_LEFT).as_dict()
    text = _metrics({"pair": ok})
    assert "ckptgw_pair_degraded 0.0" in text and "ckptgw_pair_fence_constraints 0.0" in text
    assert _fences_text(ok) == "none"
    gone = read_pair_from(PEER_GONE_PROC, CONSTRAINTS_84).as_dict()
    assert "ckptgw_pair_fence_constraints 1.0" in _metrics({"pair": gone})
    blind = read_pair_from(IN_SYNC_PROC, "", returncode=13, stderr="Could not connect to the CIB: Permission denied")
    text = _metrics({"pair": blind.as_dict()})
    assert "ckptgw_pair_degraded 0.0" in text and "ckptgw_pair_fence_constraints -1.0" in text
    assert _fences_text(blind.as_dict()).startswith("unknown: `cibadmin --query --scope constraints` failed (exit 13")
