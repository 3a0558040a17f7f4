"""Human output of `ckptgw` from given replies (no daemon): tables, units, progress percentages."""
from __future__ import annotations

from unittest import mock

from click.testing import CliRunner

import appliance.cli as cli

STATUS = {"tryout": False, "s3": {"endpoint": "https://s3.example", "bucket": "ckpt", "prefix": "gw/"},
          "listen": "0.0.0.0:2049", "exports": ["/checkpoints"], "uptime_s": 4000,
          "nfs": {"clients": 3, "ops_total": 120, "errors_total": 4},
          "cache": {"used": 3 << 30, "capacity": 100 << 30, "dirty_bytes": 512 << 20},
          "upload": {"running": True, "queue_depth": 2, "oldest_dirty_age_s": 75.0, "rate_bytes_per_s": 200 << 20,
                     "uploaded_bytes": 5 << 30, "retries": 7, "throttles": 2,
                     "uploading": [{"path": "run1/b.bin", "size": 4 << 20, "bytes_done": 1 << 20}],
                     "last_errors": ["SlowDown on UploadPart"]}}


def run(args, reply):
    with mock.patch.object(cli, "call", return_value=reply):
        return CliRunner().invoke(cli.main, args)


def test_status_table():
    out = run(["status"], STATUS).output.splitlines()
    rows = {line[:14].strip(): line[14:] for line in out if line and not line.startswith(" ")}
    assert rows["mode"] == "S3"
    assert rows["cache used"] == "3.0 GiB of 100.0 GiB"
    assert rows["dirty"] == "512.0 MiB"
    assert rows["oldest dirty"] == "1m15s"
    assert rows["upload rate"] == "200.0 MiB/s"
    assert rows["retries"] == "7" and rows["throttles"] == "2"
    assert "  run1/b.bin   25%  4.0 MiB" in out
    assert out[-1] == "  SlowDown on UploadPart"


def test_ls_shows_progress_and_pins():
    reply = {"path": "run1", "entries": [
        {"path": "run1/a.bin", "type": "reg", "size": 1536, "state": "clean", "pinned": True, "pin_reason": "best",
         "progress": None},
        {"path": "run1/b.bin", "type": "reg", "size": 4 << 20, "state": "uploading", "pinned": False,
         "progress": 0.426},
        {"path": "run1/sub", "type": "dir", "size": 4096, "state": "clean", "pinned": False, "progress": None}]}
    out = run(["ls", "run1"], reply).output.splitlines()
    assert out[0].split() == ["PATH", "TYPE", "SIZE", "STATE", "PIN"]
    assert out[1].split() == ["run1/a.bin", "reg", "1.5", "KiB", "clean", "pinned", "(best)"]
    assert out[2].split() == ["run1/b.bin", "reg", "4.0", "MiB", "uploading", "42%"]
    assert out[3].split() == ["run1/sub/", "dir", "-", "-"]
    # SIZE is right-aligned
    assert out[1].index("KiB") == out[2].index("MiB")
