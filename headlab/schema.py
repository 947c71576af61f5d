"""The vocabulary of the tidy tables, spelled once: column names, the values of their categorical
columns, and the roles and families that order and identify the variants. Standard library only,
so every layer (the report, which never loads torch, among them) reads the same names.

    kind       uncentered (the Gram of head forms as is) or centered (double-centred, PCA-based)
    circuit    qk (W_Q W_Kᵀ), ov (W_V W_O), or pattern (attention maps, the behaviour view)
    measure    frobenius (plain inner product of head forms), data (weighted by the second
               moments of each layer's inputs) or jensen_shannon (1 − JS distance of attention maps)
    mla_rope   included / excluded: whether MLA's decoupled RoPE parts enter A_h; n/a for a
               measure the choice does not touch (attention maps)
    role       what a variant stands for in the comparison (mha, lrkv-small, ...), in figure order

A variant's identity (its run folder's name, its place and colour in a figure) comes from its
role or its config's fields, never from its display label, so renaming a label keeps every
finished run and every colour."""

KINDS = ("uncentered", "centered")
CIRCUITS = ("qk", "ov")
ALL_CIRCUITS = "both"  # `analyze(circuit=...)`: every one of CIRCUITS
PATTERN = "pattern"  # the circuit of attention-map similarity
MEASURES = ("frobenius", "data")  # inner products of head forms: plain, or weighted by input moments
ALL_MEASURES = "both"  # `headlab analyze --measure`: every one of MEASURES
BEHAVIOUR = "jensen_shannon"  # the measure of attention-map similarity
MLA_ROPE = ("included", "excluded")
NOT_APPLICABLE = "n/a"  # the mla_rope of attention-map similarity: maps involve no such choice
FLAGSHIP_MLA_ROPE = "included"  # the setting of the study's figures and claims
VIEWS = {"frobenius": "weights", "data": "data-aware weights", BEHAVIOUR: "behaviour (attention maps)"}

ROLES = ("mha", "lrkv-small", "lrkv-large", "mqa", "mla", "gqa")  # the flagship figure's order
FAMILIES = ("mha", "lrkv", "mqa", "mla", "gqa")  # attention families in the paper's figure order

# The tables of an analysis (`headlab.analysis.similarity.Analysis`), by name.
COLUMNS = {
    "similarity": ["model", "layer", "circuit", "measure", "mla_rope", "head_i", "head_j", "value"],
    "spectra": ["model", "layer", "circuit", "measure", "mla_rope", "kind", "index", "eigenvalue", "variance_ratio",
                "cumulative"],
    "summary": ["model", "layer", "circuit", "measure", "mla_rope", "kind", "n_heads", "effective_rank",
                "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling", "n_components_90",
                "participation_ratio", "mean_offdiag_similarity"],
    "norms": ["model", "layer", "circuit", "mla_rope", "part", "frobenius_norm"],
    "lrkv_cosine": ["model", "layer", "circuit", "mla_rope", "head", "cosine"],
}
SPECTRUM_METRICS = ("effective_rank", "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling",
                    "n_components_90", "participation_ratio")  # summary columns read off a Spectrum
# The summary of the three views (`headlab.analysis.measures.measure_views`).
VIEWS_SUMMARY = ["model", "layer", "circuit", "measure", "mla_rope", "kind", "n_heads", "effective_rank",
                 "effective_rank_pct_of_heads", "negative_mass", "mean_offdiag_similarity"]


def check(name: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else a ValueError naming them."""
    if value not in allowed:
        raise ValueError(f"{name} = {value!r} is invalid: allowed values are {', '.join(allowed)}")
    return value


def role_order(roles, models) -> list[str]:
    """The distinct `models` (a table's model column) in the order of their `roles` (the same
    rows' role column) in ROLES; a model whose role is not one of ROLES (or has none) comes after
    them, in the order first seen."""
    first = {}
    for position, (role, model) in enumerate(zip(roles, models)):
        rank = ROLES.index(role) if role in ROLES else len(ROLES)
        first.setdefault(model, (rank, position))
    return sorted(first, key=first.__getitem__)
