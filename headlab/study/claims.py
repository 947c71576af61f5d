"""The sentences a report states, generated from a study's tables by one rule (`headlab.study.stats`):
a variant's runs are paired with Standard MHA's run of the same seed, and the 95% t-interval of
the per-seed differences is set against the metric's practical margin δ (`MARGINS`): "within
±δ" when the whole interval lies inside it, an ordering (difference ± half-width) only when the
interval excludes zero and the difference exceeds δ, "undecided" otherwise. With one seed no
ordering is claimed.

    metrics = per_seed_metrics(tables["summary"], tables["training"])
    claims(metrics)                                   # the comparison with Standard MHA
    measure_claims(per_seed_ranks(tables["measures"]))      # do the other views agree?
    training_claims(per_step_metrics(tables["snapshot_summary"]))   # through training
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headlab.schema import BEHAVIOUR, FLAGSHIP_MLA_ROPE, KINDS, ROLES, VIEWS
from headlab.study.paper import PAPER
from headlab.study.stats import (
    HIGHER,
    LOWER,
    WITHIN,
    Difference,
    chance_orderings,
    paired_difference,
    paired_to_baseline,
)

METRICS = {  # per-seed column -> (what it is, unit (None: the metrics' loss_unit), decimals)
    "val_loss": ("validation loss", None, 3),
    "uncentered": ("uncentered effective rank", "points of % of H", 2),
    "centered": ("centered effective rank", "points of % of H", 2),
}

# The practical margin δ of each metric: the loss's per byte (`margins` converts it for a study
# whose loss is per token), the ranks' in points of % of H. A rerun of the demo on another machine
# moved a seed's final loss by 0.006 nats/byte (1.6284 → 1.6228: other CPU kernels, other bits) and
# rank gaps by tenths of a point; with 3 seeds (t = 4.3) that moves an interval's ends by up to
# ~0.02 nats/byte and ~0.7 points, so each δ stands well clear of it, and below the gaps worth stating.
MARGINS = {"val_loss": 0.05, "uncentered": 3.0, "centered": 3.0}
BYTE_LOSS_UNIT = "nats/byte"  # the loss of a byte-level study (`table_files.loss_unit`): the margin's own unit
MARGIN_REASONS = (
    "δ = 0.05 nats/byte for the validation loss (0.07 bits/byte, 3% of the demo's loss; a change of training "
    "recipe, AdamW for Muon, moves it by 0.13), and δ = 3 points of % of H for either effective rank (below every "
    "uncentered gap the paper reports but LRKV at r=64's, 4.9 to 22.8 points; its centered gaps, 0.6 to 4.0, "
    "mostly lie inside it). Both stand well clear of what a rerun on another machine moves: a seed's loss by up "
    "to 0.006 nats/byte and a rank gap by tenths of a point, the ends of a 3-seed interval by about 0.02 nats/byte "
    "and 0.7 points.")


def margins(metrics: pd.DataFrame) -> dict[str, float]:
    """`MARGINS` in the units of `metrics` (what `per_seed_metrics` returns): the loss margin, per
    byte, times the runs' bytes per token, val_loss / (val_bpb · ln 2) as the trainer relates them
    (1 for a study whose loss is per byte)."""
    if (metrics["loss_unit"] == BYTE_LOSS_UNIT).all():
        return dict(MARGINS)
    bytes_per_token = float((metrics["val_loss"] / (metrics["val_bpb"] * math.log(2))).median())
    return {**MARGINS, "val_loss": MARGINS["val_loss"] * bytes_per_token}


def margins_text(metrics: pd.DataFrame) -> str:
    """The rule and its margins in one sentence, as the headline states them beside its verdicts."""
    deltas = margins(metrics)
    return (f"Verdicts against Standard MHA (within ±δ when the whole 95% interval of the paired differences lies "
            f"inside ±δ; an ordering only when it excludes zero and the difference exceeds δ; undecided otherwise), "
            f"with δ = {deltas['val_loss']:.3g} {metrics['loss_unit'].iloc[0]} for the validation loss and "
            f"{deltas['uncentered']:g} points of % of H for either effective rank (report.md says why):")


# ---- per-seed metrics -------------------------------------------------------------------------

def final_losses(training: pd.DataFrame) -> pd.DataFrame:
    """The last validation record of every (model, seed) run in a training table."""
    return training.sort_values("step").groupby(["model", "seed"]).tail(1)


def per_seed_metrics(summary: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """One row per (role, model, mla_rope, seed): final validation loss (in its loss_unit, and in
    bits per byte; NaN for a run with no validation record in `training`) and the QK effective
    rank (% of H) averaged over layers, per kind."""
    qk = summary[summary["circuit"] == "qk"]
    ranks = (qk.pivot_table(index=["role", "model", "mla_rope", "seed"], columns="kind",
                            values="effective_rank_pct_of_heads", aggfunc="mean").reset_index())
    losses = final_losses(training)[["role", "seed", "val_loss", "val_bpb", "loss_unit"]]
    return ranks.merge(losses, on=["role", "seed"], how="left", validate="many_to_one")[
        ["role", "model", "mla_rope", "seed", "val_loss", "val_bpb", "loss_unit", *KINDS]]


def variant_rows(metrics: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(role, model, mla_rope) of the rows the tables and claims show: every variant at the
    flagship setting in the roles' order, then MLA at each other setting."""
    flagship = metrics[metrics["mla_rope"] == FLAGSHIP_MLA_ROPE]
    rows = sorted(set(zip(flagship["role"], flagship["model"], flagship["mla_rope"])), key=lambda r: ROLES.index(r[0]))
    others = metrics[(metrics["role"] == "mla") & (metrics["mla_rope"] != FLAGSHIP_MLA_ROPE)]
    return rows + sorted(set(zip(others["role"], others["model"], others["mla_rope"])))


def variant_name(role: str, model: str, mla_rope: str) -> str:
    """A variant's name in tables and prose; MLA's says what enters A_h."""
    if role != "mla":
        return model
    return f"{model}, RoPE part {mla_rope}" + (" (the paper's definition)" if mla_rope == "excluded" else "")


def setting(metrics: pd.DataFrame, mla_rope: str) -> pd.DataFrame:
    """The rows of one `mla_rope` setting (every family but MLA has the same numbers at both)."""
    return metrics[metrics["mla_rope"] == mla_rope]


def values(metrics: pd.DataFrame, role: str, mla_rope: str, column: str) -> pd.Series:
    """A metric of one variant by seed."""
    rows = metrics[(metrics["role"] == role) & (metrics["mla_rope"] == mla_rope)]
    return rows.set_index("seed")[column].sort_index()


def difference_to_mha(metrics: pd.DataFrame, role: str, mla_rope: str, column: str) -> Difference:
    """Paired per-seed difference variant − Standard MHA of one metric at one `mla_rope` setting."""
    return paired_to_baseline(setting(metrics, mla_rope), role, column)


# ---- has it settled? ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Halfway:
    """The per-seed metrics of the same runs half-way through training: effective ranks at the
    snapshot step nearest half the steps (`rank_step`), the validation loss at the validation step
    nearest it (`loss_step`)."""

    metrics: pd.DataFrame
    rank_step: int
    loss_step: int | None  # None: no validation record before the last step


def halfway(snapshot_summary: pd.DataFrame, training: pd.DataFrame) -> Halfway | None:
    """`Halfway` of a study's snapshot and training tables; None when its runs kept no snapshot
    before their last step (nothing to compare with)."""
    last = int(training["step"].max())
    steps = sorted(set.intersection(*snapshot_summary.groupby(["model", "seed"])["step"].apply(set))) \
        if len(snapshot_summary) else []
    earlier = [s for s in steps if s < last]
    if not earlier:
        return None
    rank_step = min(earlier, key=lambda s: (abs(s - last / 2), s))
    loss_step = min((s for s in set(training["step"]) if s < last), key=lambda s: (abs(s - last / 2), s), default=None)
    summary = snapshot_summary[snapshot_summary["step"] == rank_step].drop(columns="step")
    losses = training[training["step"] <= (-1 if loss_step is None else loss_step)]
    return Halfway(per_seed_metrics(summary, losses), rank_step, loss_step)


def change_since(end: pd.DataFrame, half: pd.DataFrame, role: str, mla_rope: str, column: str,
                 baseline: str | None = "mha", minus: str | None = None) -> Difference | None:
    """The per-seed change, from half-way to the end, of a claim's per-seed difference d_i: role −
    `baseline` of `column`, or (baseline None) `column` − `minus` of the role itself (centering's
    rise). Its t-interval is the rule's: excluding zero, the claim is still moving. None when no
    seed has the value half-way (e.g. no validation record before the last step)."""
    def per_seed(metrics: pd.DataFrame) -> pd.Series:
        ours = values(metrics, role, mla_rope, column)
        other = values(metrics, baseline, mla_rope, column) if baseline else values(metrics, role, mla_rope, minus)
        return ours - other

    at_end, at_half = per_seed(end), per_seed(half)
    seeds = at_end.dropna().index.intersection(at_half.dropna().index).sort_values()
    if seeds.empty:
        return None
    return paired_difference(at_end[seeds].to_numpy(), at_half[seeds].to_numpy())


def settling(change: Difference | None, since: int | None, decimals: int, margin: float) -> str | None:
    """A claim's mark: 'still moving' when its change since step `since` is an ordering by the rule
    with the claim's `margin`, else the change alone, with no verdict: with a few seeds the change's
    interval is as wide as the margin, so 'settled' against 'undecided' turned on machine noise (a
    rerun elsewhere flipped it) while 'still moving' does not; None (no mark) without a half-way value."""
    if change is None:
        return None
    if change.verdict(margin) in (HIGHER, LOWER):
        return f"still moving: changed by {change.format(decimals)} since step {since}"
    return f"changed by {change.format(decimals)} since step {since}"


# ---- the comparison with Standard MHA ---------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One statement of the comparison by the rule: what it compares (`metric` of `role` against
    Standard MHA, or centered against uncentered of `role` itself for metric "centering"), the
    paired difference d̄ ± half_width over `seeds` seeds, the margin and the verdict, the mark of its
    change since half-way (empty without one), and the sentence the report prints."""

    role: str
    model: str
    mla_rope: str
    metric: str
    difference: float
    half_width: float
    seeds: int
    margin: float
    verdict: str
    change: str
    sentence: str


def claims(metrics: pd.DataFrame, half: Halfway | None = None) -> list[str]:
    """The sentences of `comparison_claims`; with one seed, the single sentence "One seed: no
    orderings claimed."."""
    if metrics["seed"].nunique() < 2:
        return ["One seed: no orderings claimed."]
    return [claim.sentence for claim in comparison_claims(metrics, half)]


def comparison_claims(metrics: pd.DataFrame, half: Halfway | None = None) -> list[Claim]:
    """One claim per variant and metric against Standard MHA by the rule with the metric's margin
    (`margins`): within ±δ, higher or lower by d̄ ± h, or undecided; and one on what centering does
    to each variant's rank, by the same rule. With `half` (the same runs half-way through
    training), each carries its change since then, marked still moving where that is an ordering
    (`settling`)."""
    found, deltas = [], margins(metrics)
    for column, (what, unit, decimals) in METRICS.items():
        unit = unit or metrics["loss_unit"].iloc[0]
        for role, model, mla_rope in variant_rows(metrics):
            if role == "mha" or (column == "val_loss" and mla_rope != FLAGSHIP_MLA_ROPE):
                continue
            mark = half and settling(change_since(metrics, half.metrics, role, mla_rope, column),
                                     half.loss_step if column == "val_loss" else half.rank_step, decimals,
                                     deltas[column])
            d = difference_to_mha(metrics, role, mla_rope, column)
            found.append(Claim(role, model, mla_rope, column, d.mean, d.half_width, d.n, deltas[column],
                               d.verdict(deltas[column]), mark or "",
                               sentence(f"{variant_name(role, model, mla_rope)}: {what}", d, deltas[column],
                                        ("higher than Standard MHA", "lower than Standard MHA",
                                         "equal to Standard MHA's", "undecided against Standard MHA"),
                                        unit, decimals, mark=mark)))
    for role, model, mla_rope in variant_rows(metrics):
        rise = paired_difference(values(metrics, role, mla_rope, "centered").to_numpy(),
                                 values(metrics, role, mla_rope, "uncentered").to_numpy())
        mark = half and settling(change_since(metrics, half.metrics, role, mla_rope, "centered", baseline=None,
                                              minus="uncentered"), half.rank_step, 2, deltas["centered"])
        paper = PAPER[role]
        found.append(Claim(role, model, mla_rope, "centering", rise.mean, rise.half_width, rise.n, deltas["centered"],
                           rise.verdict(deltas["centered"]), mark or "",
                           sentence(f"{variant_name(role, model, mla_rope)}: centering", rise, deltas["centered"],
                                    ("raises the effective rank", "lowers the effective rank",
                                     "leaves the effective rank unchanged", "undecided about the effective rank"),
                                    "points of % of H", 2,
                                    f"the paper: {paper.uncentered:.1f}% → {paper.centered:.1f}%", mark=mark)))
    return found


def sentence(subject: str, d: Difference, margin: float, verbs: tuple[str, str, str, str], unit: str, decimals: int,
             note: str = "", mark: str | None = None) -> str:
    """One claim by the rule with `margin` (`Difference.verdict`), `verbs` = (up, down, equal, undecided):
        ordering    '<subject> <up|down> by |d̄| ± h <unit> (<note>).'
        within      '<subject> <equal> within ±δ <unit> (d̄ ± h; <note>).'
        undecided   '<subject> <undecided> at ±δ <unit> (d̄ ± h; <note>).'
    a settling `mark` goes before the full stop as ' [<mark>]'."""
    up, down, equal, undecided = verbs
    tail = f" [{mark}]" if mark else ""
    verdict = d.verdict(margin)
    if verdict in (HIGHER, LOWER):
        note = f" ({note})" if note else ""
        return (f"{subject} {up if verdict == HIGHER else down} by {abs(d.mean):.{decimals}f} ± "
                f"{d.half_width:.{decimals}f} {unit}{note}{tail}.")
    status = f"{equal} within" if verdict == WITHIN else f"{undecided} at"
    return f"{subject} {status} ±{margin:g} {unit} ({d.format(decimals)}{'; ' + note if note else ''}){tail}."


def rule_text(n_seeds: int, n_comparisons: int) -> str:
    """The rule the comparison prose follows, as the report states it, with how many of its
    `n_comparisons` orderings chance alone would produce."""
    if n_seeds < 2:
        return ("With one seed there is no estimate of seed noise, so this report states no ordering between "
                "variants; train more seeds (`--seeds 3`) for comparisons.")
    return (f"Each comparison pairs a variant's run with Standard MHA's run of the same seed (same data order and "
            f"initial draw) and takes the {n_seeds} per-seed differences d_i, with their 95% t-interval d̄ ± "
            f"t(0.975, {n_seeds - 1}) · s_d / √{n_seeds}, against a practical margin δ per metric: {MARGIN_REASONS} "
            "The two are called within ±δ when the whole interval lies inside ±δ (an equivalence test); an ordering "
            "is stated, as difference ± half-width, only when the interval excludes zero and the difference exceeds "
            "δ; otherwise the comparison is undecided at this many seeds. No other ordering is claimed. "
            f"The {n_comparisons} comparisons below are each tested at 95% with no correction for their number: were "
            f"there no true difference behind any of them (a variant against Standard MHA, or centered against "
            f"uncentered), at most about {chance_orderings(n_comparisons):.1f} of them would still come out as "
            "orderings, so an ordering whose interval barely excludes zero is a lead to re-test with more seeds, not "
            "a finding. Each comparison is also made half-way through training (the snapshot nearest half the "
            "steps), and the per-seed change of its difference since then is judged by the same rule: an ordering "
            "marks the sentence still moving (a longer run may change it); any other change is shown, not judged "
            "(with a few seeds its interval is as wide as δ, so 'settled' would turn on machine noise).")


# ---- do the measures agree? --------------------------------------------------------------------

def per_seed_ranks(measures: pd.DataFrame) -> pd.DataFrame:
    """Layer-mean effective rank (% of H) per role, model, measure, kind and seed."""
    return (measures.groupby(["role", "model", "measure", "kind", "seed"], sort=False)["effective_rank_pct_of_heads"]
            .mean().rename("rank").reset_index())


def _ordering(d: Difference) -> str:
    verdict = d.verdict(MARGINS["uncentered"])
    if verdict in (HIGHER, LOWER):
        return f"{verdict} by {abs(d.mean):.1f} ± {d.half_width:.1f}"
    return f"{'within' if verdict == WITHIN else 'undecided at'} ±{MARGINS['uncentered']:g} ({d.format(1)})"


def measure_claims(ranks: pd.DataFrame) -> list[str]:
    """Per variant and kind with a weight-space ordering against Standard MHA (the paper's kind of
    conclusion; by the rule with the rank margin), whether the data-aware and behaviour views show
    the same ordering ("holds up"), the opposite one ("reversed"), or none ("not confirmed").
    Variants without a weight-space ordering are listed once."""
    if ranks["seed"].nunique() < 2:
        return ["One seed: no orderings claimed, so no weight-space conclusion is tested."]
    sentences, undecided = [], []
    models = dict(zip(ranks["role"], ranks["model"]))

    def difference(role: str, measure: str, kind: str) -> Difference:
        return paired_to_baseline(ranks[(ranks["measure"] == measure) & (ranks["kind"] == kind)], role, "rank")

    for role in dict.fromkeys(ranks["role"]):
        if role == "mha":
            continue
        for kind in KINDS:
            weights = difference(role, "frobenius", kind)
            if weights.verdict(MARGINS[kind]) not in (HIGHER, LOWER):
                undecided.append(f"{models[role]} ({kind})")
                continue
            parts = []
            for measure in ("data", BEHAVIOUR):
                d = difference(role, measure, kind)
                ordered = d.verdict(MARGINS[kind]) in (HIGHER, LOWER)
                verdict = ("holds up" if ordered and np.sign(d.mean) == np.sign(weights.mean)
                           else "reversed" if ordered else "not confirmed")
                parts.append(f"{VIEWS[measure]}: {_ordering(d)}, {verdict}")
            sentences.append(f"{models[role]}, {kind} (points of % of H against Standard MHA): weights "
                             f"{_ordering(weights)}; {'; '.join(parts)}.")
    if undecided:
        sentences.append(f"No weight-space ordering against Standard MHA (beyond ±{MARGINS['uncentered']:g} points) "
                         "to test: " + ", ".join(undecided) + ".")
    return sentences


# ---- through training ------------------------------------------------------------------------

def per_step_metrics(snapshot_summary: pd.DataFrame, mla_rope: str = FLAGSHIP_MLA_ROPE) -> pd.DataFrame:
    """One row per (role, model, seed, step) at the steps every run has, at one `mla_rope` setting:
    layer-mean QK effective rank (% of H) per kind, and gap = centered − uncentered."""
    qk = snapshot_summary[(snapshot_summary["circuit"] == "qk") & (snapshot_summary["mla_rope"] == mla_rope)]
    runs = qk.groupby(["model", "seed"])["step"].apply(set)
    common = sorted(set.intersection(*runs)) if len(runs) else []
    wide = (qk[qk["step"].isin(common)]
            .pivot_table(index=["role", "model", "seed", "step"], columns="kind",
                         values="effective_rank_pct_of_heads", aggfunc="mean").reset_index())
    return wide.assign(gap=wide["centered"] - wide["uncentered"])


def at_step(metrics: pd.DataFrame, role: str, step: int, column: str) -> Difference:
    """Paired difference `role` − Standard MHA of `column` at one snapshot step."""
    return paired_to_baseline(metrics[metrics["step"] == step], role, column)


def compensation_onset(metrics: pd.DataFrame) -> tuple[int | None, Difference | None]:
    """The first step where MQA's centering gap exceeds MHA's by the rule (an ordering beyond the
    rank margin), with that step's paired difference; (None, None) if there is no such step."""
    for step in sorted(metrics["step"].unique()):
        d = at_step(metrics, "mqa", step, "gap")
        if d.verdict(MARGINS["centered"]) == HIGHER:
            return int(step), d
    return None, None


def training_claims(metrics: pd.DataFrame) -> list[str]:
    """Query compensation (MQA's centering gap against MHA's, and its onset) and whether each LRKV
    tracks MHA from the start."""
    if metrics["seed"].nunique() < 2:
        return ["One seed: no onset and no ordering through training claimed."]
    steps = sorted(metrics["step"].unique())
    roles = set(metrics["role"])
    sentences, margin = [], MARGINS["centered"]

    def ordered(d: Difference) -> bool:
        return d.verdict(margin) in (HIGHER, LOWER)

    if {"mqa", "mha"} <= roles:
        step, d = compensation_onset(metrics)
        final = at_step(metrics, "mqa", steps[-1], "gap")
        if step is None:
            sentences.append(f"Query compensation: MQA's centering gap exceeds MHA's beyond the ±{margin:g}-point "
                             f"margin at none of the {len(steps)} snapshot steps (at step {steps[-1]}: "
                             f"{final.format(2)} points of % of H).")
        else:
            held = sum(ordered(at_step(metrics, "mqa", s, "gap")) for s in steps if s >= step)
            sentences.append(f"Query compensation: MQA's centering gap first exceeds MHA's beyond the "
                             f"±{margin:g}-point margin at step {step} (by {d.mean:.2f} ± {d.half_width:.2f} points "
                             f"of % of H) and does so at {held} of the {len([s for s in steps if s >= step])} "
                             f"snapshot steps from there on (at step {steps[-1]}: {final.format(2)}).")
    for role in sorted(r for r in roles if r.startswith("lrkv")):
        model = metrics.loc[metrics["role"] == role, "model"].iloc[0]
        apart = [(s, kind, at_step(metrics, role, s, kind)) for s in steps for kind in KINDS]
        apart = [(s, kind, d) for s, kind, d in apart if ordered(d)]
        if not apart:
            sentences.append(f"{model} tracks Standard MHA from the start: its uncentered and centered effective "
                             f"ranks give no ordering against MHA's beyond the ±{margin:g}-point margin at any of "
                             f"the {len(steps)} snapshot steps.")
        else:
            s, kind, d = apart[0]
            sentences.append(f"{model} departs from Standard MHA beyond the ±{margin:g}-point margin first at step {s} "
                             f"({kind} effective rank {d.format(2)} points of % of H), and at {len(apart)} of the "
                             f"{2 * len(steps)} (step, kind) comparisons in all (were it no different, chance alone "
                             f"would give about {chance_orderings(2 * len(steps)):.1f}).")
    return sentences
