"""The S3 side against moto: lifecycle sync round trip beside a foreign rule, Object Lock on
pinned checkpoints, apply through an S3 outage."""
import asyncio
import time

import pytest

from tests.retention.rhelp import (DAY, HOUR, PREFIX, Rule, Settings, T, ckpt, client, drain,
                                   exists, make_uploader, objects, run, set_age, write_series)
from uploader import lifecycle, retention

FOREIGN = {"ID": "team-logs-expiry", "Status": "Enabled", "Filter": {"Prefix": "logs/"},
           "Expiration": {"Days": 90}}


def test_lifecycle_sync_round_trips_and_keeps_a_foreign_rule(moto, bucket):
    cl = client(moto.endpoint, bucket)
    cl.put_lifecycle_rules([FOREIGN])
    rules = [Rule(expire_after=30 * DAY, transitions=(T(7 * DAY, "GLACIER_IR"), T(20 * DAY, "DEEP_ARCHIVE"))),
             Rule(name="small", pattern="small/step_{step}", expire_after=None)]
    kw = dict(object_client=cl, rules=rules, prefix=PREFIX, settings=Settings(abort_incomplete_multipart_days=3))
    p = run(lifecycle.plan(**kw))
    assert not p["in_sync"] and p["foreign_rules_kept"] == ["team-logs-expiry"]
    assert sorted(a["rule"] for a in p["actions"]) == ["ckptgw-abort-multipart", "ckptgw-llama-70b-expirable",
                                                       "ckptgw-llama-70b-kept"]
    res = run(lifecycle.sync(**kw))
    assert res["written"] and res["in_sync"]
    stored = {r["ID"]: r for r in cl.get_lifecycle_rules()}
    assert lifecycle._normal(stored["team-logs-expiry"]) == lifecycle._normal(FOREIGN)
    exp = stored["ckptgw-llama-70b-expirable"]
    assert exp["Expiration"] == {"Days": 30}
    transitions = [(t["Days"], t["StorageClass"]) for t in exp["Transitions"]]
    assert transitions == [(7, "GLACIER_IR"), (20, "DEEP_ARCHIVE")]
    assert exp["Filter"]["And"]["Prefix"] == "gw/runs/"
    assert {t["Key"]: t["Value"] for t in exp["Filter"]["And"]["Tags"]} == {
        "ckptgw-series": "llama-70b", "ckptgw-class": "expirable"}
    assert "Expiration" not in stored["ckptgw-llama-70b-kept"]
    assert stored["ckptgw-abort-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 3}
    assert run(lifecycle.plan(**kw))["in_sync"]
    # a series dropped from the config: its rules go, the foreign one stays
    kw["rules"] = rules[1:]
    res = run(lifecycle.sync(**kw))
    assert [a["rule"] for a in res["actions"] if a["action"] == "remove"] == [
        "ckptgw-llama-70b-expirable", "ckptgw-llama-70b-kept"]
    assert sorted(r["ID"] for r in cl.get_lifecycle_rules()) == ["ckptgw-abort-multipart", "team-logs-expiry"]


def _pinned_checkpoint(moto, bucket, store, settings):
    now = time.time()

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            write_series(store, steps=[100, 200])
            assert await up.flush("runs", timeout=60)
            res = retention.set_pin(store, ckpt(100), True, "release v1", settings)
            await drain(up)
            return up, res
        finally:
            await up.stop()
    return now, *run(main())


def test_pin_sets_a_legal_hold_and_s3_refuses_the_delete(moto, locked_bucket, store):
    _, up, res = _pinned_checkpoint(moto, locked_bucket, store, Settings())
    assert res["lock_jobs"] == 2
    cl = up.client
    key = f"{PREFIX}{ckpt(100)}/model.pt"
    assert cl.get_legal_hold(key) is True
    assert cl.get_legal_hold(f"{PREFIX}{ckpt(200)}/model.pt") is False
    version = cl._s3.head_object(Bucket=cl.bucket, Key=key)["VersionId"]
    with pytest.raises(Exception) as e:
        cl._s3.delete_object(Bucket=cl.bucket, Key=key, VersionId=version)
    assert "AccessDenied" in str(e.value)
    # unpin lifts the hold; then the version can go
    async def unpin():
        up2 = make_uploader(store, moto.endpoint, locked_bucket)
        await up2.start()
        try:
            retention.set_pin(store, ckpt(100), False, "", Settings())
            await drain(up2)
        finally:
            await up2.stop()
    run(unpin())
    assert cl.get_legal_hold(key) is False
    cl._s3.delete_object(Bucket=cl.bucket, Key=key, VersionId=version)


def test_pin_lock_governance_sets_a_retention_period(moto, locked_bucket, store):
    now, up, _ = _pinned_checkpoint(moto, locked_bucket, store, Settings(pin_lock="governance", pin_lock_days=10))
    mode, until = up.client.get_retention(f"{PREFIX}{ckpt(100)}/optim.pt")
    assert mode == "GOVERNANCE" and abs(until - (now + 10 * DAY)) < 120
    assert up.client.get_legal_hold(f"{PREFIX}{ckpt(100)}/optim.pt") is False


def test_lock_actions_appear_in_the_plan_for_pins_made_before_the_upload(moto, locked_bucket, store):
    now = time.time()

    async def main():
        up = make_uploader(store, moto.endpoint, locked_bucket)
        write_series(store, steps=[100, 200])
        retention.set_pin(store, ckpt(100), True, "before upload", Settings())     # nothing in S3 yet
        await up.start()
        try:
            assert await up.flush("runs", timeout=60)
            kw = dict(store=store, rules=[Rule()], object_client=up.client, now=now, settings=Settings())
            plan = await retention.plan(**kw)
            await retention.apply(**kw, uploader=up)
            await drain(up)
            return up, plan
        finally:
            await up.stop()
    up, plan = run(main())
    locks = [a for a in plan["actions"] if a["action"] == "lock"]
    assert [(a["checkpoint"], a["files"], a["rule"]) for a in locks] == [(ckpt(100), 2, "pin_lock=legal-hold")]
    assert up.client.get_legal_hold(f"{PREFIX}{ckpt(100)}/optim.pt") is True


def test_no_lock_actions_without_object_lock(moto, bucket, store):
    now = time.time()

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            write_series(store, steps=[100])
            assert await up.flush("runs", timeout=60)
            retention.set_pin(store, ckpt(100), True, "x", Settings())
            await drain(up)
            return await retention.plan(store=store, rules=[Rule()], object_client=up.client, now=now)
        finally:
            await up.stop()
    plan = run(main())
    assert not [a for a in plan["actions"] if a["action"] == "lock"]
    log = run(retention.log_entries(store=store, limit=0))["entries"]
    assert [e["detail"] for e in log if e.get("action") == "lock"] == ["bucket has no Object Lock"] * 2


def test_apply_during_an_s3_outage_completes_once_s3_is_back(moto, proxy, bucket, store):
    now = time.time()
    steps = list(range(100, 1001, 100))
    rule = Rule(keep_last=2, expire_after=5 * DAY, transitions=(T(2 * DAY, "STANDARD_IA"),))

    async def main():
        up = make_uploader(store, proxy.endpoint, bucket)
        await up.start()
        try:
            write_series(store, steps=steps)
            assert await up.flush("runs", timeout=60)
            for s in steps:
                set_age(store, ckpt(s), (1000 - s) / 100 * DAY + HOUR, now)
            proxy.faults.error_rate = 1.0                      # every request: 503
            kw = dict(store=store, rules=[rule], object_client=up.client, now=now, settings=Settings())
            result = await retention.apply(**kw, uploader=up)
            # the namespace changed at once; S3 did not
            gone = [a["checkpoint"] for a in result["actions"] if a["action"] == "delete"]
            assert gone and not any(exists(store, c) for c in gone)
            await asyncio.sleep(1.0)
            assert store.queue_list(1)                          # work waits in the durable queue
            assert f"{PREFIX}{gone[0]}/model.pt" in objects(client(proxy.endpoint.replace(
                str(proxy.port), str(moto.port)), bucket))
            proxy.clear()
            await drain(up)
            return gone
        finally:
            await up.stop()
    gone = run(main())
    keys = objects(client(moto.endpoint, bucket))
    assert sorted(gone) == [ckpt(s) for s in range(100, 600, 100)]
    for s in steps:
        assert (f"{PREFIX}{ckpt(s)}/model.pt" in keys) == (s >= 600)
    cl = client(moto.endpoint, bucket)
    assert cl.storage_class(f"{PREFIX}{ckpt(700)}/model.pt") == "STANDARD_IA"
    assert cl.storage_class(f"{PREFIX}{ckpt(1000)}/model.pt") == "STANDARD"
