"""The paper's numbers at 128M (arXiv 2601.11471 v3), keyed by role, for the report's tables and figures:
Tables 1, 3, 7 and 8 (`PAPER`) and the seed figure, Fig. 11 (`SEED_SPECTRA`), whose early, middle
and late panels a study's layers are matched to (`layer_roles`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class PaperNumbers:
    """One variant's numbers at 128M in arXiv 2601.11471 v3."""

    label: str
    uncentered: float  # Table 3, effective rank % of H (GQA's was estimated by the authors)
    centered: float
    kv_cache_pct: float  # Tables 7 and 8, % of MHA (MLA: the latent d_c alone)
    loss: float  # Table 8, test cross-entropy per GPT-2 token on FineWeb-Edu


PAPER = {  # keyed by role (`headlab.study.roles.ROLES`), never by position
    "mha": PaperNumbers("Standard MHA", 95.4, 82.4, 100.0, 2.903),
    "lrkv-small": PaperNumbers("LRKV (r=16)", 88.8, 81.5, 29.2, 2.905),
    "lrkv-large": PaperNumbers("LRKV (r=64)", 96.2, 83.0, 66.7, 2.888),
    "mqa": PaperNumbers("MQA", 72.6, 78.4, 16.7, 2.929),
    "mla": PaperNumbers("MLA (d_c=128)", 83.9, 78.5, 8.3, 2.901),
    "gqa": PaperNumbers("GQA (3 groups)", 90.5, 79.6, 50.0, 2.918),
}


# The seed figure: the paper's Fig. 11 at 128M (uncentered eigenvalue spectra of the 6 x 6 head
# similarity matrices; ../shared/seed/figure-eigenvalue-spectra-128M.md), read off the figure by eye,
# so every value is approximate (about ±0.1). Its panels are layers 0, 6 and 11 of 12; ours are a
# study's early, middle and late layers (`layer_roles`), matched by relative depth.
PAPER_PANELS = {"Early": 0, "Middle": 6, "Late": 11}  # our panel -> the paper's layer L
SEED_HEADS = 6  # H of the paper's 128M models: each curve has this many eigenvalues


@dataclass(frozen=True)
class SeedSpectrum:
    """One curve of the seed figure, as described: λ₁, λ₂ and λ₆ (where the description gives the
    tail as a range, its midpoint); the description gives no λ₃…λ₅, which `eigenvalues` fills in
    linearly between λ₂ and λ₆ (every curve is described as declining or flat there)."""

    first: float
    second: float
    last: float

    def eigenvalues(self, n: int = SEED_HEADS) -> tuple[float, ...]:
        """λ₁ … λₙ: λ₁, then λ₂ … λₙ evenly from `second` to `last`."""
        tail = [self.second * (1 - t) + self.last * t for t in (k / (n - 2) for k in range(n - 1))]
        return (self.first, *tail)


SEED_SPECTRA = {  # role -> our panel -> the curve; the paper's LRKV ranks are 16 and 64 at d_h = 128
    "mha": {"Early": SeedSpectrum(5.0, 0.8, 0.2), "Middle": SeedSpectrum(2.5, 1.0, 0.8),
            "Late": SeedSpectrum(3.0, 1.0, 0.5)},
    "lrkv-small": {"Early": SeedSpectrum(4.5, 0.3, 0.1), "Middle": SeedSpectrum(1.8, 0.9, 0.75),
                   "Late": SeedSpectrum(2.8, 0.9, 0.75)},
    "lrkv-large": {"Early": SeedSpectrum(3.8, 0.5, 0.35), "Middle": SeedSpectrum(1.2, 0.9, 0.85),
                   "Late": SeedSpectrum(1.3, 0.9, 0.85)},
    "mqa": {"Early": SeedSpectrum(4.0, 0.4, 0.1), "Middle": SeedSpectrum(2.0, 0.7, 0.5),
            "Late": SeedSpectrum(3.5, 0.6, 0.4)},
    "mla": {"Early": SeedSpectrum(2.5, 0.6, 0.35), "Middle": SeedSpectrum(2.2, 0.8, 0.65),
            "Late": SeedSpectrum(2.8, 0.7, 0.55)},
    "gqa": {"Early": SeedSpectrum(3.0, 0.7, 0.45), "Middle": SeedSpectrum(1.5, 0.9, 0.75),
            "Late": SeedSpectrum(2.0, 0.8, 0.65)},
}


def layer_roles(layers: Iterable[int]) -> dict[str, int]:
    """The early, middle and late layer among `layers` (numbered from 0): the first, the one at
    index len // 2 and the last; for 12 layers 0, 6 and 11, the paper's 128M choice. A role is
    given only to a layer no earlier role has: two layers are Early and Late, one is Early."""
    available = sorted({int(layer) for layer in layers})
    if not available:
        raise ValueError("no layers to choose from")
    roles = {"Early": available[0], "Late": available[-1], "Middle": available[len(available) // 2]}
    distinct = {}
    for role, layer in roles.items():
        if layer not in distinct.values():
            distinct[role] = layer
    return {role: distinct[role] for role in ("Early", "Middle", "Late") if role in distinct}
