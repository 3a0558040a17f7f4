"""The CLI's progress bar (flush --wait, warmup, verify): on a terminal, the bar with the bytes
done of the total, the rate over the last seconds and the time left at that rate, in the one
duration style of human output (units.fmt_seconds): "1.2 GiB of 2.7 GiB, 150.0 MiB/s, 10s left".
click's own ETA ("00:00:10") is off, so no second duration style shows up on the terminal."""
from __future__ import annotations

import sys
import time
from collections import deque

import click

from .units import fmt_bytes, fmt_rate, fmt_seconds

RATE_WINDOW = 5.0            # seconds: the rate shown follows changes, yet does not jump per message


class Rate:
    """Bytes per second over the last RATE_WINDOW seconds of (time, done) samples."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, done: int) -> float | None:
        now = self.clock()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()
        (t0, d0) = self.samples[0]
        return max(0.0, (done - d0) / (now - t0)) if now > t0 else None


def bar_text(done: int, total: int, rate: float | None) -> str:
    text = f"{fmt_bytes(done)} of {fmt_bytes(total)}, {fmt_rate(rate) if rate is not None else '-/s'}"
    if rate and done < total:
        text += f", {fmt_seconds((total - done) / rate)} left"
    return text


class Bar:
    """A progress bar on stderr fed from progress messages; off unless stderr is a terminal."""

    def __init__(self, label: str, enabled: bool, clock=time.monotonic, file=None):
        self.file = file or sys.stderr
        self.label, self.enabled = label, enabled and (file is not None or self.file.isatty())
        self.bar = None
        self.shown = 0
        self.rate = Rate(clock)
        self.text = ""

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        done = max(0, done)         # flush: more may become pending than was at the start
        self.text = bar_text(done, total, self.rate.add(done))
        if self.bar is None:
            self.bar = click.progressbar(length=max(total, 1), label=self.label, file=self.file,
                                         show_percent=True, show_eta=False, item_show_func=lambda t: t)
            self.bar.__enter__()
        self.bar.length = max(total, 1)
        self.bar.update(max(0, done - self.shown), self.text)
        self.shown = max(self.shown, done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
