"""Summaries of repeated measurements: min/median/max over repetitions, percentiles of samples."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """min / median / max of one figure over n repetitions."""
    min: float
    median: float
    max: float
    n: int

    @classmethod
    def of(cls, values) -> "Spread | None":
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return None
        return cls(min(vals), statistics.median(vals), max(vals), len(vals))


def percentile(samples, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("percentile of no samples")
    k = (len(xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
