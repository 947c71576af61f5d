"""The real checkpoints' tables shipped in the package (`headlab.study.real_tables`, written by
science/real_checkpoints.py): verified on read, whole (every layer of the three models, trained and
random), in agreement with the independent float64 recomputation they carry, and what notebook 05
and the page read from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib

from headlab.analysis.candidates import INPUT_CANDIDATES, WEIGHT_CANDIDATES
from headlab.study.real_tables import PANELS, REAL_TABLES, VIEWS, panel_first_eigenvalues, read_real_tables
from headlab.study.seed_distance import at_seed_heads

LAYERS = {"SmolLM2-135M-Instruct": (30, 9), "Gemma 3 270M": (18, 4), "all-MiniLM-L6-v2": (6, 12)}


@pytest.fixture(scope="module")
def tables():
    return read_real_tables()


def test_the_shipped_tables_hold_every_layer_view_and_state(tables):
    summary = tables["summary"]
    assert set(tables["models"]["model"]) == set(LAYERS)
    for model, (n_layers, n_heads) in LAYERS.items():
        here = summary[summary["model"] == model]
        assert sorted(here["layer"].unique()) == list(range(n_layers)) and set(here["n_heads"]) == {n_heads}
        trained = here[here["state"] == "trained"]
        assert set(trained["measure"]) == set(WEIGHT_CANDIDATES + INPUT_CANDIDATES)
        assert set(here[here["state"] == "gaussian"]["measure"]) == set(trained["measure"]) - {"attention maps"}
        spectra = tables["spectra"][tables["spectra"]["model"] == model]
        assert set(spectra["panel"]) == set(PANELS)
        sums = spectra[(spectra["kind"] == "uncentered") & (spectra["measure"] != "attention maps")].groupby(
            ["panel", "measure", "state", "draw"])["eigenvalue"].sum()
        np.testing.assert_allclose(sums, n_heads, atol=1e-5)  # every candidate's trace is H


def test_the_numbers_agree_with_the_independent_recomputation(tables):
    check = tables["check"]
    assert set(check["model"]) == set(LAYERS) and set(check["measure"]) == {"weights", "data-aware"}
    weights = check[check["measure"] == "weights"]
    assert weights["difference"].abs().max() < 1e-9  # both in float64 from the same dequantised values
    assert check["difference"].abs().max() < 1e-4  # the data-aware view: the model runs in float32
    summary = tables["summary"]
    for row in weights[weights["quantity"] == "lambda1"].itertuples():
        shipped = summary[(summary["model"] == row.model) & (summary["layer"] == row.layer)
                          & (summary["measure"] == "weights") & (summary["state"] == "trained")
                          & (summary["kind"] == "uncentered")]["lambda1"].item()
        assert shipped == pytest.approx(row.independent, abs=1e-6)  # the shipped value, rounded to 7 decimals


def test_panel_first_eigenvalues_set_every_model_beside_its_familys_seed_curve(tables):
    first = panel_first_eigenvalues(tables)
    assert len(first) == len(LAYERS) * len(PANELS) * len(VIEWS)
    for _, row in first.iterrows():
        assert row["H"] == LAYERS[row["model"]][1]
        assert row["λ₁ at six heads"] == pytest.approx(at_seed_heads(row["λ₁"], row["H"]))
    gemma = first[(first["model"] == "Gemma 3 270M") & (first["panel"] == "Early")]
    assert set(gemma["seed figure λ₁, sum 6 (read)"]) == {"4.57 (4.0)"}  # MQA's curve at L = 0


def test_the_tables_are_package_data():
    assert (REAL_TABLES / "real_checkpoints.json").is_file()
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "real_tables/*.csv" in pyproject["tool"]["setuptools"]["package-data"]["headlab.study"]


def test_the_figure_draws_each_model_three_ways_in_every_panel(tables):
    from headlab.report.plots import real_checkpoint_spectra

    fig = real_checkpoint_spectra(tables["spectra"], tables["models"])
    axes = fig.axes
    assert len(axes) == len(VIEWS) * len(PANELS)
    for ax in axes:
        assert len(ax.get_lines()) == 3 * len(LAYERS) + 1  # trained, random, seed per model; the line at 1
