"""Undefined values are never half counted (issue 45, class 7): a layer without a circuit in one seed
leaves that seed out of a mean over seeds, counted, rather than turning the mean into 'nan ± nan'
or hiding it; the rank table names such layers; a dead head's heatmap cells are drawn unlike
any similarity (white is 0) and named in a legend. Real analyses of tiny models, no training."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.patches import Rectangle

from headlab.analysis.similarity import analyze
from headlab.model.config import preset
from headlab.model.gpt import GPT
from headlab.report import plots
from headlab.report.plots.heatmaps import CELL_VALUES, UNDEFINED_LABEL
from headlab.study.claims import per_seed_metrics
from headlab.study.conclusions import distance_table, rank_table
from headlab.study.seed_distance import seed_distance
from headlab.study.stats import paired_to_baseline, spread


def with_dead_heads(attention: str, seed: int, dead_layers: tuple[int, ...] = (), dead_head: int | None = None):
    """A tiny model of `seed` whose query matrix is zero in `dead_layers` (no circuit there) and,
    in layer 1, for head `dead_head` alone."""
    torch.manual_seed(seed)
    model = GPT(preset("tiny", attention))
    width = model.config.head_dim
    with torch.no_grad():
        for layer in dead_layers:
            model.blocks[layer].attn.c_q.weight.zero_()
        if dead_head is not None:
            model.blocks[1].attn.c_q.weight[dead_head * width:(dead_head + 1) * width] = 0
    return model


def study_tables(dead: dict[int, tuple[int, ...]]) -> dict[str, pd.DataFrame]:
    """summary and spectra of MHA and GQA over seeds 0 and 1, GQA's `dead[seed]` layers without a circuit."""
    tables = {"summary": [], "spectra": []}
    for seed in (0, 1):
        for role in ("mha", "gqa"):
            result = analyze(with_dead_heads(role, seed, dead.get(seed, ()) if role == "gqa" else ()))
            for name in tables:
                tables[name].append(getattr(result, name).assign(seed=seed, role=role))
    return {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}


def training(summary: pd.DataFrame) -> pd.DataFrame:
    runs = summary[["role", "model", "seed"]].drop_duplicates()
    return runs.assign(step=10, val_loss=2.0 + runs["seed"], val_bpb=3.0, loss_unit="nats/byte")


def test_a_mean_over_seeds_leaves_out_an_undefined_value_and_counts_it():
    assert spread([1.0, math.nan, 3.0]).format(2) == "2.00 ± 1.41 (2 of 3; 1 undefined)"
    assert spread([1.5, math.nan]).format(2) == "1.50 (1 of 2; 1 undefined)"
    assert spread([math.nan, math.nan]).format(2) == "undefined (all 2)"
    assert spread([1.0, 3.0]).format(1) == "2.0 ± 1.4"
    table = pd.DataFrame({"role": ["mha", "mha", "mha", "gqa", "gqa", "gqa"], "seed": [0, 1, 2] * 2,
                          "x": [1.0, 2.0, 3.0, 1.5, math.nan, 3.5]})
    assert paired_to_baseline(table, "gqa", "x").n == 2  # the seeds both define, not NaN


def test_the_seed_distance_keeps_the_seed_whose_layer_has_a_circuit():
    """Seed 1's GQA layer 1 has no circuit: its λ₁ is undefined, seed 0's still counts."""
    tables = study_tables({1: (1,)})
    spectra = tables["spectra"]
    distances = seed_distance(spectra, spectra, {"Early": 0, "Late": 1}, "included")
    rows = distance_table(distances)
    late = rows[(rows["role"] == "gqa") & rows["panel"].str.startswith("Late")].iloc[0]
    assert "nan" not in late["λ₁ ours"] and late["λ₁ ours"].endswith("(1 of 2; 1 undefined)")
    seed0 = distances[(distances["role"] == "gqa") & (distances["layer"] == 1) & (distances["seed"] == 0)]
    assert late["λ₁ ours"].startswith(f"{seed0['first_eigenvalue'].iloc[0]:.2f} ")


@pytest.mark.parametrize("dead,said", [({0: (1,), 1: (1,)}, "no circuit at layer 1"),
                                       ({1: (1,)}, "layer 1 in 1 of 2 seeds")])
def test_the_rank_table_names_an_undefined_layer_instead_of_a_range_of_one(dead, said):
    tables = study_tables(dead)
    ranks = rank_table(tables["summary"], per_seed_metrics(tables["summary"], training(tables["summary"])))
    gqa = ranks[ranks["role"] == "gqa"].iloc[0]
    assert said in gqa["uncentered % of H"] and said in gqa["centered % of H"]
    assert said not in ranks[ranks["role"] == "mha"].iloc[0]["uncentered % of H"]


def test_a_dead_heads_cells_are_drawn_apart_and_named():
    similarity = analyze(with_dead_heads("mha", 0, dead_head=2)).similarity
    fig = plots.similarity_heatmaps(similarity, layer=1, annotate=True)
    ax = fig.axes[0]
    hatched = {(int(p.get_x()), int(p.get_y())) for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()}
    assert hatched == {(j, i) for i in range(4) for j in range(4) if 2 in (i, j)}  # head 2's row and column
    written = next(c for c in ax.collections if c.get_label() == CELL_VALUES)
    assert len(written.get_offsets()) == 16 - 7  # values in the live cells only
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [UNDEFINED_LABEL]
    live = plots.similarity_heatmaps(analyze(with_dead_heads("mha", 0)).similarity, layer=1)
    assert not live.legends and not any(p.get_hatch() for p in live.axes[0].patches)
    assert np.isnan(similarity[(similarity["layer"] == 1) & (similarity["head_i"] == 2)]["value"]).all()
