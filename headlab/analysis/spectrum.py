"""Head-similarity spectra: from a layer's Gram (`headlab.analysis.gram`) to the cosine similarity,
its eigen-spectrum and effective rank, the paper's construction (arXiv 2601.11471 §4.3, Eqs. 11-12)
in pure numpy, float64.

    cosine          G[i,j] = G_raw[i,j] / √(G_raw[i,i] G_raw[j,j])                  (unit diagonal)
    centered         G_c = J G J,  J = I − 11ᵀ/H                                              (Eq. 12)
    spectrum        λ_1 ≥ … ≥ λ_H ≥ 0, eigenvalues of G ("uncentered") or G_c ("centered")
    variance        v_i = λ_i / Σ_j λ_j,  cumulative c_k = Σ_{i≤k} v_i
    effective rank  exp(−Σ_i v_i log v_i)            (Roy & Vetterli 2007; the paper's metric)
    participation   (Σ λ_i)² / Σ λ_i²                 (a second, less tail-sensitive count)

Both ranks take the spectrum of the kind asked for. The paper reports the effective rank as a
percentage of H; the attainable maximum is H uncentered but H − 1 centered (J G J has rank ≤ H − 1;
the digest's caveat C8), so `Spectrum` reports both percentages.

Dead heads and layers without a circuit. A dead head (`headlab.analysis.gram.normalised_gram`)
has no direction, so its cosine with any head, itself included, is undefined and is NaN. The
layer's spectrum is that of its live heads (n_live eigenvalues, then NaN for the H − n_live that
do not exist); the percentages stay of H, so a dead head counts as a head that adds nothing. A
layer whose heads are all dead has no circuit: every eigenvalue and metric is NaN, never a number,
and means over layers leave it out. An all-zero spectrum of live heads (all heads identical,
centered) is defined: variance ratios 0, effective rank 0, participation ratio 0, 0 components:
there is no variation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headlab.schema import KINDS, check

# Eigenvalues of a cosine-similarity matrix are O(1) (they sum to at most H); round-off is
# ~1e-15·H. Anything within ATOL of zero is zero, anything below −ATOL is a real defect.
ATOL = 1e-9


def cosine_similarity(raw: np.ndarray, live: np.ndarray | None = None) -> np.ndarray:
    """G[i,j] = G_raw[i,j] / √(G_raw[i,i] G_raw[j,j]) of the live heads: unit diagonal, entries in
    [−1, 1]. A dead head (not in `live`; by default, one with G_raw[h,h] = 0; `normalised_gram`
    gives the documented rule) has no direction: its row and column are NaN, diagonal included.
    """
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[0] != raw.shape[1]:
        raise ValueError(f"raw Gram must be a square matrix; got shape {raw.shape}")
    norms = np.sqrt(np.clip(np.diag(raw), 0.0, None))  # ‖A_h‖_F
    live = norms > 0 if live is None else np.asarray(live, dtype=bool)
    inverse = np.divide(1.0, norms, out=np.full_like(norms, np.nan), where=live)
    similarity = raw * inverse[:, None] * inverse[None, :]
    np.fill_diagonal(similarity, np.where(live, 1.0, np.nan))
    return similarity


def double_center(similarity: np.ndarray) -> np.ndarray:
    """G_c = J G J with J = I − 11ᵀ/H, i.e. G[i,j] − rowmean_i − colmean_j + mean (Eq. 12):
    kernel PCA of the unit-normalised forms A_h/‖A_h‖_F after removing their mean."""
    g = np.asarray(similarity, dtype=np.float64)
    return g - g.mean(axis=1, keepdims=True) - g.mean(axis=0, keepdims=True) + g.mean()


def eigenspectrum(matrix: np.ndarray, atol: float = ATOL) -> np.ndarray:
    """Eigenvalues of a symmetric PSD similarity matrix, sorted descending.

    Values in [−atol, atol] are round-off and become exactly 0; a value below −atol means the
    input is not positive semi-definite (not a Gram matrix), which raises ValueError.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"expected a square matrix; got shape {m.shape}")
    if not np.allclose(m, m.T, rtol=0.0, atol=atol):
        raise ValueError("matrix is not symmetric, so it is not a similarity (Gram) matrix")
    values = np.linalg.eigvalsh((m + m.T) / 2)[::-1]
    if values[-1] < -atol:
        raise ValueError(f"matrix is not positive semi-definite: smallest eigenvalue {values[-1]:.3g} "
                         f"< -{atol:g}; it cannot be a Gram matrix of head forms")
    values[np.abs(values) <= atol] = 0.0
    return values


# In the functions below a spectrum may end in NaN: eigenvalues that do not exist (dead heads).
# They are left out; a spectrum with no eigenvalue at all (no live head) has NaN metrics.

def variance_ratios(eigenvalues: np.ndarray) -> np.ndarray:
    """v_i = λ_i / Σ_j λ_j over the eigenvalues that exist (NaN stays NaN); all zeros for an
    all-zero spectrum."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    total = np.nansum(lam)
    return lam / total if total > 0 else np.where(np.isnan(lam), np.nan, 0.0)


def n_components(eigenvalues: np.ndarray, threshold: float = 0.9) -> int | float:
    """Smallest k with cumulative variance c_k ≥ threshold (1e-12 slack for round-off, so ten
    equal eigenvalues need exactly 9 for 90 %); 0 for an all-zero spectrum, NaN for none."""
    v = _existing(variance_ratios(eigenvalues))
    if not v.size:
        return float("nan")
    if not v.any():
        return 0
    return int(np.argmax(np.cumsum(v) >= threshold - 1e-12)) + 1


def entropy_effective_rank(eigenvalues: np.ndarray) -> float:
    """exp(−Σ v_i log v_i) over the variance ratios of the given spectrum (Roy–Vetterli); 1 for a
    single nonzero eigenvalue, k for k equal ones, 0 for an all-zero spectrum, NaN for none."""
    v = _existing(variance_ratios(eigenvalues))
    if not v.size:
        return float("nan")
    v = v[v > 0]
    return float(np.exp(-(v * np.log(v)).sum())) if v.size else 0.0


def participation_ratio(eigenvalues: np.ndarray) -> float:
    """(Σ λ_i)² / Σ λ_i² of the given spectrum; 0 for an all-zero spectrum, NaN for none."""
    lam = _existing(np.asarray(eigenvalues, dtype=np.float64))
    if not lam.size:
        return float("nan")
    squares = (lam ** 2).sum()
    return float(lam.sum() ** 2 / squares) if squares > 0 else 0.0


def _existing(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def mean_offdiagonal(similarity: np.ndarray) -> float:
    """Mean of G[i,j] over i ≠ j, both heads live (NaN entries are dead heads'); NaN with fewer
    than two live heads."""
    g = np.asarray(similarity, dtype=np.float64)
    live = ~np.isnan(np.diag(g))
    block = g[np.ix_(live, live)]
    h = len(block)
    return float((block.sum() - np.trace(block)) / (h * (h - 1))) if h > 1 else float("nan")


@dataclass(frozen=True)
class Spectrum:
    """The eigen-spectrum of one layer's cosine similarity G, centered or not, and its metrics."""

    kind: str  # "uncentered" (eigenvalues of G) or "centered" (of J G J)
    eigenvalues: np.ndarray  # (H,), descending, ≥ 0; the live heads' n_live, then H − n_live NaN

    @property
    def n_heads(self) -> int:
        return self.eigenvalues.size

    @property
    def ceiling(self) -> int:
        """The largest attainable effective rank: H uncentered, H − 1 centered."""
        return self.n_heads - (self.kind == "centered")

    @property
    def variance_ratio(self) -> np.ndarray:
        return variance_ratios(self.eigenvalues)

    @property
    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.variance_ratio)

    @property
    def effective_rank(self) -> float:
        return entropy_effective_rank(self.eigenvalues)

    @property
    def effective_rank_pct_of_heads(self) -> float:
        """100 · ER / H: the paper's Table 3 convention."""
        return 100.0 * self.effective_rank / self.n_heads

    @property
    def effective_rank_pct_of_ceiling(self) -> float:
        """100 · ER / ceiling; 0 when the ceiling is 0 (one head, centered), NaN when ER is."""
        return 100.0 * self.effective_rank / self.ceiling if self.ceiling else 0.0

    @property
    def participation_ratio(self) -> float:
        return participation_ratio(self.eigenvalues)

    @property
    def n_components_90(self) -> int | float:
        return n_components(self.eigenvalues, 0.9)


def similarity_spectrum(similarity: np.ndarray, kind: str) -> Spectrum:
    """The `kind` spectrum of a cosine similarity matrix G: eigenvalues of G or of J G J, where G
    is the block of the live heads (a dead head's row is NaN, `cosine_similarity`), padded with
    NaN to H: J centres the live heads' forms only, as a dead head has none to centre."""
    check("kind", kind, KINDS)
    g = np.asarray(similarity, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"expected a square matrix; got shape {g.shape}")
    live = ~np.isnan(np.diag(g))
    block = g[np.ix_(live, live)]
    values = eigenspectrum(double_center(block) if kind == "centered" else block) if live.any() else np.zeros(0)
    return Spectrum(kind, np.concatenate([values, np.full(g.shape[0] - values.size, np.nan)]))


def clipped_spectrum(similarity: np.ndarray, kind: str) -> tuple[Spectrum, float]:
    """The `kind` spectrum of a symmetric similarity that may not be PSD, with its negative
    eigenvalues clipped to 0, and the clipped share Σ|λ₋| / Σ|λ| (0 when nothing was clipped)."""
    check("kind", kind, KINDS)
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or not np.allclose(s, s.T, atol=1e-9):
        raise ValueError(f"similarity must be a symmetric square matrix; got shape {s.shape}")
    matrix = double_center(s) if kind == "centered" else s
    values = np.linalg.eigvalsh((matrix + matrix.T) / 2)[::-1]
    total = np.abs(values).sum()
    negative = float(-values[values < 0].sum() / total) if total > 0 else 0.0
    return Spectrum(kind, np.clip(values, 0.0, None)), negative
