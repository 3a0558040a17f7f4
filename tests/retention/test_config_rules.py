"""Invalid [[retention.series]] rules are refused at load (start and reload) with the file, the
line, the key and what was expected."""
import textwrap

import pytest

from appliance import config as c


def load(tmp_path, text):
    p = tmp_path / "config.toml"
    p.write_text(textwrap.dedent(text))
    return c.load(str(p))


def error_of(tmp_path, text) -> c.ConfigError:
    with pytest.raises(c.ConfigError) as e:
        load(tmp_path, text)
    return e.value


def test_the_issue_example_loads(tmp_path):
    cfg = load(tmp_path, """
        [retention]
        pin_lock = "governance"
        pin_lock_days = 30
        schedule = "15m"

        [[retention.series]]
        name = "llama-70b"
        pattern = "runs/*/step_{step}"
        keep_last = 3
        keep_every = 1000
        min_age = "1h"
        expire_after = "30d"
        transitions = [{ after = "7d", storage_class = "GLACIER_IR" }]
        stale_tmp_after = "1d"
    """)
    r = cfg.retention
    assert (r.pin_lock, r.pin_lock_days, r.schedule, r.abort_incomplete_multipart_days) == (
        "governance", 30, 900.0, 7)
    s = r.series[0]
    assert (s.pattern, s.keep_last, s.keep_every, s.min_age, s.expire_after, s.stale_tmp_after) == (
        "runs/*/step_{step}", 3, 1000, 3600.0, 30 * 86400.0, 86400.0)


@pytest.mark.parametrize("body,line,key,expected", [
    ('pattern = "runs/{step}/{step}"', 4, "retention.series[0].pattern", "expected {step} at most once"),
    ('pattern = "runs/**/x"', 4, "retention.series[0].pattern", "'**' is not supported"),
    ('pattern = "runs/{epoch}"', 4, "retention.series[0].pattern", "expected only {step}"),
    ('pattern = "a/*"\nkeep_last = -1', 5, "retention.series[0].keep_last", "expected an integer in [0"),
    ('pattern = "a/*"\nmin_age = "2d"\nexpire_after = "1d"', 6, "retention.series[0].expire_after",
     "expected at least min_age (2d), got 1d"),
    ('pattern = "a/*"\nexpire_after = "10d"\ntransitions = [{after = "20d", storage_class = "GLACIER"}]', 6,
     "retention.series[0].transitions[0].after", "expected less than expire_after (10d)"),
    ('pattern = "a/*"\nstale_tmp_after = "soon"', 5, "retention.series[0].stale_tmp_after", "expected a duration"),
])
def test_bad_series_rules_are_refused_with_key_and_line(tmp_path, body, line, key, expected):
    text = '\n[[retention.series]]\nname = "s"\n' + body + "\n"
    e = error_of(tmp_path, text)
    assert e.key == key and expected in e.expected
    assert e.where.endswith(f":{line}"), e.where


def test_bad_series_name_and_pin_lock(tmp_path):
    e = error_of(tmp_path, '[[retention.series]]\nname = "my series!"\npattern = "a/*"\n')
    assert e.key == "retention.series[0].name" and e.where.endswith(":2") and "S3 tag value" in e.expected
    e = error_of(tmp_path, '[retention]\npin_lock = "compliance"\n')
    assert e.key == "retention.pin_lock_days" and "at least 1 day" in e.expected
    e = error_of(tmp_path, '[retention]\npin_lock = "forever"\n')
    assert e.key == "retention.pin_lock" and e.where.endswith(":2")
    e = error_of(tmp_path, '[retention]\nschedule = "5s"\n')
    assert e.key == "retention.schedule" and "at least 1m" in e.expected
