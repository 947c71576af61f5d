"""The paper's numbers at 128M (arXiv 2601.11471 v3), keyed by role, for the report's tables."""

from __future__ import annotations

from dataclasses import dataclass


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
