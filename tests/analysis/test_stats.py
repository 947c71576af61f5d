"""The statistics behind every ± and every ordering: checked against scipy's paired t-test and
against simulated seed noise, so a wrong quantile or a wrong degree of freedom goes red."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from headlab.study.stats import (
    HIGHER,
    LOWER,
    UNDECIDED,
    WITHIN,
    Difference,
    chance_orderings,
    paired_difference,
    spread,
)


def test_an_ordering_is_decided_exactly_when_the_paired_t_test_rejects():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5):
        for _ in range(200):
            a, b = rng.normal(size=n), rng.normal(size=n) + rng.uniform(-1, 1)
            d = paired_difference(a, b)
            assert d.decided == (scipy_stats.ttest_rel(a, b).pvalue < 0.05)
            assert d.mean == pytest.approx(float(np.mean(a - b)))


def test_the_half_width_is_the_t_quantile_times_the_standard_error():
    d = paired_difference([1.0, 2.0, 4.0], [0.0, 0.0, 0.0], confidence=0.9)
    assert d.half_width == pytest.approx(scipy_stats.t.ppf(0.95, 2) * np.std([1, 2, 4], ddof=1) / math.sqrt(3))
    assert d.format(2) == f"+2.33 ± {d.half_width:.2f}"


def test_one_seed_has_no_interval_and_decides_nothing():
    d = paired_difference([5.0], [1.0])
    assert math.isnan(d.half_width) and not d.decided and d.format(1) == "+4.0"
    assert spread([2.0]).format(1) == "2.0" and spread([1.0, 3.0]).format(2) == f"2.00 ± {math.sqrt(2):.2f}"


def test_chance_orderings_match_the_rate_of_orderings_between_equal_variants():
    """Variants that truly do not differ, 3 seeds each, 4000 comparisons: the share stated as an
    ordering is the chance rate the reports quote (within 4 binomial standard errors)."""
    rng = np.random.default_rng(1)
    n = 4000
    decided = sum(paired_difference(rng.normal(size=3), rng.normal(size=3)).decided for _ in range(n))
    expected = chance_orderings(n)
    assert expected == pytest.approx(200.0)
    assert abs(decided - expected) < 4 * math.sqrt(n * 0.05 * 0.95), decided


@pytest.mark.parametrize("a, b, match", [([1.0, 2.0], [1.0], "equally long"), ([], [], "equally long"),
                                         ([[1.0]], [[1.0]], "equally long")])
def test_unpaired_values_are_refused(a, b, match):
    with pytest.raises(ValueError, match=match):
        paired_difference(a, b)


def test_bad_confidence_and_counts_are_refused():
    with pytest.raises(ValueError, match=r"confidence = 1\.0 is invalid"):
        paired_difference([1.0, 2.0], [0.0, 0.0], confidence=1.0)
    with pytest.raises(ValueError, match="n_comparisons = -1 is invalid"):
        chance_orderings(-1)


# The three-way rule: an interval d̄ ± h against a margin δ = 1.
@pytest.mark.parametrize("mean, half_width, verdict", [
    (0.2, 0.5, WITHIN),      # the whole interval inside ±δ: equivalence
    (-0.4, 0.5, WITHIN),
    (2.0, 0.5, HIGHER),      # excludes zero and |d̄| > δ: an ordering
    (-1.5, 1.2, LOWER),
    (0.19, 0.12, WITHIN),    # significance without substance (issue 38's 0.19 ± 0.12 points) is no ordering
    (0.8, 0.5, UNDECIDED),   # excludes zero but |d̄| ≤ δ, and reaches past δ: neither shown
    (0.5, 1.0, UNDECIDED),   # includes zero and reaches past δ
    (1.5, 2.0, UNDECIDED),   # |d̄| > δ but the interval includes zero
])
def test_a_verdict_needs_the_whole_interval_inside_the_margin_or_an_effect_beyond_it(mean, half_width, verdict):
    assert Difference(mean, half_width, 3, 0.95).verdict(1.0) == verdict


def test_one_seed_is_undecided_and_a_margin_must_be_positive():
    assert paired_difference([5.0], [1.0]).verdict(0.1) == UNDECIDED
    with pytest.raises(ValueError, match="margin"):
        paired_difference([1.0, 2.0], [0.0, 0.0]).verdict(0.0)
