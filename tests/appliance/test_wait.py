"""`ckptgw wait` and appliance.waiting.wait_uploaded against a fake os.getxattr (the real
one through a mount is tested in tests/e2e, kernel client): states, the fresh-read suffix,
the timeout, and the errors of a mount that does not offer the attributes."""
from __future__ import annotations

import errno
import json
import os
import re

import pytest
from click.testing import CliRunner

from appliance import waiting
from appliance.cli import EXIT, main
from appliance.waiting import NotOffered, NotUploaded, upload_state, wait_uploaded

FRESH = re.compile(r"user\.ckptgw\.([a-z_]+)\.([0-9a-f]{16})$")


class FakeMount:
    """getxattr of a gateway mount: values per (path, name), changed by `script` per read."""

    def __init__(self, values: dict, script=None):
        self.values = values
        self.names: list[str] = []
        self.script = script or (lambda n: None)

    def __call__(self, path, name):
        m = FRESH.match(name)
        assert m, f"not a fresh-read name: {name}"
        self.names.append(name)
        self.script(len(self.names))
        try:
            return self.values[(os.fspath(path), m.group(1))].encode()
        except KeyError:
            raise OSError(errno.ENODATA, "No data available") from None


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_a_file_is_waited_for_until_in_s3_and_its_object_returned():
    mount = FakeMount({("f", "state"): "dirty"})

    def script(n):
        if n == 3:
            mount.values[("f", "state")] = "uploading"
        if n == 5:
            mount.values.update({("f", "state"): "in_s3", ("f", "key"): "run/f", ("f", "etag"): '"e"',
                                 ("f", "checksum"): "crc32:AA=="})
    mount.script = script
    clock = Clock()
    seen = []
    st = wait_uploaded("f", timeout=60, interval=1.5, getxattr=mount, isdir=lambda p: False,
                       clock=clock, sleep=clock.sleep, on_poll=lambda s: seen.append(s.state))
    assert st.done and st.state == "in_s3"
    assert st.object == {"key": "run/f", "etag": '"e"', "checksum": "crc32:AA=="}   # no version
    assert seen == ["dirty", "dirty", "uploading", "uploading", "in_s3"]
    assert clock.slept == [1.5] * 4
    # every read used a name the client cannot have cached
    suffixes = [FRESH.match(n).group(2) for n in mount.names]
    assert len(set(suffixes)) == len(suffixes)


def test_a_directory_waits_for_pending_files_to_reach_zero():
    mount = FakeMount({("d", "pending_files"): "2", ("d", "pending_bytes"): "4096"})

    def script(n):
        if n > 4:
            mount.values.update({("d", "pending_files"): "0", ("d", "pending_bytes"): "0"})
    mount.script = script
    clock = Clock()
    st = wait_uploaded("d", getxattr=mount, isdir=lambda p: True, clock=clock, sleep=clock.sleep)
    assert st.done and st.is_dir and st.pending_files == 0
    assert clock.slept == [2.0, 2.0]


def test_timeout_raises_with_the_last_state_and_never_oversleeps():
    mount = FakeMount({("d", "pending_files"): "3", ("d", "pending_bytes"): "100"})
    clock = Clock()
    with pytest.raises(NotUploaded) as e:
        wait_uploaded("d", timeout=5, interval=2, getxattr=mount, isdir=lambda p: True,
                      clock=clock, sleep=clock.sleep)
    assert isinstance(e.value, TimeoutError)
    assert e.value.state.pending_files == 3 and "3 file(s), 100 bytes not in S3 after 5s" in str(e.value)
    assert clock.slept == [2, 2, 1] and clock.now == 5
    with pytest.raises(ValueError):
        wait_uploaded("d", interval=0, getxattr=mount, isdir=lambda p: True)


@pytest.mark.parametrize("err", [errno.ENOTSUP, errno.ENODATA])
def test_a_mount_without_the_attributes_is_named(err):
    def getxattr(path, name):
        raise OSError(err, os.strerror(err))
    with pytest.raises(NotOffered) as e:
        upload_state("/mnt/x", getxattr=getxattr, isdir=lambda p: False)
    assert "vers=4.2" in str(e.value)


def test_other_errors_pass_through():
    def getxattr(path, name):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    with pytest.raises(FileNotFoundError):
        upload_state("/nope", getxattr=getxattr, isdir=lambda p: False)


# ---- the CLI ---------------------------------------------------------------------------------
def run_cli(monkeypatch, values, *args, isdir=False, script=None):
    mount = FakeMount(values, script)
    monkeypatch.setattr(waiting.os, "getxattr", mount)
    monkeypatch.setattr(waiting.os.path, "isdir", lambda p: isdir)
    monkeypatch.setattr(waiting.time, "sleep", lambda s: None)
    return CliRunner().invoke(main, ["wait", *args])


def test_cli_done_prints_the_object(monkeypatch):
    r = run_cli(monkeypatch, {("f", "state"): "in_s3", ("f", "key"): "run/f", ("f", "etag"): '"e"',
                              ("f", "version"): "v1"}, "f")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == 'f: in S3 as run/f etag "e" version v1'
    r = run_cli(monkeypatch, {("d", "pending_files"): "0", ("d", "pending_bytes"): "0"},
                "d", "--json", isdir=True)
    assert r.exit_code == 0
    assert json.loads(r.output) == {"ok": True, "path": "d", "is_dir": True, "done": True,
                                    "state": None, "pending_files": 0, "pending_bytes": 0}


def test_cli_timeout_exit_4(monkeypatch):
    r = run_cli(monkeypatch, {("f", "state"): "uploading"}, "f", "--timeout", "0")
    assert r.exit_code == EXIT["timeout"] == 4
    assert "f: still uploading after 0s" in r.output
    r = run_cli(monkeypatch, {("f", "state"): "dirty"}, "f", "--timeout", "0", "--json")
    assert r.exit_code == 4
    doc = json.loads(r.stdout)
    assert doc["code"] == "timeout" and doc["state"] == "dirty" and doc["done"] is False


def test_cli_not_a_4_2_mount_exit_3_and_missing_path_exit_5(monkeypatch):
    r = run_cli(monkeypatch, {}, "f")
    assert r.exit_code == EXIT["unavailable"] == 3
    assert "vers=4.2" in r.output

    def gone(path, name):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    monkeypatch.setattr(waiting.os, "getxattr", gone)
    r = CliRunner().invoke(main, ["wait", "/nope"])
    assert r.exit_code == EXIT["not_found"] == 5
