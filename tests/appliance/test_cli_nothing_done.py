"""Human output says "nothing ..." when a command found nothing to do, never "done" with zero
counts ("evicted 0 file(s), freed 0 B") (issue 39, CLI). The replies are given; no daemon."""
from __future__ import annotations

from unittest import mock

import pytest
from click.testing import CliRunner

import appliance.cli as cli


def run(args, reply):
    with mock.patch.object(cli, "call", return_value=reply):
        r = CliRunner().invoke(cli.main, args)
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout.strip()


@pytest.mark.parametrize("args, nothing, something, words_nothing, words_something", [
    (["flush", "run1"],
     {"path": "run1", "waited": False, "pending_files": 0, "pending_bytes": 0, "total_bytes": 2048},
     {"path": "run1", "waited": False, "pending_files": 2, "pending_bytes": 1024, "total_bytes": 2048},
     "run1: nothing to upload, all 2.0 KiB in S3", "run1: 2 file(s), 1.0 KiB queued for upload"),
    (["pin", "run1"], {"files": 0}, {"files": 3},
     "nothing pinned: no files under run1", "pinned 3 file(s) under run1"),
    (["unpin", "run1"], {"files": 0}, {"files": 3},
     "nothing unpinned: no files under run1", "unpinned 3 file(s) under run1"),
    (["evict", "run1"], {"evicted_files": 0, "freed_bytes": 0, "skipped": {"pinned": 2}},
     {"evicted_files": 1, "freed_bytes": 1024, "skipped": {}},
     "nothing evicted under run1; skipped: 2 pinned", "evicted 1 file(s), freed 1.0 KiB"),
    (["warmup", "run1"], {"path": "run1", "files": 0, "bytes": 0}, {"path": "run1", "files": 1, "bytes": 4096},
     "nothing to fetch: every file under run1 is in the cache", "fetched 1 file(s), 4.0 KiB"),
    (["verify", "run1"],
     {"checked": 0, "ok": 0, "mismatches": [], "skipped_not_local": 0, "not_uploaded": 4},
     {"checked": 2, "ok": 2, "mismatches": [], "skipped_not_local": 0, "not_uploaded": 0},
     "nothing to verify under run1: no file there is in S3 yet (4 not yet uploaded)",
     "checked 2 file(s): 2 match, 0 differ, 0 not cached, 0 not yet uploaded"),
    (["import"],
     {"imported": 0, "directories": 0, "symlinks": 0, "already_present": 5, "invalid_keys": []},
     {"imported": 3, "directories": 1, "symlinks": 0, "already_present": 0, "invalid_keys": []},
     "nothing to import; 5 name(s) already present (local data wins)",
     "imported 3 object(s), 1 directory marker(s); 0 name(s) already present (local data wins)"),
    (["retention", "apply", "--yes"], {"actions": [], "queued_jobs": 0, "skipped": []},
     {"actions": [{"id": "x"}], "queued_jobs": 2, "skipped": []},
     "nothing to do", "applied 1 action(s); 2 S3 job(s) queued"),
])
def test_nothing_done_is_said_as_such(args, nothing, something, words_nothing, words_something):
    assert run(args, nothing) == words_nothing
    assert run(args, something) == words_something
