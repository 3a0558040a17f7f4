"""An HA pair's replication state (appliance/pair.py, issue 38): /proc/drbd (DRBD 8.4) read into
in sync / syncing / degraded / unknown, and shown by `ckptgw status` and the ckptgw_pair_* metrics."""
from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from appliance import config as configmod
from appliance.cli import _pair_text
from appliance.metrics import OpStats, StatusCollector
from appliance.pair import DEGRADED, IN_SYNC, SYNCING, UNKNOWN, minor_of, parse_proc_drbd, read_pair
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
        assert st["pair"] == read_pair("/dev/drbd0").as_dict()      # what this host's /proc/drbd says
        assert st["pair"]["device"] == "/dev/drbd0"
        if not os.path.exists("/proc/drbd"):                         # a host without DRBD: unknown
            assert (st["pair"]["state"], st["pair"]["degraded"]) == (UNKNOWN, True)
        assert "pair" in daemon.cli("status").stdout
    finally:
        daemon.close()
