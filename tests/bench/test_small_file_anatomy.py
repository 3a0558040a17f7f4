"""bench/small_file_anatomy.py's in-process probes count what a save does. Session 31 found its
COMPOUND count 0.00 and no ops by name: the probe wrapped NfsServer._run_compound, which the
native engine's handle_call never calls. A few saves through the real server; the counts that
cannot vary for the nfs-rs save (one WRITE, one COMMIT, one RENAME each) and a non-zero
COMPOUND count, whichever engine is built."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.small_file_anatomy import anatomy  # noqa: E402


def test_the_probes_count_compounds_and_ops_of_every_save():
    out = anatomy(REPO, files=6)
    assert out["COMPOUNDs"] >= 10                    # 14 on nfs-rs 2026-11 (SEQUENCE'd 4.1)
    for op in ("WRITE", "COMMIT", "RENAME", "REMOVE", "CLOSE"):
        assert out["ops"].get(op) == 1.0, (op, out["ops"])
    assert out["fdatasyncs: data files"] >= 1.0      # COMMIT's data fdatasync
    assert out["index commits"] >= 1.0
