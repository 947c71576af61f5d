"""headlab.report.plots on small synthetic tables (random PSD similarity matrices; no analysis run)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib
import matplotlib.text

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from headlab import schema
from headlab.io import Manifest
from headlab.report import plots
from headlab.schema import FAMILIES, ROLES
from headlab.study.paper import PAPER_PANELS, SEED_SPECTRA
from headlab.study.roles import comparison_roles

# The six demo variants, deliberately out of figure order, and their redundancy: the share of
# each head's bilinear form that is common to all heads of a layer.
METHODS = {"MQA": 0.6, "GQA (3 KV heads)": 0.45, "LRKV (r=16)": 0.3, "Standard MHA": 0.2,
           "MLA (d_c=32)": 0.5, "LRKV (r=4)": 0.4}
FIGURE_ORDER = ["Standard MHA", "LRKV (r=4)", "LRKV (r=16)", "MQA", "MLA (d_c=32)", "GQA (3 KV heads)"]
ROLE_OF = dict(zip(FIGURE_ORDER, ROLES))  # a study's tables carry each model's role
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def _spectrum_rows(model, layer, kind, matrix):
    eigenvalues = np.clip(np.linalg.eigvalsh(matrix)[::-1], 0, None)
    ratio = eigenvalues / eigenvalues.sum()
    rows = pd.DataFrame({"model": model, "layer": layer, "circuit": "qk", "kind": kind,
                         "index": np.arange(1, len(matrix) + 1), "eigenvalue": eigenvalues,
                         "variance_ratio": ratio, "cumulative": np.cumsum(ratio)})
    n = len(matrix)
    rank = float(np.exp(-np.sum(ratio[ratio > 0] * np.log(ratio[ratio > 0]))))
    ceiling = n if kind == "uncentered" else n - 1
    summary = {"model": model, "layer": layer, "circuit": "qk", "kind": kind, "n_heads": n, "effective_rank": rank,
               "effective_rank_pct_of_heads": 100 * rank / n, "effective_rank_pct_of_ceiling": 100 * rank / ceiling,
               "n_components_90": int(np.searchsorted(np.cumsum(ratio), 0.9) + 1),
               "participation_ratio": eigenvalues.sum() ** 2 / np.sum(eigenvalues ** 2),
               "mean_offdiag_similarity": matrix[~np.eye(n, dtype=bool)].mean()}
    return rows, summary


def synthetic_tables(methods=METHODS, n_layers=4, n_heads=6, seeds=None, width=32, rng_seed=0):
    """similarity, spectra and summary tables with the columns of headlab.analysis: head h of a
    layer is a vector a_h = √w·shared + √(1−w)·own (w: the method's redundancy), G its cosine
    matrix (PSD, unit diagonal), spectra of G and of J G J. `seeds` adds a seed column."""
    rng = np.random.default_rng(rng_seed)
    similarity, spectra, summary = [], [], []
    centering = np.eye(n_heads) - 1 / n_heads
    for seed in seeds if seeds is not None else [None]:
        for model, shared in methods.items():
            for layer in range(n_layers):
                w = np.clip(shared + 0.1 * np.sin(layer) + 0.03 * rng.standard_normal(), 0.02, 0.95)
                heads = np.sqrt(w) * rng.standard_normal(width) + np.sqrt(1 - w) * rng.standard_normal((n_heads, width))
                heads /= np.linalg.norm(heads, axis=1, keepdims=True)
                gram = heads @ heads.T
                i, j = np.indices(gram.shape)
                similarity.append(pd.DataFrame({"model": model, "layer": layer, "circuit": "qk",
                                                "head_i": i.ravel(), "head_j": j.ravel(), "value": gram.ravel()}))
                for kind, matrix in (("uncentered", gram), ("centered", centering @ gram @ centering)):
                    rows, row = _spectrum_rows(model, layer, kind, matrix)
                    spectra.append(rows)
                    summary.append(row)
    tables = {"similarity": pd.concat(similarity, ignore_index=True),
              "spectra": pd.concat(spectra, ignore_index=True), "summary": pd.DataFrame(summary)}
    if seeds is not None:
        for name, table in tables.items():
            per_seed = len(table) // len(seeds)
            table["seed"] = np.repeat(seeds, per_seed)
    return {name: with_roles(table) for name, table in tables.items()}


def with_roles(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(role=table["model"].map(ROLE_OF))


def synthetic_training(methods=METHODS, steps=(0, 100, 200, 300), tokens_per_step=4096):
    """A training table (model, step, tokens, val_loss) with decreasing losses, plus train-only rows."""
    rows = []
    for n, model in enumerate(methods):
        for step in steps:
            rows.append({"model": model, "step": step, "tokens": step * tokens_per_step,
                         "val_loss": 2.0 + 3.5 * np.exp(-step / 120) + 0.03 * n, "train_loss": np.nan})
            rows.append({"model": model, "step": step, "tokens": step * tokens_per_step, "val_loss": np.nan,
                         "train_loss": 2.5})
    return with_roles(pd.DataFrame(rows))


def synthetic_results(methods=METHODS):
    """model, kv_cache_pct, val_loss: one final result per method."""
    pct = {"Standard MHA": 100.0, "LRKV (r=4)": 29.2, "LRKV (r=16)": 66.7, "MQA": 16.7, "MLA (d_c=32)": 12.5,
           "GQA (3 KV heads)": 50.0}
    return with_roles(pd.DataFrame({"model": list(methods), "kv_cache_pct": [pct[m] for m in methods],
                                    "val_loss": [2.05 + 0.02 * n for n in range(len(methods))]}))


@pytest.fixture(scope="module")
def tables():
    return synthetic_tables()


def legend_labels(fig: Figure) -> list[str]:
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def line_colours(ax) -> list[str]:
    """Colours of the method lines (those with markers; reference lines have none, the paper's marks a gid)."""
    return [to_hex(line.get_color()) for line in ax.get_lines()
            if line.get_marker() not in ("None", None, "") and not line.get_gid()]


# ---- order and colours -----------------------------------------------------------------------

def test_methods_are_ordered_by_role_never_by_parsing_their_labels():
    """Figure order comes from the role column (headlab.schema.ROLES): relabelled models keep their
    places, and models without a comparison role follow in the order the table lists them."""
    labels = ["my-pretrained-bert", "GQA (3 KV heads)", "LRKV (r=16)", "MLA (d_c=32)", "MQA", "LRKV (r=4)",
              "Standard MHA", "another-model"]
    roles = [ROLE_OF.get(label) for label in labels]
    assert plots.method_order(labels, roles) == FIGURE_ORDER + ["my-pretrained-bert", "another-model"]
    renamed = [f"variant {n}" for n in range(len(labels))]  # labels that name no family
    assert plots.method_order(renamed, roles) == [renamed[labels.index(m)] for m in FIGURE_ORDER] + [
        renamed[0], renamed[-1]]
    assert plots.method_order(["MQA", "MQA", "Standard MHA"]) == ["MQA", "Standard MHA"]  # no roles: as listed


def test_palette_fixes_each_colour_by_role_or_family_never_by_place():
    by_role = plots.palette(ROLE_OF)
    assert list(by_role) == FIGURE_ORDER and list(by_role.values()) == TAB10
    assert plots.table_palette(synthetic_results()) == by_role
    backwards = dict(reversed(ROLE_OF.items()))
    assert plots.palette(backwards) == {m: by_role[m] for m in backwards}
    assert plots.palette({"MQA": "mqa", "GQA (3 KV heads)": "gqa"}) == {"MQA": TAB10[3], "GQA (3 KV heads)": TAB10[5]}
    role_of_family = {config.attention: role for role, config in reversed(comparison_roles("tiny").items())}
    assert plots.palette(FAMILIES) == {f: plots.palette(ROLES)[role_of_family[f]] for f in FAMILIES}  # outside a study
    many = plots.palette([f"model {n}" for n in range(17)])  # no role, no family: spare colours, distinct
    assert len(set(many.values())) == 17 and not set(many.values()) & set(TAB10)
    assert plots.palette(["model 3"]) == {"model 3": many["model 3"]}  # chosen by name, not by place


def test_every_role_and_family_has_a_colour_of_its_own():
    """A role or family added to headlab.schema without a colour in plots.palette fails here."""
    roles, families = plots.palette(ROLES), plots.palette(FAMILIES)
    assert len(set(roles.values())) == len(ROLES)
    assert set(families.values()) <= set(roles.values())  # no family falls back to a spare colour


def test_a_new_family_in_a_figure_moves_no_other_colour_or_marker(tables, monkeypatch):
    """A sixth family (Cross-Layer Attention, say) added to the schema and drawn beside the
    others: every other method keeps its colour and marker; the new one has its own."""
    before = plots.spectra_figure(tables["spectra"])
    monkeypatch.setattr(schema, "FAMILIES", (*schema.FAMILIES, "cla"))
    monkeypatch.setattr(schema, "ROLES", (*schema.ROLES[:1], "cla", *schema.ROLES[1:]))  # even ahead of the others
    mha = tables["spectra"][tables["spectra"].model == "Standard MHA"]
    spectra = pd.concat([tables["spectra"], mha.assign(model="Cross-Layer Attention", role="cla")])
    after = plots.spectra_figure(spectra)
    assert legend_labels(after) == ["Standard MHA", "Cross-Layer Attention", *FIGURE_ORDER[1:]]
    looks = {fig: {h.get_label(): (to_hex(h.get_color()), h.get_marker()) for h in fig.legends[0].legend_handles}
             for fig in (before, after)}
    new = looks[after].pop("Cross-Layer Attention")
    assert looks[after] == looks[before]
    assert new[0] not in TAB10 and new[1] not in {marker for _, marker in looks[before].values()}


def method_colours(fig: Figure) -> dict[str, str]:
    """The colour a figure gives each method: its legend entry, its heatmap title or its point's label."""
    if fig.legends:
        (legend,) = fig.legends
        return {h.get_label(): to_hex(h.get_color()) for h in legend.legend_handles if h.get_label() in ROLE_OF}
    titles = {ax.get_title(): to_hex(ax.title.get_color()) for ax in fig.axes if ax.get_title() in ROLE_OF}
    return titles or {text.get_text(): to_hex(text.get_color()) for text in fig.axes[0].texts}


@pytest.mark.parametrize("draw", [
    lambda t: plots.spectra_figure(t["spectra"]),
    lambda t: plots.cumulative_variance_figure(t["spectra"]),
    lambda t: plots.effective_rank_figure(t["summary"]),
    lambda t: plots.measures_figure(t["summary"].assign(measure="frobenius")),
    lambda t: plots.similarity_heatmaps(t["similarity"], layer=0),
    lambda t: plots.loss_curves_figure(t["training"]),
    lambda t: plots.loss_vs_cache_figure(t["results"]),
    lambda t: plots.rank_through_training_figure(t["summary"].assign(step=0)),
    lambda t: plots.factor_norm_figure(t["summary"].query("kind == 'centered'").assign(step=0, norm_ratio=0.5)),
    lambda t: plots.sweep_figure(t["summary"].drop_duplicates("model").rename(columns={"model": "comparison"}).assign(
        point="p", metric="m", unit="u", mean=0.0, half_width=0.1, seeds=3)),
], ids=["spectra", "cumulative", "effective_rank", "measures", "heatmaps", "loss_curves", "loss_vs_cache",
        "rank_through_training", "factor_norm", "sweep"])
def test_every_figure_gives_a_method_its_roles_colour_whatever_else_it_shows(tables, draw):
    some = ["GQA (3 KV heads)", "MQA", "LRKV (r=16)"]  # three of six, out of order
    subset = {name: table[table.model.isin(some)] for name, table in
              {**tables, "training": synthetic_training(), "results": synthetic_results()}.items()}
    assert method_colours(draw(subset)) == {m: TAB10[FIGURE_ORDER.index(m)] for m in some}


def test_layer_roles_and_titles():
    assert plots.layer_roles(range(12)) == {"Early": 0, "Middle": 6, "Late": 11}
    assert plots.layer_roles([0, 6, 11]) == {"Early": 0, "Middle": 6, "Late": 11}
    assert plots.layer_title(6, range(12)) == "Middle Layer (L=6)"
    assert plots.layer_title(4, range(12)) == "Layer (L=4)"
    # a 2-layer model has no middle layer: its last layer is Late, never Middle
    assert plots.layer_roles([0, 1]) == {"Early": 0, "Late": 1}
    assert plots.layer_title(1, [0, 1]) == "Late Layer (L=1)"
    assert plots.layer_roles([3]) == {"Early": 3}


# ---- the flagship spectra figure --------------------------------------------------------------

@pytest.mark.parametrize("kind, word", [("centered", "centered"), ("uncentered", "uncentered")])
def test_spectra_figure_panels_labels_legend(tables, kind, word):
    fig = plots.spectra_figure(tables["spectra"], kind=kind)
    assert isinstance(fig, Figure)
    assert [ax.get_title() for ax in fig.axes] == ["Early Layer (L=0)", "Middle Layer (L=2)", "Late Layer (L=3)"]
    assert {ax.get_xlabel() for ax in fig.axes} == {"Eigenvalue Index"}
    assert {ax.get_ylabel() for ax in fig.axes} == {"Eigenvalue"}
    title = fig.get_suptitle()
    assert title.startswith("Eigenvalue spectra of head similarity matrices") and f"({word}" in title
    assert legend_labels(fig) == FIGURE_ORDER
    assert "1 seed" in title
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0  # eigenvalues from 0, as in the seed figure
        notes = [text.get_text() for text in ax.texts]
        assert notes == (["last eigenvalue = 0\nby construction (centering)"] if kind == "centered" else [])
        assert line_colours(ax) == TAB10  # one line per method, in order, in its colour
        assert all(tick == int(tick) for tick in ax.get_xticks())
        (first_line, *_) = ax.get_lines()
        assert list(first_line.get_xdata()) == [1, 2, 3, 4, 5, 6]


def test_spectra_figure_draws_the_table_values(tables):
    fig = plots.spectra_figure(tables["spectra"], kind="uncentered", layers=[1])
    (ax,) = fig.axes
    assert ax.get_title() == "Layer (L=1)"
    spectra = tables["spectra"]
    expected = spectra[(spectra.model == "MQA") & (spectra.layer == 1) & (spectra.kind == "uncentered")]
    np.testing.assert_allclose(ax.get_lines()[3].get_ydata(), expected.sort_values("index").eigenvalue)


def test_spectra_figure_with_seeds_draws_mean_and_band():
    tables = synthetic_tables(seeds=[0, 1, 2])
    fig = plots.spectra_figure(tables["spectra"], kind="centered")
    assert "mean of 3 seeds" in fig.get_suptitle()
    assert legend_labels(fig) == FIGURE_ORDER + [plots.BAND]
    ax = fig.axes[0]
    assert len(ax.collections) == len(METHODS)  # one band per method
    spectra = tables["spectra"]
    mha = spectra[(spectra.model == "Standard MHA") & (spectra.layer == 0) & (spectra.kind == "centered")]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), mha.groupby("index").eigenvalue.mean())
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(mha.eigenvalue[mha["index"] == 6].min())
    assert band.max() == pytest.approx(mha.eigenvalue[mha["index"] == 1].max())


def test_fixed_palette_keeps_colours_for_a_subset(tables):
    spectra = tables["spectra"]
    subset = spectra[spectra.model.isin(["MQA", "GQA (3 KV heads)"])]
    fig = plots.spectra_figure(subset, palette=plots.palette(ROLE_OF))
    assert legend_labels(fig) == ["MQA", "GQA (3 KV heads)"]
    assert line_colours(fig.axes[0]) == [TAB10[3], TAB10[5]]
    with pytest.raises(ValueError, match="no colour for 'MQA'"):
        plots.spectra_figure(subset, palette={"GQA (3 KV heads)": "red"})


def test_the_flagship_draws_the_random_init_baseline_dashed_per_method():
    """init: per method and panel one dashed line in the method's colour, the mean over seeds of
    the step-0 spectra; the legend says what it is and over how many seeds."""
    trained = synthetic_tables(seeds=[0, 1])
    init = synthetic_tables(methods={model: 0.02 for model in METHODS}, seeds=[0, 1], rng_seed=1)["spectra"]
    fig = plots.spectra_figure(trained["spectra"], kind="uncentered", init=init)
    assert "random init (step 0), mean of 2 seeds" in legend_labels(fig)
    colours = dict(zip(FIGURE_ORDER, TAB10))
    for ax, layer in zip(fig.axes, [0, 2, 3]):
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert [line.get_gid() for line in dashed] == [f"init:{model}" for model in FIGURE_ORDER]
        for model, line in zip(FIGURE_ORDER, dashed):
            assert to_hex(line.get_color()) == colours[model]
            rows = init[(init.model == model) & (init.layer == layer) & (init.kind == "uncentered")]
            np.testing.assert_allclose(line.get_ydata(), rows.groupby("index").eigenvalue.mean())
            np.testing.assert_array_equal(line.get_xdata(), np.arange(1, 7))
    centered = plots.spectra_figure(trained["spectra"], kind="centered", init=init)
    (line, *_) = [line for line in centered.axes[0].get_lines() if line.get_linestyle() == "--"]
    rows = init[(init.model == "Standard MHA") & (init.layer == 0) & (init.kind == "centered")]
    np.testing.assert_allclose(line.get_ydata(), rows.groupby("index").eigenvalue.mean())  # the figure's own kind
    plain = plots.spectra_figure(trained["spectra"], kind="uncentered")
    assert not [line for ax in plain.axes for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_the_flagship_marks_the_seed_figures_first_eigenvalue_per_method_and_panel(tables):
    """seed_figure: in the early, middle and late panels, for each method with a role, a bar at
    index 1 at the paper's 128M λ₁ of that role and panel (Fig. 11's L = 0, 6, 11), in the
    method's colour; the titles name the paper's layer; a model without a role gets no mark."""
    spectra = pd.concat([tables["spectra"], tables["spectra"].query("model == 'MQA'").assign(
        model="my-pretrained-model", role=None)], ignore_index=True)
    fig = plots.spectra_figure(spectra, kind="uncentered", seed_figure=True,
                               palette=plots.table_palette(spectra))
    assert [ax.get_title() for ax in fig.axes] == ["Early Layer (L=0) · paper L=0", "Middle Layer (L=2) · paper L=6",
                                                   "Late Layer (L=3) · paper L=11"]
    assert "paper 128M, Fig. 11: λ₁ (read off)" in legend_labels(fig)
    colours = dict(zip(FIGURE_ORDER, TAB10))
    for ax, panel in zip(fig.axes, PAPER_PANELS):
        marks = [line for line in ax.get_lines() if (line.get_gid() or "").startswith("seed:")]
        assert [line.get_gid() for line in marks] == [f"seed:{model}" for model in FIGURE_ORDER]
        for model, line in zip(FIGURE_ORDER, marks):
            seed_first = SEED_SPECTRA[ROLE_OF[model]][panel].first
            assert list(line.get_xdata()) == [1] and list(line.get_ydata()) == [seed_first]
            assert to_hex(line.get_color()) == colours[model] and line.get_linestyle() == "None"
        assert ax.get_ylim()[1] >= max(curves[panel].first for curves in SEED_SPECTRA.values())  # all in view
    one_layer = plots.spectra_figure(tables["spectra"], kind="uncentered", layers=[1], seed_figure=True)
    assert one_layer.axes[0].get_title() == "Layer (L=1)"  # not an early, middle or late panel: nothing to match
    assert not [line for line in one_layer.axes[0].get_lines() if line.get_gid()]
    with pytest.raises(ValueError, match="seed_figure = True is invalid for centered spectra"):
        plots.spectra_figure(tables["spectra"], kind="centered", seed_figure=True)


@pytest.mark.parametrize("call, message", [
    (lambda t: plots.spectra_figure(t["spectra"], kind="pca"), "kind = 'pca' is invalid: allowed values are "
                                                                "uncentered, centered"),
    (lambda t: plots.spectra_figure(t["spectra"].drop(columns="eigenvalue")), "missing column.*eigenvalue"),
    (lambda t: plots.spectra_figure(t["spectra"], circuit="ov"), "circuit = 'ov'.*allowed values are qk"),
    (lambda t: plots.spectra_figure(t["spectra"], layers=[0, 9]), "layers = \\[0, 9\\].*layers 0, 1, 2, 3"),
    (lambda t: plots.spectra_figure(pd.concat([t["spectra"]] * 2)), "several rows for .*seed"),
    (lambda t: plots.effective_rank_figure(t["summary"].drop(columns="n_heads")), "missing column.*n_heads"),
    (lambda t: plots.effective_rank_figure(t["summary"], kind="both"), "allowed values"),
    (lambda t: plots.similarity_heatmaps(t["similarity"], layer=7), "layers 0, 1, 2, 3"),
    (lambda t: plots.cumulative_variance_figure(t["spectra"], threshold=90), "threshold"),
    (lambda t: plots.similarity_heatmaps(pd.concat([t["similarity"].assign(seed=s) for s in (0, 1)]), layer=0),
     "holds 2 seeds"),
])
def test_invalid_inputs_raise_value_error(tables, call, message):
    with pytest.raises(ValueError, match=message):
        call(tables)


# ---- the other figures ------------------------------------------------------------------------

@pytest.mark.parametrize("kind, ceiling, label", [("uncentered", 6, "ceiling: H = 6"),
                                                  ("centered", 5, "ceiling: H − 1 = 5")])
def test_effective_rank_figure(tables, kind, ceiling, label):
    fig = plots.effective_rank_figure(tables["summary"], kind=kind, highlight_layers=[1])
    (ax,) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Layer", "Effective rank (entropy)")
    assert legend_labels(fig) == FIGURE_ORDER + ["layer 1", label, "fully redundant"]
    levels = {line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() in ("--", ":")}
    assert levels == {ceiling, 1}
    assert line_colours(ax) == TAB10
    assert list(ax.get_lines()[0].get_xdata()) == [0, 1, 2, 3]


def test_cumulative_variance_figure(tables):
    fig = plots.cumulative_variance_figure(tables["spectra"], layers=[0, 3])
    assert [ax.get_title() for ax in fig.axes] == ["Early Layer (L=0)", "Late Layer (L=3)"]
    assert legend_labels(fig) == FIGURE_ORDER + ["90% of variance"]
    for ax in fig.axes:
        assert ax.get_xlabel() == "Number of components"
        assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"] == [0.9]
        assert ax.get_lines()[0].get_ydata()[-1] == pytest.approx(1.0)


def test_loss_curves_figure_skips_rows_without_val_loss():
    fig = plots.loss_curves_figure(synthetic_training())
    (ax,) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Training tokens", "Validation loss (nats/token)")
    assert legend_labels(fig) == FIGURE_ORDER
    assert list(ax.get_lines()[0].get_xdata()) == [0, 409600, 819200, 1228800]


def test_loss_figures_label_the_runs_own_unit():
    training = synthetic_training().assign(loss_unit="nats/byte")
    assert plots.loss_curves_figure(training).axes[0].get_ylabel() == "Validation loss (nats/byte)"
    results = synthetic_results().assign(loss_unit="nats/byte")
    assert plots.loss_vs_cache_figure(results).axes[0].get_ylabel() == "Final validation loss (nats/byte)"
    mixed = training.assign(loss_unit=np.where(training.model == "MQA", "nats/token", "nats/byte"))
    with pytest.raises(ValueError, match="mixes loss units"):
        plots.loss_curves_figure(mixed)


def test_a_table_with_both_mla_rope_settings_is_refused(tables):
    both = pd.concat([tables["spectra"].assign(mla_rope=s) for s in ("included", "excluded")])
    with pytest.raises(ValueError, match="several mla_rope settings \\(included, excluded\\): pass one"):
        plots.spectra_figure(both)


@pytest.mark.parametrize("mla_rope,note", [("included", "MLA: RoPE part included"),
                                           ("excluded", "MLA: latent only (RoPE part excluded)")])
def test_figures_of_a_study_say_which_definition_of_mla_they_draw(tables, mla_rope, note):
    spectra, summary = (tables[name].assign(mla_rope=mla_rope) for name in ("spectra", "summary"))
    for fig in (plots.spectra_figure(spectra), plots.cumulative_variance_figure(spectra),
                plots.effective_rank_figure(summary)):
        assert note in fig._suptitle.get_text()
    without_mla = spectra[~spectra["model"].str.startswith("MLA")]
    assert "MLA" not in plots.spectra_figure(without_mla)._suptitle.get_text()
    assert "MLA" not in plots.spectra_figure(tables["spectra"])._suptitle.get_text()  # no setting recorded
    patterns = tables["similarity"].assign(mla_rope="n/a", circuit="pattern")  # behaviour: no RoPE setting to name
    assert "MLA" not in plots.similarity_heatmaps(patterns, layer=0, circuit="pattern")._suptitle.get_text()


def test_loss_vs_cache_figure():
    fig = plots.loss_vs_cache_figure(synthetic_results())
    (ax,) = fig.axes
    assert ax.get_xlabel() == "KV cache (% of Standard MHA)"
    assert [t.get_text() for t in ax.texts] == FIGURE_ORDER
    assert [to_hex(c.get_facecolor()[0]) for c in ax.collections] == TAB10
    assert ax.collections[0].get_offsets()[0].tolist() == [100.0, pytest.approx(2.11)]


def test_loss_vs_cache_figure_with_seeds_has_error_bars():
    results = pd.concat([synthetic_results().assign(seed=s, val_loss=lambda t, s=s: t.val_loss + 0.01 * s)
                         for s in range(3)])
    fig = plots.loss_vs_cache_figure(results)
    (ax,) = fig.axes
    assert "mean of 3 seeds" in fig.get_suptitle()
    assert len(ax.containers) == len(METHODS)  # one error bar per method


def test_figures_stay_out_of_pyplot_and_display_as_png(tables):
    import matplotlib.pyplot as plt
    from IPython.core.formatters import PNGFormatter

    before = plt.get_fignums()
    fig = plots.effective_rank_figure(tables["summary"])
    similarity = tables["similarity"]
    plots.similarity_heatmaps(similarity[similarity.model == "MQA"], layer=0)
    assert plt.get_fignums() == before
    # IPython's PNG formatter with no inline backend registered, as in a fresh kernel (a
    # standalone formatter: creating the IPython shell would make every later display() render)
    assert PNGFormatter()(fig).startswith(b"\x89PNG")


def test_decode_latency_figure():
    contexts = [128, 512, 2048]
    latency = with_roles(pd.DataFrame([{"model": model, "context": t, "ms": 1 + share * t / 100}
                                       for model, share in METHODS.items() for t in contexts]))
    fig = plots.decode_latency_figure(latency)
    (ax,) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Tokens in the cache (T)", "ms per decoding step")
    assert fig.get_suptitle() == "Cached decoding step against context length"
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "512", "2048"]
    assert legend_labels(fig) == FIGURE_ORDER
    assert line_colours(ax) == TAB10
    mqa = ax.get_lines()[FIGURE_ORDER.index("MQA")]
    assert list(mqa.get_ydata()) == pytest.approx([1 + 0.6 * t / 100 for t in contexts])


def test_save_figure_creates_its_folder_and_lists_the_png_and_with_svg_the_svg(tmp_path):
    figure = Figure()
    figure.add_subplot().plot([0, 1])
    manifest = Manifest.claim(tmp_path, "figures.json", "a figures folder")
    path = plots.save_figure(figure, manifest, "a/b/empty")
    assert path == tmp_path / "a" / "b" / "empty.png" and path.stat().st_size > 0
    assert manifest.read_bytes("a/b/empty.png") == path.read_bytes()
    assert set(manifest.files) == set(plots.figure_files("a/b/empty")) == {"a/b/empty.png"}
    assert not (tmp_path / "a" / "b" / "empty.svg").exists()
    assert plots.save_figure(figure, manifest, "a/b/empty", svg=True) == path
    assert (tmp_path / "a" / "b" / "empty.svg").stat().st_size > 0
    assert set(manifest.files) == set(plots.figure_files("a/b/empty", svg=True)) == {"a/b/empty.png", "a/b/empty.svg"}
