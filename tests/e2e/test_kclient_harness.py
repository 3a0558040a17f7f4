"""Fast checks of the kernel-client harness itself (no VM boot): the skip/fail policy, mount
options, the initramfs writer, guest result parsing and host calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import testkit.kclient as kclient
from testkit.kclient import image, vm

GUEST = Path(__file__).resolve().parent / "guest"


def _unavailable(*_a, **_kw):
    raise image.KclientUnavailable("qemu-system-x86_64 missing (test)")


def test_require_skips_outside_ci(monkeypatch):
    monkeypatch.setattr(kclient, "ensure_ready", _unavailable)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="qemu-system-x86_64 missing"):
        kclient.require()


def test_require_fails_in_ci(monkeypatch):
    monkeypatch.setattr(kclient, "ensure_ready", _unavailable)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="unavailable in CI"):
        kclient.require()


def _client(**kw) -> vm.KernelClient:
    kc = object.__new__(vm.KernelClient)  # no boot image needed to compose options
    kc.vers, kc.port = kw.get("vers", "4.1"), kw.get("port", 2049)
    kc.user_opts = [o for o in kw.get("opts", "").split(",") if o]
    return kc


def test_mount_options():
    assert _client(port=12049).nfs_opts(0) == "vers=4.1,port=12049,clientaddr=127.0.0.1,addr=10.0.2.100"
    opts = _client(vers="4.2", opts="hard,timeo=50,port=999").nfs_opts(0).split(",")
    assert "vers=4.2" in opts and "port=999" in opts and "port=2049" not in opts and "timeo=50" in opts
    assert "vers=4.1" not in _client(opts="minorversion=2").nfs_opts(0)


def test_constructor_rejects_bad_arguments():
    for kw in ({"vers": "3"}, {"export": "checkpoints"}, {"mnt": "/proc"}):
        with pytest.raises(ValueError):
            vm.KernelClient(2049, install=False, **kw)
    with pytest.raises(ValueError):
        vm.KernelClient(0, install=False)


def test_cpio_newc_layout():
    c = image._Cpio()
    c.dir("bin")
    c.file("bin/x", b"hello", 0o755)
    data = c.bytes()
    assert data.startswith(b"070701") and len(data) % 4 == 0 and b"hello" in data and b"TRAILER!!!" in data
    if subprocess.run(["which", "cpio"], stdout=subprocess.DEVNULL).returncode == 0:
        listing = subprocess.run(["cpio", "-t"], input=data, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert listing.stdout.split() == [b"bin", b"bin/x"]


def test_host_calls_are_served_once_and_report_errors(tmp_path):
    calls = []
    (tmp_path / "call.restart").touch()
    (tmp_path / "call.restart.2").touch()
    (tmp_path / "call.boom").touch()

    def boom():
        raise RuntimeError("server would not start")

    served: set[str] = set()
    for _ in range(2):
        vm.KernelClient._serve_host_calls(tmp_path, {"restart": lambda: calls.append(1), "boom": boom}, served)
    assert calls == [1, 1]
    assert (tmp_path / "done.restart").exists() and (tmp_path / "done.restart.2").exists()
    assert "server would not start" in (tmp_path / "failed.boom").read_text()


def test_result_check_and_describe():
    res = vm.KclientResult(rc=125, stdout="", stderr="", timings={}, harness_error="NFS mount failed: EACCES",
                           dmesg="[1.0] sh (1): drop_caches: 3\n[2.0] NFS: server error")
    text = res.describe()
    assert "NFS mount failed" in text and "NFS: server error" in text and "drop_caches" not in text
    with pytest.raises(AssertionError):
        res.check()


def test_fsops_data_is_deterministic_and_position_dependent():
    from tests.e2e.guest import fsops

    a, b = fsops.data_block("s", 0), fsops.data_block("s", 1)
    assert len(a) == fsops.MIB and a != b and fsops.data_block("s", 0) == a
    assert fsops.data_block("t", 0) != a
    out = subprocess.run([sys.executable, str(GUEST / "fsops.py"), "gen", "2", "dd"], stdout=subprocess.PIPE,
                         check=True).stdout
    import hashlib

    assert hashlib.sha256(out).hexdigest() == fsops.stream_sha("dd", 2 * fsops.MIB)


def test_fsops_workloads_on_a_local_directory(tmp_path):
    """The guest workloads themselves, on the host's file system: they must pass where the file
    system is right (and their checks must be able to fail: see the corrupted copy below)."""
    from tests.e2e.guest import fsops

    assert fsops.checkpoint(str(tmp_path / "ck"), 2, 2, 1)
    assert fsops.verify_checkpoint(str(tmp_path / "ck"), 2, 2, 1)
    with open(tmp_path / "ck" / "step_1" / "rank_0.pt", "r+b") as f:
        f.seek(12345)
        f.write(b"X")
    assert not fsops.verify_checkpoint(str(tmp_path / "ck"), 2, 2, 1)
    assert fsops.latest_race(str(tmp_path / "latest"), 20, read_pause=0.0)
    assert fsops.many_entries(str(tmp_path / "many"), 50)
    fsops.mktree(str(tmp_path / "tree"))
    m = fsops.manifest(str(tmp_path / "tree"))
    assert m["hardlink"][4] == m[os.path.join("dir0", "deep", "deep", "deep", "file 3.bin")][4]
    assert m["dangling"] == ["symlink", None, "does/not/exist", None, None]
