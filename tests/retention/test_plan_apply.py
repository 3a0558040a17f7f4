"""The synthetic series: 50 checkpoints with mixed ages, a pin, an incomplete one and a stale
temporary directory; plan and apply against moto give exactly the expected survivors."""
import re
import time

from tests.retention.rhelp import (DAY, HOUR, INCOMPLETE, PINNED, PREFIX, STEPS, Rule, Settings, T,
                                   age_series, ckpt, drain, exists, make_uploader, objects, run,
                                   set_age, write_file, write_series)
from uploader import retention

RULE = Rule(keep_last=3, keep_every=1000, min_age=HOUR, expire_after=30 * DAY,
            transitions=(T(7 * DAY, "GLACIER_IR"),), stale_tmp_after=DAY)

# worked out by hand from rhelp.age_of (step 5000: 30 min old; 100 steps older = one day more)
EXPECTED_DELETED = {s for s in STEPS if s <= 2000} - {1000, 2000, PINNED}
EXPECTED_TRANSITIONED = {s for s in STEPS if 2100 <= s <= 4300} | {1000, 2000}


async def populate(store, up, now, settings=None):
    """Write the series through the store, let the uploader make it clean, then age and pin it."""
    write_series(store)
    write_file(store, "runs/a/step_000900.tmp/model.pt", b"t" * 10)                 # a crashed save
    assert await up.flush("runs", timeout=120)
    write_file(store, f"{ckpt(INCOMPLETE)}/model.pt", b"w" * 100, keep_open=True)   # still being written
    age_series(store, now)
    set_age(store, ckpt(INCOMPLETE), 0.1 * HOUR, now)
    set_age(store, "runs/a/step_000900.tmp", 2 * DAY, now)
    retention.set_pin(store, ckpt(PINNED), True, "paper figure 3", settings or Settings())


def test_plan_lists_expected_actions_then_apply_leaves_exact_survivors(moto, bucket, store):
    now = time.time()

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        try:
            await populate(store, up, now)
            kw = dict(store=store, rules=[RULE], object_client=up.client, now=now, settings=Settings())
            plan = await retention.plan(**kw)
            result = await retention.apply(**kw, uploader=up)
            await drain(up)
            again = await retention.plan(**kw)
            keys = objects(up.client)
            classes = {s: up.client.storage_class(f"{PREFIX}{ckpt(s)}/model.pt") for s in (1000, 2100, 4300, 4400)}
            tags = up.client.get_object_tags(f"{PREFIX}{ckpt(3100)}/optim.pt")
            return plan, result, again, keys, classes, tags
        finally:
            await up.stop()

    plan, result, again, keys, classes, tags = run(main())
    by = {}
    for a in plan["actions"]:
        by.setdefault(a["action"], []).append(a)
    deleted = {int(a["checkpoint"][-6:]) for a in by["delete"]}
    assert deleted == EXPECTED_DELETED
    assert {int(a["checkpoint"][-6:]) for a in by["transition"]} == EXPECTED_TRANSITIONED
    assert [a["checkpoint"] for a in by["delete-tmp"]] == ["runs/a/step_000900.tmp"]
    for a in by["delete"]:
        assert a["rule"] == "expire_after=30d" and "not kept" in a["reason"]
    verdict = {v["checkpoint"]: v for v in plan["checkpoints"]}
    assert verdict[ckpt(PINNED)]["klass"] == "pinned" and "paper figure 3" in verdict[ckpt(PINNED)]["reasons"][0]
    assert verdict[ckpt(INCOMPLETE)]["klass"] == "protected"
    assert verdict[ckpt(5000)]["reasons"][0] == "newest complete checkpoint"
    # apply: exactly the survivors in the namespace and in S3
    applied = {a["checkpoint"] for a in result["actions"] if a["action"] == "delete"}
    assert applied == {ckpt(s) for s in EXPECTED_DELETED}
    for s in STEPS:
        assert exists(store, ckpt(s)) == (s not in EXPECTED_DELETED), s
    assert not exists(store, "runs/a/step_000900.tmp")
    assert exists(store, ckpt(INCOMPLETE))
    assert not [a for a in again["actions"] if a["action"] in ("delete", "transition", "delete-tmp")]
    # S3: the deleted checkpoints' objects are gone, every survivor's are there
    for s in STEPS:
        for name in ("model.pt", "optim.pt"):
            assert (f"{PREFIX}{ckpt(s)}/{name}" in keys) == (s not in EXPECTED_DELETED), (s, name)
    assert not [k for k in keys if ".tmp" in k]
    assert classes == {1000: "GLACIER_IR", 2100: "GLACIER_IR", 4300: "GLACIER_IR", 4400: "STANDARD"}
    assert tags == {"ckptgw-series": "llama-70b", "ckptgw-class": "expirable"}
    # the audit log has every action
    log = run(retention.log_entries(store=store, limit=0))["entries"]
    done = {e["checkpoint"] for e in log if e.get("action") == "delete" and e["status"] == "done"}
    assert done == {ckpt(s) for s in EXPECTED_DELETED}
    # times as every JSON output gives them (ISO 8601, UTC), under one name
    assert all("t" not in e and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"])
               for e in log), log[:2]
