"""Progress bars show the bytes done of the total and the rate (issue 39, CLI)."""
from __future__ import annotations

import io
import re

from appliance.progress import Bar, Rate, bar_text


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_the_rate_is_over_the_last_seconds():
    clock = Clock()
    rate = Rate(clock)
    assert rate.add(0) is None
    for i in range(1, 11):                  # 1 MiB/s for 10 s
        clock.t += 1
        assert rate.add(i << 20) == 1 << 20
    for i in range(1, 6):                   # then 4 MiB/s: the window forgets the slow part
        clock.t += 1
        last = rate.add((10 << 20) + i * (4 << 20))
    assert last == 4 << 20


def test_bar_text_says_bytes_and_rate():
    assert bar_text(3 << 29, 5 << 30, 150 << 20) == "1.5 GiB of 5.0 GiB, 150.0 MiB/s, 23s left"
    assert bar_text(0, 1024, None) == "0 B of 1.0 KiB, -/s"
    assert bar_text(1024, 1024, 100.0) == "1.0 KiB of 1.0 KiB, 100 B/s"      # done: nothing left to say
    assert bar_text(0, 300 << 20, 1 << 20) == "0 B of 300.0 MiB, 1.0 MiB/s, 5m left"


def test_the_bar_on_a_terminal_shows_them():
    clock, out = Clock(), Tty()
    bar = Bar("flushing", True, clock=clock, file=out)
    bar.update(0, 100 << 20)
    clock.t += 2
    bar.update(40 << 20, 100 << 20)
    bar.close()
    text = out.getvalue()
    assert "flushing" in text and "40%" in text
    assert "40.0 MiB of 100.0 MiB, 20.0 MiB/s, 3s left" in text
    assert not re.search(r"\d\d:\d\d:\d\d", text)           # click's ETA, a second duration style


def test_no_bar_when_stderr_is_not_a_terminal_or_json(capsys):
    bar = Bar("verifying", False)
    bar.update(1, 2)
    bar.close()
    assert capsys.readouterr().err == ""
