"""Head diversity through training: the QK effective rank of every snapshot step of a study's
runs (`headlab.snapshots`), and the two questions the report answers from it by the rule of
`headlab.stats` (an ordering only where the paired 95% t-interval over seeds excludes zero):

  * Query compensation: MQA's centring gap g = centred − uncentred effective rank (layer mean,
    % of H) against MHA's, d_i = g_MQA,i − g_MHA,i per seed i. Its onset is the first snapshot
    step whose interval of d excludes zero with d̄ > 0 (centring helps MQA more than MHA).
  * Does LRKV track MHA from the start? Per step and kind, d_i = rank_LRKV,i − rank_MHA,i; LRKV
    tracks MHA where no step's interval excludes zero.

Only steps every run has a snapshot of are compared (the runs of one study share a schedule).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import plots
from .snapshots import analyze_snapshots
from .stats import Difference, chance_orderings, paired_difference
from .study import StudyRun

KIND_COLUMNS = {"uncentered": "uncentred", "centered": "centred"}


def snapshot_summary(runs: list[StudyRun], mla_rope: str = "included") -> pd.DataFrame:
    """The QK summary table of every snapshot (and the last checkpoint) of every run, with
    step, seed and role columns."""
    return pd.concat([analyze_snapshots(r.folder, r.label, mla_rope=mla_rope).summary.assign(seed=r.seed, role=r.role)
                      for r in runs], ignore_index=True)


def per_step_metrics(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (role, model, seed, step) at the steps every run has: layer-mean QK effective
    rank (% of H), uncentred and centred, and gap = centred − uncentred."""
    qk = summary[summary["circuit"] == "qk"]
    runs = qk.groupby(["model", "seed"])["step"].apply(set)
    common = sorted(set.intersection(*runs)) if len(runs) else []
    wide = (qk[qk["step"].isin(common)]
            .pivot_table(index=["role", "model", "seed", "step"], columns="kind",
                         values="effective_rank_pct_of_heads", aggfunc="mean")
            .rename(columns=KIND_COLUMNS).reset_index())
    return wide.assign(gap=wide["centred"] - wide["uncentred"])


def _paired(metrics: pd.DataFrame, role: str, step: int, column: str, baseline: str = "mha") -> Difference:
    ours = metrics[(metrics["role"] == role) & (metrics["step"] == step)].set_index("seed")[column]
    base = metrics[(metrics["role"] == baseline) & (metrics["step"] == step)].set_index("seed")[column]
    seeds = ours.index.intersection(base.index).sort_values()
    return paired_difference(ours[seeds].to_numpy(), base[seeds].to_numpy())


def compensation_onset(metrics: pd.DataFrame) -> tuple[int | None, Difference | None]:
    """The first step where MQA's centring gap exceeds MHA's beyond seed noise, with that
    step's paired difference; (None, None) if there is no such step."""
    for step in sorted(metrics["step"].unique()):
        d = _paired(metrics, "mqa", step, "gap")
        if d.decided and d.mean > 0:
            return int(step), d
    return None, None


def claims(metrics: pd.DataFrame) -> list[str]:
    """The section's sentences, by the rule of `headlab.stats`."""
    if metrics["seed"].nunique() < 2:
        return ["One seed: no onset and no ordering through training claimed."]
    steps = sorted(metrics["step"].unique())
    roles = set(metrics["role"])
    sentences = []
    if {"mqa", "mha"} <= roles:
        step, d = compensation_onset(metrics)
        final = _paired(metrics, "mqa", steps[-1], "gap")
        if step is None:
            sentences.append(f"Query compensation: MQA's centring gap is not distinguishable from MHA's beyond seed "
                             f"noise at any of the {len(steps)} snapshot steps (at step {steps[-1]}: "
                             f"{final.format(2)} points of % of H).")
        else:
            held = sum(_paired(metrics, "mqa", s, "gap").decided for s in steps if s >= step)
            sentences.append(f"Query compensation: MQA's centring gap first exceeds MHA's beyond seed noise at step "
                             f"{step} (by {d.mean:.2f} ± {d.half_width:.2f} points of % of H) and does so at {held} "
                             f"of the {len([s for s in steps if s >= step])} snapshot steps from there on (at step "
                             f"{steps[-1]}: {final.format(2)}).")
    for role in sorted(r for r in roles if r.startswith("lrkv")):
        model = metrics.loc[metrics["role"] == role, "model"].iloc[0]
        apart = [(s, column, _paired(metrics, role, s, column)) for s in steps for column in KIND_COLUMNS.values()]
        apart = [(s, column, d) for s, column, d in apart if d.decided]
        if not apart:
            sentences.append(f"{model} tracks Standard MHA from the start: its uncentred and centred effective "
                             f"ranks are within seed noise of MHA's at every one of the {len(steps)} snapshot steps.")
        else:
            s, column, d = apart[0]
            sentences.append(f"{model} departs from Standard MHA beyond seed noise first at step {s} ({column} "
                             f"effective rank {d.format(2)} points of % of H), and at {len(apart)} of the "
                             f"{2 * len(steps)} (step, kind) comparisons in all (were it no different, chance alone "
                             f"would give about {chance_orderings(2 * len(steps)):.1f}).")
    return sentences


def section(runs: list[StudyRun], out: Path, mla_rope: str = "included") -> list[str]:
    """The report's section: writes snapshot_summary.csv and the two figures into `out`
    (figures/ for the PNG and SVG) and returns the markdown lines."""
    summary = snapshot_summary(runs, mla_rope)
    summary.to_csv(out / "snapshot_summary.csv", index=False)
    colours = plots.palette(summary["model"].unique())
    figures = [plots.save_figure(plots.rank_through_training_figure(summary, kind=kind, palette=colours),
                                 out / "figures", f"effective_rank_through_training_{kind}") for kind in KIND_COLUMNS]
    metrics = per_step_metrics(summary)
    steps = sorted(metrics["step"].unique())
    return [
        "## Effective rank through training",
        "",
        f"QK effective rank at the {len(steps)} snapshot steps every run has ({', '.join(map(str, steps))}; "
        "log-spaced early, then evenly spaced, the last being the final checkpoint), early, middle and late layer, "
        f"mean over seeds with a min–max band; MLA at `mla_rope = \"{mla_rope}\"`. The statements use the layer "
        "mean and the rule above (paired by seed, an ordering only where the 95% t-interval excludes zero).",
        "",
        *[f"![{path.stem}](figures/{path.name})" for path in figures],
        "",
        *[f"- {sentence}" for sentence in claims(metrics)],
        "",
    ]
