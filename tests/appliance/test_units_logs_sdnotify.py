"""Small pieces: units, log redaction and rendering, sd_notify datagrams."""
from __future__ import annotations

import io
import json
import logging
import os
import socket

import pytest
import structlog

from appliance import logs, sdnotify
from appliance.units import fmt_bytes, fmt_seconds, parse_duration, parse_size, table


def test_sizes_and_durations():
    assert parse_size("8MiB") == 8 << 20 and parse_size("10GB") == 10**10 and parse_size("4096") == 4096
    assert parse_size("1.5KiB") == 1536
    assert parse_duration("500ms") == 0.5 and parse_duration("2h") == 7200 and parse_duration("30") == 30
    for bad in ("8 XB", "", "-1", "MiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert fmt_bytes(0) == "0 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(20 << 30) == "20.0 GiB"
    assert fmt_seconds(0.25) == "0.25s" and fmt_seconds(303) == "5m03s" and fmt_seconds(None) == "-"


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (0.25, "0.25s"), (0.5, "0.5s"), (1, "1s"), (1.5, "1.5s"), (12, "12s"), (60, "1m"), (75, "1m15s"),
    (303, "5m03s"), (3600, "1h"), (3900, "1h05m"), (7800, "2h10m"), (86400, "1d"), (30 * 86400, "30d"),
    (3 * 86400 + 4 * 3600, "3d04h"),
])
def test_one_duration_style_in_every_human_output(seconds, text):
    """status, clients and the retention plans' ages and rules all read the same (issue 39):
    no space, the largest unit and the next one when not zero; a round value as a config writes it."""
    from uploader.retention import fmt_age
    assert fmt_seconds(seconds) == text
    if seconds >= 1 and float(seconds).is_integer():
        assert fmt_age(seconds) == text
        if text[-1] in "smhd" and text[:-1].isdigit():       # a round value parses back
            assert parse_duration(text) == seconds


def test_no_second_duration_style_in_the_appliance_source():
    """Human output shows durations through fmt_seconds only (issue 39): no string literal of
    appliance/ formats a number followed by " s" ("after 5 s"), and no progress bar shows click's
    "00:00:05" ETA. A JSON field keeps plain seconds; this looks at strings, not at field names."""
    import io
    import re
    import tokenize
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "appliance"
    spaced = re.compile(r"\{[^{}]*\}\s+s\b")              # f"... {timeout:g} s ..."
    bad = []
    for path in sorted(root.glob("*.py")):
        text = path.read_text()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").lower().startswith("f") \
                    and spaced.search(tok.string):
                bad.append(f"{path.name}:{tok.start[0]}: {tok.string[:60]}")
        if "show_eta=True" in text:
            bad.append(f"{path.name}: show_eta=True (click's HH:MM:SS)")
    assert not bad, bad


def test_the_messages_that_had_their_own_style_use_it():
    from appliance.progress import bar_text
    from appliance.waiting import NotUploaded, wait_uploaded
    assert bar_text(3 << 29, 5 << 30, 150 << 20) == "1.5 GiB of 5.0 GiB, 150.0 MiB/s, 23s left"
    t = [0.0]
    with pytest.raises(NotUploaded) as e:
        wait_uploaded("/x", timeout=90, interval=30, getxattr=lambda p, n: b"dirty",
                      isdir=lambda p: False, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert str(e.value).endswith("after 1m30s")


def test_table_aligns_columns():
    out = table(["PATH", "SIZE"], [["a", "1.0 KiB"], ["longer/name", "12 B"]], right={1})
    lines = out.splitlines()
    assert lines[0] == "PATH            SIZE"
    assert lines[1] == "a            1.0 KiB"
    assert lines[2] == "longer/name     12 B"


@pytest.fixture
def captured():
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    yield stream
    logs.configure("json", "info", stream=io.StringIO())


def events(stream) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_one_event_each_with_keys(captured):
    structlog.get_logger("t").info("nfs_op", client="10.0.0.5", op="WRITE", fh="ab12", duration=0.002,
                                   result="NFS4_OK")
    [ev] = events(captured)
    assert ev["event"] == "nfs_op" and ev["client"] == "10.0.0.5" and ev["level"] == "info"
    assert "timestamp" in ev


def test_secrets_never_reach_the_output(captured):
    log = structlog.get_logger("t")
    log.info("s3_config", secret_key="hunter2", access_key="AKIAXXXX", settings={"token": "tok123", "ok": 1},
             header="Authorization: AWS4-HMAC-SHA256 Credential=AKIAXXXX/20260101, Signature=deadbeef")
    logging.getLogger("botocore").warning("retrying with password=pa55 and X-Amz-Security-Token=zzz")
    text = captured.getvalue()
    for secret in ("hunter2", "AKIAXXXX", "tok123", "deadbeef", "pa55", "zzz"):
        assert secret not in text
    first = events(captured)[0]
    assert first["secret_key"] == logs.REDACTED and first["settings"] == {"token": logs.REDACTED, "ok": 1}


def test_secrets_in_text_of_any_case_are_redacted(captured):
    """The regexes run only on strings holding one of their words: case does not hide one."""
    log = structlog.get_logger("t")
    log.info("e", a="x-amz-SIGNATURE=s1gn", b="AUTHORIZATION: Bearer b3arer", c="Session_Token: t0k",
             d="SECRET_ACCESS_KEY=k3y", e="plain text without them")
    text = captured.getvalue()
    for secret in ("s1gn", "b3arer", "t0k", "k3y"):
        assert secret not in text
    assert events(captured)[0]["e"] == "plain text without them"


def test_a_cached_logger_follows_the_level_of_each_configure():
    """Disabled calls return before the processors, yet a reload's new level (the stdlib
    logger's) holds for loggers already used, as before."""
    stream = io.StringIO()
    log = structlog.get_logger("t.levels")
    try:
        logs.configure("json", "info", stream=stream)
        log.debug("hidden1")
        log.info("shown1")
        logs.configure("json", "debug", stream=stream)
        log.debug("shown2")
        logs.configure("json", "warning", stream=stream)
        log.info("hidden2")
        log.warning("shown3")
    finally:
        logs.configure("json", "info", stream=io.StringIO())
    assert [e["event"] for e in events(stream)] == ["shown1", "shown2", "shown3"]


def test_console_renderer_is_readable():
    stream = io.StringIO()
    logs.configure("console", "info", stream=stream)
    structlog.get_logger("t").info("hello", client="1.2.3.4")
    logs.configure("json", "info", stream=io.StringIO())
    line = stream.getvalue()
    assert "hello" in line and "client=1.2.3.4" in line and not line.startswith("{")


@pytest.mark.parametrize("abstract", [False, True])
def test_sd_notify_sends_datagrams(tmp_path, monkeypatch, abstract):
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"ckptgw-test-{os.getpid()}"
        rx.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    else:
        rx.bind(str(tmp_path / "notify"))
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    rx.settimeout(5)
    with rx:
        assert sdnotify.ready("serving")
        assert rx.recv(4096) == b"READY=1\nSTATUS=serving"
        assert sdnotify.reloading()
        msg = rx.recv(4096).decode().split("\n")
        assert msg[0] == "RELOADING=1" and msg[1].startswith("MONOTONIC_USEC=")
        assert sdnotify.stopping()
        assert rx.recv(4096) == b"STOPPING=1"


def test_sd_notify_without_systemd(monkeypatch, tmp_path):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert sdnotify.ready() is False


@pytest.mark.timeout(30)
def test_sd_notify_never_blocks_on_a_full_receiver(tmp_path, monkeypatch):
    """A receiver that does not read (its queue holds max_dgram_qlen datagrams) must not block
    the daemon's event loop: the notification is dropped instead (found by the reload test)."""
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        results = [sdnotify.status(f"n{i}") for i in range(200)]
        assert results[0] is True and results[-1] is False


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_lines_to_the_journal_carry_a_syslog_priority(tmp_path, monkeypatch, fmt):
    """journald reads "<N>" at the start of a line as its PRIORITY (sd-daemon(3)), so
    `journalctl -p err` can filter; $JOURNAL_STREAM says whether stderr is the journal."""
    path = tmp_path / "stream"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        logs.configure(fmt, "debug", stream=stream)
        log = structlog.get_logger("t")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        logging.getLogger("botocore").critical("c")       # stdlib records too
        stream.flush()
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    if fmt == "json":
        assert json.loads(lines[3][3:])["event"] == "e"
    # a stream that is not the journal (a file, a pipe, a terminal): no prefix
    other = io.StringIO()
    logs.configure(fmt, "info", stream=other)
    structlog.get_logger("t").error("e")
    assert not other.getvalue().startswith("<")
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    with open(tmp_path / "other", "w") as f:
        logs.configure(fmt, "info", stream=f)
        structlog.get_logger("t").error("e")
    assert not (tmp_path / "other").read_text().startswith("<")
    logs.configure("json", "info", stream=io.StringIO())
