"""What every figure that sets ours beside the paper draws (issue 44): the random-init baseline and
the paper's values, an axis that shows the scale (0 to H), and a title naming the recipe and the
view; and the explorer switching between the recipes of one study."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from test_plots import FIGURE_ORDER, ROLE_OF, TAB10, legend_labels, synthetic_tables, synthetic_training

from headlab.report import plots
from headlab.report.widgets import explore
from headlab.study.paper import PAPER
from headlab.study.table_files import StudyTables, recipe_name, stack_recipes, with_recipe

MUON = {"optimizer": "muon", "muon_qk": True}
ADAMW_QK = {"optimizer": "muon", "muon_qk": False}


@pytest.fixture(scope="module")
def tables():
    """Two seeds of trained tables and their step-0 baseline (heads nearly orthogonal), QK."""
    trained = synthetic_tables(seeds=[0, 1])
    init = synthetic_tables(methods={m: 0.02 for m in FIGURE_ORDER}, seeds=[0, 1], rng_seed=1)
    return {**trained, "init_spectra": init["spectra"], "init_summary": init["summary"]}


def dashed(ax):
    return [line for line in ax.get_lines() if (line.get_gid() or "").startswith("init:")]


def paper_marks(ax):
    return [line for line in ax.get_lines() if (line.get_gid() or "").startswith("paper:")]


@pytest.mark.parametrize("kind", ["uncentered", "centered"])
def test_effective_rank_draws_the_random_init_baseline_and_table_3(tables, kind):
    fig = plots.effective_rank_figure(tables["summary"], kind=kind, init=tables["init_summary"], paper=True)
    (ax,) = fig.axes
    init = tables["init_summary"].query("kind == @kind")
    assert [line.get_gid() for line in dashed(ax)] == [f"init:{m}" for m in FIGURE_ORDER]
    for model, line, colour in zip(FIGURE_ORDER, dashed(ax), TAB10):
        np.testing.assert_allclose(line.get_ydata(), init[init.model == model].groupby("layer").effective_rank.mean())
        assert to_hex(line.get_color()) == colour
    marks = paper_marks(ax)
    assert [line.get_gid() for line in marks] == [f"paper:{m}" for m in FIGURE_ORDER]
    for model, line in zip(FIGURE_ORDER, marks):  # Table 3's % of H, times our H = 6, right of the last layer
        assert list(line.get_ydata()) == pytest.approx([getattr(PAPER[ROLE_OF[model]], kind) / 100 * 6])
        assert line.get_xdata()[0] > 3 and ax.get_xlim()[1] > line.get_xdata()[0]
    labels = legend_labels(fig)
    assert "random init (step 0), mean of 2 seeds" in labels and "paper 128M, Table 3: mean over layers" in labels
    plain = plots.effective_rank_figure(tables["summary"], kind=kind)
    assert not dashed(plain.axes[0]) and not paper_marks(plain.axes[0])


def test_the_spectra_axis_runs_from_0_to_h_so_a_flat_spectrum_looks_flat(tables):
    flat = tables["init_spectra"]
    for kind in ("uncentered", "centered"):
        fig = plots.spectra_figure(flat, kind=kind)
        assert all(ax.get_ylim() == (0, 6) for ax in fig.axes)  # λ₁ ≈ 1 is drawn a sixth of the way up
    small = flat[flat["index"] <= 4].assign(role=None)  # four heads: the seed's 5.0 must stay in view
    fig = plots.spectra_figure(small.assign(role=small["model"].map(ROLE_OF)), seed_figure=True)
    assert fig.axes[0].get_ylim()[0] == 0 and fig.axes[0].get_ylim()[1] >= 5.0
    assert len({ax.get_ylim() for ax in fig.axes}) == 1  # one scale: the late panel's λ₁ reads as the early one's


def test_measures_draw_the_baseline_and_the_paper_in_the_weights_panel_only(tables):
    views = pd.concat([tables["summary"].assign(measure=measure) for measure in ("frobenius", "data")],
                      ignore_index=True)
    init = tables["init_summary"].assign(measure="frobenius")
    fig = plots.measures_figure(views, kind="uncentered", init=init, paper=True)
    weights, data = fig.axes
    assert len(dashed(weights)) == 6 and len(paper_marks(weights)) == 6
    assert not dashed(data) and not paper_marks(data)  # no data-aware baseline kept; the paper measured weights
    for model, line in zip(FIGURE_ORDER, paper_marks(weights)):
        assert list(line.get_ydata()) == [PAPER[ROLE_OF[model]].uncentered]
    assert weights.get_ylim() == (0, 104)
    assert "random init (step 0), mean of 2 seeds: weights" in legend_labels(fig)


def test_titles_name_the_recipe_and_the_view(tables):
    """Two studies of one shape under two recipes, or one model under two views, never share a title."""
    muon, adamw = (with_recipe(StudyTables(tables, {"train": train})) for train in (MUON, ADAMW_QK))
    titles = [plots.spectra_figure(t["spectra"].assign(measure="frobenius")).get_suptitle() for t in (muon, adamw)]
    assert titles[0].endswith("\nMuon split (the paper's recipe) · weights view, mean of 2 seeds")
    assert titles[1].endswith("\nAdamW on W_Q, W_K (not the paper's) · weights view, mean of 2 seeds")
    views = [plots.spectra_figure(tables["spectra"].assign(measure=m)).get_suptitle() for m in ("frobenius", "data")]
    assert views[0] != views[1] and views[1].endswith("\ndata-aware weights view, mean of 2 seeds")
    assert recipe_name({"train": {"optimizer": "adamw"}}) == "AdamW"
    assert recipe_name({"train": {"optimizer": "muon"}}) == "Muon split"  # tables from before muon_qk: Muon's
    assert recipe_name({}) == "recipe not recorded"


def test_the_explorer_switches_between_recipes_and_draws_each_ones_baseline(tables):
    training = synthetic_training().assign(role=lambda t: t["model"].map(ROLE_OF), seed=0)
    muon = StudyTables({**tables, "training": training}, {"train": MUON})
    shifted = {name: table.assign(effective_rank=table["effective_rank"] - 1) if name == "summary" else table
               for name, table in muon.tables.items()}
    adamw = StudyTables({**shifted, "training": training.assign(val_loss=training["val_loss"] + 1)},
                        {"train": ADAMW_QK})
    stacked = stack_recipes([muon, adamw])
    explorer = explore(stacked, training=stacked["training"])
    assert explorer.choices["recipe"].options == ("Muon split", "AdamW on W_Q, W_K")
    assert explorer.choices["recipe"] in explorer.children
    (fig,) = explorer.figures
    title = fig.get_suptitle()
    assert "\nMuon split (the paper's recipe) · weights" not in title and "Muon split" in title
    assert len(dashed(fig.axes[0])) == 6  # the random-init baseline, drawn in the explorer too
    explorer.view.value = "effective rank"
    before = explorer.figures[0].axes[0].get_lines()[0].get_ydata()
    explorer.choices["recipe"].value = "AdamW on W_Q, W_K"
    (fig,) = explorer.figures
    assert fig.get_suptitle().startswith("Effective rank per layer (uncentered)") and "AdamW on W_Q, W_K" in \
        fig.get_suptitle()
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_ydata(), np.asarray(before) - 1)
    assert len(paper_marks(fig.axes[0])) == 6
    explorer.view.value = "loss curves"
    assert not explorer.choices["recipe"].disabled  # the loss curves are of the recipe chosen
    (fig,) = explorer.figures
    losses = fig.axes[0].get_lines()[0].get_ydata()
    mha = training[(training.model == "Standard MHA")].dropna(subset=["val_loss"])
    np.testing.assert_allclose(losses, mha.groupby("tokens").val_loss.mean() + 1)
    with pytest.raises(ValueError, match="a recipe appears twice"):
        stack_recipes([muon, muon])
