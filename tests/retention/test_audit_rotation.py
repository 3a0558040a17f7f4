"""The retention audit log is rotated by size at the start of an apply, after resume() has closed
every open intent; `retention log` reads across the generations."""
import os

from tests.retention.rhelp import Settings, exists, mark_clean, resolve, run, write_file
from uploader import retention
from uploader.retention import Records


def fill(records: Records, n: int, tag: str) -> None:
    for i in range(n):
        records.audit(action="pin", checkpoint=f"{tag}/{i}", reason="x" * 200)


def generations(records: Records) -> list[str]:
    return sorted(name for name in os.listdir(records.dir) if name.startswith("audit.jsonl"))


def test_small_log_is_not_rotated(store):
    records = Records(store)
    fill(records, 3, "a")
    assert records.rotate_if_large(limit=1 << 20) is False
    assert generations(records) == ["audit.jsonl"]


def test_rotation_keeps_n_generations_and_log_reads_across_them(store):
    records = Records(store)
    for gen in range(6):                       # 6 rotations, 2 generations kept
        fill(records, 10, f"g{gen}")
        assert records.rotate_if_large(limit=1000, keep=2) is True
    fill(records, 5, "current")
    assert generations(records) == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert [e["checkpoint"] for e in records.entries()] == [f"current/{i}" for i in range(5)]
    assert records.entries(1)[0]["checkpoint"] == "g5/0" and records.entries(2)[0]["checkpoint"] == "g4/0"
    # the newest 12: 7 from generation 1, then the current 5, oldest first
    newest = run(retention.log_entries(store=store, limit=12))["entries"]
    assert [e["checkpoint"] for e in newest] == [f"g5/{i}" for i in range(3, 10)] + [f"current/{i}" for i in range(5)]
    assert len(run(retention.log_entries(store=store, limit=0))["entries"]) == 5 + 10 + 10 + 10 + 10 - 20


def test_apply_finishes_an_open_intent_before_it_rotates(store, monkeypatch):
    """A crash left a delete `started`; the log is over the limit. The next apply must still see
    the intent (resume reads only the current log), finish it, and only then rotate."""
    write_file(store, "runs/a/step_000100/model.pt", b"m" * 10)
    mark_clean(store, "runs/a/step_000100")
    ino = resolve(store, "runs/a/step_000100").ino
    records = Records(store)
    fill(records, 40, "old")
    records.audit(action=retention.DELETE, id="delete:runs/a/step_000100:x", checkpoint="runs/a/step_000100",
                  ino=ino, status="started")
    monkeypatch.setattr(retention, "AUDIT_ROTATE_BYTES", 1000)
    result = retention._apply_sync(store, [], None, 0.0, Settings(), None)
    assert [r["status"] for r in result["resumed"]] == ["done"]
    assert not exists(store, "runs/a/step_000100")
    assert generations(records) == ["audit.jsonl.1"]     # rotated after the resume's "done" entry
    rotated = records.entries(1)
    assert rotated[-1]["status"] == "done" and rotated[-1]["checkpoint"] == "runs/a/step_000100"
