"""Series matching and the rules, one by one and combined (plan only: files are marked clean
in the store without S3, so these need no server)."""
import time

import pytest

from tests.retention.rhelp import (DAY, HOUR, Rule, Settings, T, age_of, ckpt, exists, mark_clean,
                                   set_age, write_file, write_series)
from uploader import retention
from uploader.series import PatternError, parse_pattern

STEPS = list(range(100, 2001, 100))        # 20 checkpoints, step 2000 is 30 min old, step 100 is 19 days


# ---- patterns -----------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,name_path,step", [
    ("runs/*/step_{step}", ["runs", "a", "step_000900"], 900),
    ("runs/*/step_{step}", ["runs", "b", "step_12"], 12),
    ("ckpt-{step}", ["ckpt-7"], 7),
    ("exp/*/*", ["exp", "x", "y"], None),
    ("runs/llama/step-{step}/**", ["runs", "llama", "step-3"], 3),
])
def test_pattern_matches_whole_components(pattern, name_path, step):
    p = parse_pattern(pattern)
    got = None
    for i, name in enumerate(name_path):
        ok, captured = p.match_component(i, name)
        assert ok, (pattern, name)
        got = captured if captured is not None else got
    assert got == step


@pytest.mark.parametrize("pattern,index,name", [
    ("runs/*/step_{step}", 2, "step_000900.tmp"),
    ("runs/*/step_{step}", 2, "step_"),
    ("runs/*/step_{step}", 2, "xstep_1"),
    ("runs/*/step_{step}", 0, "run"),
])
def test_pattern_refuses_partial_names(pattern, index, name):
    assert not parse_pattern(pattern).match_component(index, name)[0]


@pytest.mark.parametrize("bad", ["", "/", "runs//x", "runs/../x", "a/**/b", "a/{step}/{step}", "a/{epoch}",
                                 "a/step_{step}{step}"])
def test_bad_patterns_are_refused(bad):
    with pytest.raises(PatternError, match="expected"):
        parse_pattern(bad)


def test_literal_prefix():
    assert parse_pattern("runs/*/step_{step}").literal_prefix == "runs/"
    assert parse_pattern("a/b/step_{step}").literal_prefix == "a/b/"
    assert parse_pattern("*/x").literal_prefix == ""


# ---- rules ------------------------------------------------------------------------------------
def _series(store, now, steps=STEPS, run="a"):
    write_series(store, steps=steps, run=run)
    for s in steps:
        mark_clean(store, ckpt(s, run))
        set_age(store, ckpt(s, run), age_of(s) - age_of(2000) + 0.5 * HOUR, now)


def _survivors(store, rule, now, settings=None):
    p = retention.build_plan(store, [rule], None, now, settings)
    deleted = {a.checkpoint for a in p["actions"] if a.action == "delete"}
    return {int(v.checkpoint[-6:]) for v in p["checkpoints"] if v.checkpoint not in deleted}, p


@pytest.fixture
def series(store):
    now = time.time()
    _series(store, now)
    return store, now


@pytest.mark.parametrize("rule,expected", [
    # keep_last only, everything else expires after 1 h: the 3 newest complete and the young one
    (Rule(keep_last=3, expire_after=HOUR), {1800, 1900, 2000}),
    # keep_last=0: the newest complete checkpoint survives anyway (safety)
    (Rule(keep_last=0, expire_after=HOUR), {2000}),
    # keep_every: multiples of 500, plus the newest
    (Rule(keep_last=0, keep_every=500, expire_after=HOUR), {500, 1000, 1500, 2000}),
    # expire_after 10 days: steps whose age is above 10 d go (step 1000 is 10 d 30 min old)
    (Rule(keep_last=1, expire_after=10 * DAY), set(range(1100, 2001, 100))),
    # min_age larger than everything: nothing is touched
    (Rule(keep_last=0, min_age=30 * DAY, expire_after=30 * DAY), set(STEPS)),
    # no expiry: nothing is deleted
    (Rule(keep_last=0, expire_after=None), set(STEPS)),
    # all rules combined
    (Rule(keep_last=2, keep_every=700, min_age=2 * DAY, expire_after=5 * DAY),
     {700, 1400} | set(range(1600, 2001, 100))),
])
def test_rules_and_combinations_give_the_expected_survivors(series, rule, expected):
    store, now = series
    survivors, _ = _survivors(store, rule, now)
    assert survivors == expected


def test_pins_incomplete_and_open_checkpoints_are_never_touched(series):
    store, now = series
    retention.set_pin(store, ckpt(300), True, "keep for the paper", Settings(pin_lock="off"))
    write_file(store, f"{ckpt(400)}/extra.pt", b"x")          # dirty: not in S3 yet
    ino = write_file(store, f"{ckpt(500)}/model.pt.part", b"y")
    mark_clean(store, ckpt(500))
    store.open_file(ino, False)                                # open (read) right now
    for s in (300, 400, 500):
        set_age(store, ckpt(s), 40 * DAY, now)
    rule = Rule(keep_last=0, expire_after=HOUR, transitions=(T(0.5 * HOUR, "GLACIER_IR"),))
    survivors, p = _survivors(store, rule, now)
    assert survivors == {300, 400, 500, 2000}
    verdict = {v.checkpoint: v for v in p["checkpoints"]}
    assert verdict[ckpt(300)].klass == "pinned" and "keep for the paper" in verdict[ckpt(300)].reasons[0]
    assert verdict[ckpt(400)].reasons == ["incomplete: 1 file(s) not yet in S3"]
    assert verdict[ckpt(500)].reasons == ["incomplete: 1 file(s) open"]
    store.close_file(ino, False)


def test_the_newest_complete_is_safe_even_when_old(store):
    now = time.time()
    _series(store, now, steps=[100, 200, 300])
    for s in (100, 200, 300):
        set_age(store, ckpt(s), 100 * DAY, now)
    write_file(store, f"{ckpt(400)}/model.pt", b"partial")     # newer, but not complete
    survivors, p = _survivors(store, Rule(keep_last=0, expire_after=DAY,
                                          transitions=(T(DAY, "GLACIER"),)), now)
    assert survivors == {300, 400}
    # never transitioned either: no S3 client here, but the verdicts say protected
    assert {v.checkpoint: v.klass for v in p["checkpoints"]}[ckpt(300)] == "protected"


def test_stale_tmp_entries_go_after_their_age_open_ones_stay(store):
    now = time.time()
    _series(store, now, steps=[100, 200])
    write_file(store, "runs/a/step_000300.tmp/model.pt", b"t")
    write_file(store, f"{ckpt(100)}/model.pt.tmp", b"u")
    ino = write_file(store, "runs/a/.tmp_upload", b"v", keep_open=True)
    write_file(store, "runs/a/step_000400.tmp/model.pt", b"w")       # young
    for path in ("runs/a/step_000300.tmp", f"{ckpt(100)}/model.pt.tmp", "runs/a/.tmp_upload"):
        set_age(store, path, 3 * DAY, now)
    p = retention.build_plan(store, [Rule(expire_after=None)], None, now)
    tmp = sorted(a.checkpoint for a in p["actions"] if a.action == "delete-tmp")
    assert tmp == ["runs/a/step_000100/model.pt.tmp", "runs/a/step_000300.tmp"]
    # a checkpoint with a temporary file inside is incomplete until it is cleaned
    assert {v.checkpoint: v.complete for v in p["checkpoints"]}[ckpt(100)] is False
    removed, refused = retention.remove_tree(store, "runs/a/.tmp_upload", ino, allow_dirty=True)
    assert (removed, refused) == (0, ".tmp_upload: open")
    store.close_file(ino, True)


def test_series_without_step_are_ordered_by_mtime(store):
    now = time.time()
    for i, name in enumerate(["zeta", "alpha", "mid"]):
        write_file(store, f"exp/{name}/w.pt", b"x")
        mark_clean(store, f"exp/{name}")
        set_age(store, f"exp/{name}", (3 - i) * DAY, now)          # zeta oldest, mid newest
    rule = Rule(name="exp", pattern="exp/*", keep_last=1, expire_after=HOUR)
    p = retention.build_plan(store, [rule], None, now)
    assert [v.checkpoint for v in p["checkpoints"]] == ["exp/zeta", "exp/alpha", "exp/mid"]
    assert sorted(a.checkpoint for a in p["actions"] if a.action == "delete") == ["exp/alpha", "exp/zeta"]


def test_apply_refuses_what_became_unsafe_after_the_plan(store):
    now = time.time()
    _series(store, now, steps=[100, 200, 300])
    p = retention.build_plan(store, [Rule(keep_last=0, expire_after=HOUR)], None, now)
    target = next(a for a in p["actions"] if a.action == "delete")
    ino = store.lookup(store.lookup(store.lookup(1, b"runs").ino, b"a").ino,
                       target.checkpoint.rsplit("/", 1)[1].encode()).ino
    write_file(store, f"{target.checkpoint}/late.pt", b"written after the plan")
    removed, refused = retention.remove_tree(store, target.checkpoint, ino)
    assert removed == 0 and "not clean" in refused and exists(store, target.checkpoint)


def test_the_daemon_schedule_applies_by_itself(store):
    """appliance.daemon.Daemon._retention_forever: resume once, then apply every `schedule`."""
    import asyncio
    from types import SimpleNamespace
    from appliance.daemon import Daemon

    calls = []

    class Commands:
        async def _rules_module(self, name, action, args):
            calls.append((name, action, args))
            return {"actions": [], "skipped": [], "queued_jobs": 0}

    fake = SimpleNamespace(store=store, commands=Commands(), config=SimpleNamespace(
        retention=SimpleNamespace(schedule=0.05, series=(Rule(),))))

    async def main():
        task = asyncio.create_task(Daemon._retention_forever(fake))
        await asyncio.sleep(0.5)
        fake.config.retention.schedule = None            # a reload turned it off
        n = len(calls)
        await asyncio.sleep(0.3)
        task.cancel()
        return n
    n = asyncio.run(main())
    assert n >= 2 and calls[0] == ("retention", "apply", {})
    assert len(calls) == n


def test_a_permanent_s3_error_ends_a_retention_job_loudly(store):
    """A 403 on a tag/lock/transition is not retried forever (it would hold back uploads of the
    path): the job ends, the audit log says why, the next plan derives it again."""
    import asyncio
    from types import SimpleNamespace
    from cache.api import RemoteInfo
    from uploader.keys import KeyMap
    from uploader.objectclient import PermanentError

    ino = write_file(store, "runs/a/step_000100/model.pt", b"m")
    store.mark_uploaded(ino, RemoteInfo(key="runs/a/step_000100/model.pt", etag='"e"',
                                        uploaded_change=store.getattr(ino).change, size=1))

    class Denied:
        def put_object_tags(self, key, tags):
            raise PermanentError("AccessDenied", "no s3:PutObjectTagging", 403)

    class Gate:
        async def call(self, op, fn, what=""):
            return fn()

    up = SimpleNamespace(store=store, client=Denied(), gate=Gate(), keys=KeyMap("gw/"), job_handlers={})
    retention.install_job_handlers(up)
    run_job = up.job_handlers[retention.JOB_KIND][0]
    outcome = asyncio.run(run_job({"kind": "retention", "op": "tag", "ino": ino, "series": "s", "klass": "kept",
                                   "path": "runs/a/step_000100/model.pt", "checkpoint": "runs/a/step_000100"}))
    assert outcome == "failed: AccessDenied"
    [entry] = [e for e in retention.Records(store).entries() if e.get("status") == "failed"]
    assert entry["action"] == "tag" and "AccessDenied" in entry["detail"]


def test_a_nested_tree_is_removed_children_first_and_pinned_through_every_level(store):
    # remove_tree and set_pin walk the subtree with Store.walk, the one subtree walk
    for path in ("runs/n/step_000100/model.pt", "runs/n/step_000100/shards/0.pt",
                 "runs/n/step_000100/shards/deep/1.pt", "runs/n/step_000100/shards/deep/2.pt"):
        write_file(store, path, path.encode())
    mark_clean(store, "runs/n/step_000100")
    retention.set_pin(store, "runs/n/step_000100", True, "keep")
    pinned = retention.pin_reasons(store)
    assert len(pinned) == 7                  # the checkpoint, 2 directories below it, 4 files
    ino = store.lookup(store.lookup(store.lookup(1, b"runs").ino, b"n").ino, b"step_000100").ino
    assert retention.remove_tree(store, "runs/n/step_000100", ino) == (0, "step_000100: pinned")
    retention.set_pin(store, "runs/n/step_000100", False)
    assert retention.pin_reasons(store) == {}
    assert retention.remove_tree(store, "runs/n/step_000100", ino) == (7, None)
    assert not exists(store, "runs/n/step_000100") and exists(store, "runs/n")
