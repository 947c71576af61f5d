"""Statistics over seeds: the pure numbers behind every ± and every ordering a report prints.

    summary      mean x̄ = Σ x_i / n,  sample standard deviation s = √(Σ (x_i − x̄)² / (n − 1))
    paired       d_i = a_i − b_i for the runs a and b of the same seed i (same data order, same
                 initial draw of the random generator), d̄ and s_d as above
    interval     d̄ ± t_{1−α/2, n−1} · s_d / √n   (Student's t, α = 1 − confidence)

The rule a report states and follows has a practical margin δ > 0 per metric (in its unit,
`headlab.study.claims.MARGINS`) besides the interval, so that a difference too small to matter is
never stated as an ordering, however narrow its interval, and a verdict does not turn on the
last digits a machine's kernels change:

    within δ     the whole interval lies inside (−δ, +δ)          "within ±δ of b" (equivalence)
    higher/lower the interval excludes zero and |d̄| > δ           "a higher (lower) than b by d̄ ± h"
    undecided    otherwise                                         neither shown at this many seeds

With one seed there is no interval (s_d needs n ≥ 2): undecided, and no ordering is claimed.

    chance       n · (1 − c) orderings expected by chance among n comparisons of variants that
                 truly do not differ (no correction for the number of comparisons is made, so a
                 report states this count beside its orderings)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # Student's t quantile; scipy.stats would add 0.5 s to every start

CONFIDENCE = 0.95
WITHIN, HIGHER, LOWER, UNDECIDED = "within", "higher", "lower", "undecided"  # the verdicts of `Difference.verdict`


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation of the n defined values among n + undefined (sd is NaN
    for n = 1; both are NaN for n = 0)."""

    mean: float
    sd: float
    n: int
    undefined: int = 0  # values that were NaN (a layer without a circuit): left out, and counted

    def format(self, decimals: int) -> str:
        """'1.234 ± 0.012', '1.234' for a single value, with '(2 of 3; 1 undefined)' after it
        where some values were undefined, and 'undefined' where all were."""
        if self.n == 0:
            return f"undefined (all {self.undefined})"
        text = f"{self.mean:.{decimals}f}" if self.n < 2 else f"{self.mean:.{decimals}f} ± {self.sd:.{decimals}f}"
        return text + (f" ({self.n} of {self.n + self.undefined}; {self.undefined} undefined)" if self.undefined
                       else "")


def spread(values: Sequence[float]) -> Spread:
    """The `Spread` of `values`, over those that are defined: a NaN (an undefined number, such as
    the effective rank of a layer without a circuit) is left out and counted, never averaged in."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("spread of no values")
    defined = values[~np.isnan(values)]
    undefined = int(values.size - defined.size)
    if defined.size == 0:
        return Spread(math.nan, math.nan, 0, undefined)
    sd = float(defined.std(ddof=1)) if defined.size > 1 else math.nan
    return Spread(float(defined.mean()), sd, int(defined.size), undefined)


@dataclass(frozen=True)
class Difference:
    """The paired difference a − b over n seeds and the half-width of its t-interval."""

    mean: float
    half_width: float  # NaN for one seed
    n: int
    confidence: float

    @property
    def decided(self) -> bool:
        """Whether the interval d̄ ± half_width excludes zero (never with one seed)."""
        return self.n >= 2 and abs(self.mean) > self.half_width

    def verdict(self, margin: float) -> str:
        """WITHIN when d̄ ± half_width lies inside (−margin, +margin); HIGHER or LOWER (the sign of
        d̄) when the interval excludes zero and |d̄| > margin; UNDECIDED otherwise (always with one seed)."""
        if not margin > 0:
            raise ValueError(f"margin = {margin!r} is invalid: it must be positive")
        if self.n < 2:
            return UNDECIDED
        if abs(self.mean) + self.half_width < margin:
            return WITHIN
        if self.decided and abs(self.mean) > margin:
            return HIGHER if self.mean > 0 else LOWER
        return UNDECIDED

    def format(self, decimals: int) -> str:
        """'+0.031 ± 0.012', '+0.031' for a single seed, 'undefined' for none."""
        if self.n == 0:
            return "undefined"
        if self.n < 2:
            return f"{self.mean:+.{decimals}f}"
        return f"{self.mean:+.{decimals}f} ± {self.half_width:.{decimals}f}"


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Difference:
    """d_i = a_i − b_i (a and b listed in the same seed order): d̄ ± t_{(1+c)/2, n−1} s_d / √n."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired values must be two equally long lists, got {a.shape} and {b.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence!r} is invalid: it must lie in (0, 1)")
    d = a - b
    if d.size < 2:
        return Difference(float(d.mean()), math.nan, 1, confidence)
    half = float(stdtrit(d.size - 1, (1 + confidence) / 2) * d.std(ddof=1) / math.sqrt(d.size))
    return Difference(float(d.mean()), half, int(d.size), confidence)


def chance_orderings(n_comparisons: int, confidence: float = CONFIDENCE) -> float:
    """n (1 − c): how many of n comparisons would be stated as orderings if no variant truly
    differed, since each interval then excludes zero with probability 1 − c."""
    if n_comparisons < 0:
        raise ValueError(f"n_comparisons = {n_comparisons!r} is invalid: it must be ≥ 0")
    return n_comparisons * (1 - confidence)


def paired_to_baseline(table: pd.DataFrame, role: str, column: str, baseline: str = "mha") -> Difference:
    """The paired difference `role` − `baseline` of `column` in a table with one row per (role,
    seed): the one comparison every ordering in a report rests on. Only seeds both roles have
    are paired, and of those only the seeds where both values are defined (a NaN is a layer without a
    circuit: left out, so n counts the seeds compared); the caller filters the table to one setting
    (layer mean, kind, step, ...) first."""
    ours = table[table["role"] == role].set_index("seed")[column]
    base = table[table["role"] == baseline].set_index("seed")[column]
    if ours.index.has_duplicates or base.index.has_duplicates:
        raise ValueError(f"paired_to_baseline needs one row per role and seed; {role!r} or {baseline!r} has several")
    seeds = ours.index.intersection(base.index).sort_values()
    if seeds.empty:
        raise ValueError(f"no seed has both {role!r} and {baseline!r} in column {column!r}")
    defined = [seed for seed in seeds if not (math.isnan(ours[seed]) or math.isnan(base[seed]))]
    if not defined:  # undefined in every seed (no circuit): nothing to pair, no ordering
        return Difference(math.nan, math.nan, 0, CONFIDENCE)
    return paired_difference(ours[defined].to_numpy(), base[defined].to_numpy())
