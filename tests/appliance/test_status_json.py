"""`--json` output: one name a value (the one with the unit spelled out), times in ISO 8601."""
from __future__ import annotations

import datetime
from types import SimpleNamespace

from appliance.daemon import Daemon, RateMeter

OLD_NAMES = {"oldest_dirty_age_s", "uploaded_bytes", "errors"}


def test_status_upload_names_each_value_once(tmp_path):
    """status["upload"] is the uploader's own status (oldest_dirty_age_seconds, bytes_uploaded,
    permanent_errors) plus the daemon's rate: no second name for any of its values."""
    from cache.store import Store
    from uploader.objectclient import Boto3ObjectClient
    from uploader.service import Uploader
    from uploader.settings import S3Settings, UploadSettings
    store = Store.open(str(tmp_path / "c"), evict=False)
    try:
        client = Boto3ObjectClient(S3Settings(bucket="bkt", endpoint_url="http://127.0.0.1:1", access_key="a",
                                              secret_key="s"))
        uploader = Uploader(store, client, UploadSettings())
        uploader.counters.bytes_uploaded, uploader.counters.permanent_errors = 4096, 2
        uploader.counters.last_error = "NoSuchBucket: gone"
        own = uploader.status()
        daemon = SimpleNamespace(uploader=uploader, upload_rate=RateMeter())
        up = Daemon._upload_status(daemon)
    finally:
        store.close()
    assert not OLD_NAMES & set(up), sorted(OLD_NAMES & set(up))
    assert set(up) == set(own) | {"running", "rate_bytes_per_s", "last_errors"}, sorted(set(up) ^ set(own))
    assert up["bytes_uploaded"] == 4096 and up["permanent_errors"] == 2 and "oldest_dirty_age_seconds" in up
    assert up["last_errors"] == ["NoSuchBucket: gone"]


def test_retention_plan_time_is_iso_8601():
    from uploader import retention
    t = 1764297680.5            # 2025-11-28T02:41:20.5Z
    out = retention._public({"generated": t, "actions": [], "checkpoints": [], "notes": []})
    assert out["generated"] == "2025-11-28T02:41:20.500Z"
    assert datetime.datetime.fromisoformat(out["generated"].replace("Z", "+00:00")).timestamp() == t
