"""Setting a model of H heads beside the seed figure's six (`headlab.study.seed_distance`): the
resampled spectrum keeps the total and the top shares, and the implied cosine is exact for heads
that share one direction equally, whatever H."""

from __future__ import annotations

import numpy as np
import pytest

from headlab.study.seed_distance import at_seed_heads, implied_cosine, resampled


def equicorrelated(n_heads: int, rho: float) -> np.ndarray:
    """The eigenvalues of the H × H cosine matrix with every off-diagonal entry ρ, descending."""
    return np.linalg.eigvalsh((1 - rho) * np.eye(n_heads) + rho)[::-1]


@pytest.mark.parametrize("n_heads", [4, 6, 9, 12])
def test_the_implied_cosine_of_one_shared_direction_is_free_of_the_head_count(n_heads):
    for rho in (0.0, 0.3, 1.0):
        first = equicorrelated(n_heads, rho)[0]
        assert implied_cosine(first, n_heads) == pytest.approx(rho, abs=1e-12)
        assert at_seed_heads(first, n_heads) == pytest.approx(equicorrelated(6, rho)[0], abs=1e-12)


def test_resampling_keeps_six_heads_and_the_shares_of_top_fractions():
    six = np.array([2.5, 1.2, 0.9, 0.6, 0.5, 0.3])
    np.testing.assert_allclose(resampled(six), six * 6 / six.sum())  # six heads: only scaled to sum 6
    twelve = np.repeat(six, 2) / 2  # each of six directions split over two heads, sum 6 as before
    np.testing.assert_allclose(resampled(twelve), resampled(six))
    four = np.array([2.0, 1.0, 0.6, 0.4])
    out = resampled(four)
    assert out.sum() == pytest.approx(6.0) and np.all(np.diff(out) <= 1e-12)
    # the top half of the heads holds the same share before and after: (2.0 + 1.0) / 4
    assert out[:3].sum() / 6 == pytest.approx((2.0 + 1.0) / four.sum())
    assert out[0] == pytest.approx(2.0 * 4 / four.sum())  # slot 1 of 6 lies inside eigenvalue 1's slot of 4: its height
