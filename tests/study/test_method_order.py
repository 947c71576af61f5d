"""Whether our methods' λ₁ are ordered as the seed figure's (`headlab.study.seed_distance.method_order`):
the Spearman correlation of the means over seeds, and the same correlation seed by seed, whose spread
says how much of an order is seed noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headlab.study.paper import SEED_SPECTRA
from headlab.study.seed_distance import method_order

ROLES = list(SEED_SPECTRA)


def frame(first_eigenvalues: dict[int, dict[str, float]], panel: str = "Early", state: str = "trained") -> pd.DataFrame:
    """A `seed_distance` frame: seed -> role -> our λ₁, beside the seed figure's λ₁ at `panel`."""
    return pd.DataFrame([{"role": role, "panel": panel, "state": state, "seed": seed, "first_eigenvalue": value,
                          "seed_first_eigenvalue": SEED_SPECTRA[role][panel].first}
                         for seed, values in first_eigenvalues.items() for role, value in values.items()])


def seed_order(panel: str, sign: float = 1.0) -> dict[str, float]:
    """λ₁ per role ranked as the seed figure's (sign −1: reversed), ties in the seed broken apart."""
    firsts = {role: SEED_SPECTRA[role][panel].first for role in ROLES}
    return {role: sign * value + 1e-3 * i for i, (role, value) in enumerate(firsts.items())}


def test_the_seed_figures_own_order_gives_one_and_its_reverse_minus_one():
    same = method_order(frame({0: seed_order("Middle")}, "Middle")).iloc[0]
    reverse = method_order(frame({0: seed_order("Middle", -1.0)}, "Middle")).iloc[0]
    assert same["spearman"] == pytest.approx(1.0, abs=0.05) and reverse["spearman"] == pytest.approx(-1.0, abs=0.05)
    assert same["n_methods"] == 6 and same["n_seeds"] == 1


def test_seeds_that_disagree_show_their_spread_and_the_means_order_is_of_the_means():
    rng = np.random.default_rng(0)
    seeds = {0: seed_order("Early"), 1: seed_order("Early", -1.0), 2: {r: float(v) for r, v in
                                                                       zip(ROLES, rng.normal(size=6))}}
    row = method_order(frame(seeds)).iloc[0]
    per_seed = [method_order(frame({s: seeds[s]})).iloc[0]["spearman"] for s in seeds]
    assert row["seed_mean"] == pytest.approx(np.mean(per_seed))
    assert row["seed_sd"] == pytest.approx(np.std(per_seed, ddof=1))
    assert (row["seed_min"], row["seed_max"]) == pytest.approx((min(per_seed), max(per_seed)))
    means = {r: np.mean([seeds[s][r] for s in seeds]) for r in ROLES}
    assert row["spearman"] == pytest.approx(method_order(frame({0: means})).iloc[0]["spearman"])
    assert row["n_seeds"] == 3


def test_one_row_per_state_and_panel_and_only_roles_present_count():
    rows = pd.concat([frame({0: seed_order(p)}, p, state) for p in ("Early", "Middle", "Late")
                      for state in ("trained", "init")])
    partial = rows[~((rows["panel"] == "Late") & rows["role"].isin(["mla", "gqa"]))]
    order = method_order(partial)
    assert sorted(zip(order["state"], order["panel"])) == sorted(
        (s, p) for s in ("trained", "init") for p in ("Early", "Middle", "Late"))
    assert set(order[order["panel"] == "Late"]["n_methods"]) == {4}
    assert order["spearman"].to_numpy() == pytest.approx(1.0, abs=0.05)


def test_fewer_than_three_methods_give_no_correlation():
    order = method_order(frame({0: dict(list(seed_order("Early").items())[:2])})).iloc[0]
    assert np.isnan(order["spearman"]) and np.isnan(order["seed_mean"])
