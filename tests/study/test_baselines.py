"""The baselines a study's numbers are shown against: the random initialisation (init_spectra,
init_summary: every run's step-0 weights, from its snapshot or its config and seed) and the seed
figure (the paper's Fig. 11 at 128M, `SEED_SPECTRA`) with the distance of a spectrum to it."""

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from headlab import load_corpus, train, train_preset
from headlab.analysis.similarity import analyze
from headlab.model.gpt import GPT
from headlab.runs.snapshots import attention_tensors, snapshot_files
from headlab.schema import COLUMNS, MLA_ROPE, ROLES
from headlab.study import tables as tables_module
from headlab.study.paper import PAPER_PANELS, SEED_HEADS, SEED_SPECTRA
from headlab.study.roles import comparison_roles
from headlab.study.seed_distance import normalised_l1, seed_distance
from headlab.study.study import StudyRun
from headlab.study.table_files import SHIPPED, read_study_tables
from headlab.study.tables import init_tables
from headlab.training.trainer import initial_model

TINY = comparison_roles("tiny")
PROPERTY_RUNS = settings(max_examples=200, derandomize=bool(os.environ.get("CI")), deadline=None)


def independent_step0(config, seed: int, label: str, mla_rope: str):
    """The step-0 analysis built here, without headlab's init code: the global generator seeded, a GPT drawn."""
    torch.manual_seed(seed)
    return analyze(GPT(config), label=label, mla_rope=mla_rope)


# ---- the random-initialisation baseline -----------------------------------------------------------

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> StudyRun:
    """A tiny GQA run of seed 3 with a snapshot at every step (step 0 among them)."""
    folder = tmp_path_factory.mktemp("baseline") / "run"
    recipe = train_preset("tiny", seed=3, steps=3, batch_size=4, eval_every=3, eval_batches=1, checkpoint_every=3,
                          log_every=3, snapshot_every=1)
    train(TINY["gqa"], recipe, load_corpus("synthetic", n_chars=20_000), out=folder, progress=False)
    return StudyRun("gqa", TINY["gqa"], 3, folder)


def test_initial_model_is_the_step0_snapshot_a_run_keeps(trained_run):
    snapshot = snapshot_files(trained_run.folder)[0]
    kept, drawn = load_file(snapshot), attention_tensors(initial_model(trained_run.config, trained_run.seed))
    assert kept.keys() == drawn.keys() and all(torch.equal(kept[name], drawn[name]) for name in kept)
    trained = trained_run.run.model.state_dict()
    assert not torch.equal(trained["blocks.0.attn.c_q.weight"], kept["blocks.0.attn.c_q.weight"])  # it trained


def test_init_tables_read_the_snapshot_and_the_rebuilt_draw_alike(trained_run, tmp_path, monkeypatch):
    with monkeypatch.context() as patched:  # a run that kept its step-0 snapshot is read from it, never redrawn
        patched.setattr(tables_module, "initial_model", lambda *args: pytest.fail("redrew a run that has a snapshot"))
        from_snapshot = init_tables([trained_run])
    rebuilt = init_tables([StudyRun("gqa", trained_run.config, 3, tmp_path / "no-such-run")])
    for name, table in from_snapshot.items():
        pd.testing.assert_frame_equal(table, rebuilt[name], rtol=1e-12, atol=1e-12)


def test_init_tables_equal_an_independently_built_step0_model():
    runs = [StudyRun(role, config, seed, Path("/nonexistent/headlab-run"))
            for seed in (0, 1) for role, config in TINY.items()]
    tables = init_tables(runs)
    assert list(tables) == ["init_spectra", "init_summary"]
    for name, columns in (("init_spectra", COLUMNS["spectra"]), ("init_summary", COLUMNS["summary"])):
        table = tables[name]
        assert list(table.columns) == [*columns, "seed", "role"]
        assert set(table["circuit"]) == {"qk"} and set(table["mla_rope"]) == set(MLA_ROPE)
        assert set(table["role"]) == set(ROLES) and set(table["seed"]) == {0, 1}
    for run in runs:
        for mla_rope in MLA_ROPE:
            expected = independent_step0(run.config, run.seed, run.label, mla_rope).spectra
            ours = tables["init_spectra"]
            ours = ours[(ours["model"] == run.label) & (ours["seed"] == run.seed) & (ours["mla_rope"] == mla_rope)]
            assert (ours["role"] == run.role).all()
            np.testing.assert_allclose(ours["eigenvalue"].to_numpy(), expected["eigenvalue"].to_numpy(), atol=1e-12)


def test_the_shipped_init_tables_are_the_demo_runs_step0_weights():
    """The shipped init_summary equals the step-0 rows the demo runs' own snapshots gave, and its
    spectra the independent draw of one run's config and seed."""
    shipped = read_study_tables(SHIPPED)
    init, snapshots = shipped["init_summary"], shipped["snapshot_summary"]
    keys = ["model", "layer", "circuit", "measure", "mla_rope", "kind", "seed"]
    paired = init.merge(snapshots[snapshots["step"] == 0], on=keys, suffixes=("", "_snapshot"), validate="one_to_one")
    assert len(paired) == len(init) == len(snapshots[snapshots["step"] == 0]) > 0
    np.testing.assert_allclose(paired["effective_rank"], paired["effective_rank_snapshot"], rtol=0, atol=1e-8)
    config = comparison_roles(shipped.meta["preset"])["mqa"]
    expected = independent_step0(config, 2, config.label, "included").spectra
    spectra = shipped["init_spectra"]
    ours = spectra[(spectra["role"] == "mqa") & (spectra["seed"] == 2) & (spectra["mla_rope"] == "included")]
    np.testing.assert_allclose(ours["eigenvalue"].to_numpy(), expected["eigenvalue"].to_numpy(), atol=1e-9)


# ---- the seed figure and the distance to it -------------------------------------------------------

def test_the_seed_figure_has_a_declining_curve_per_role_and_panel():
    assert list(SEED_SPECTRA) == list(ROLES) and list(PAPER_PANELS.values()) == [0, 6, 11]
    for role, panels in SEED_SPECTRA.items():
        assert list(panels) == list(PAPER_PANELS), role
        for curve in panels.values():
            values = curve.eigenvalues()
            assert len(values) == SEED_HEADS
            assert (values[0], values[1], values[-1]) == (curve.first, curve.second, curve.last)
            assert all(a >= b for a, b in zip(values, values[1:])) and values[0] > values[1]  # a dominant λ₁


spectra_values = st.lists(st.floats(0.01, 10.0), min_size=2, max_size=8)


@PROPERTY_RUNS
@given(spectra_values, st.floats(0.1, 10.0))
def test_normalised_l1_compares_shapes_not_scales(values, scale):
    assert normalised_l1(values, [scale * v for v in values]) == pytest.approx(0.0, abs=1e-12)


@PROPERTY_RUNS
@given(st.integers(2, 8).flatmap(lambda n: st.tuples(*[st.lists(st.floats(0.01, 10.0), min_size=n, max_size=n)] * 2)))
def test_normalised_l1_is_a_symmetric_distance_of_at_most_two(pair):
    a, b = pair
    assert normalised_l1(a, b) == pytest.approx(normalised_l1(b, a))
    assert 0.0 <= normalised_l1(a, b) <= 2.0 + 1e-12
    p, q = np.asarray(a) / sum(a), np.asarray(b) / sum(b)
    assert normalised_l1(a, b) == pytest.approx(float(np.abs(p - q).sum()))


def test_normalised_l1_of_spectra_of_different_lengths_is_undefined():
    assert math.isnan(normalised_l1([3.0, 2.0, 1.0], [4.0, 1.0]))
    assert normalised_l1([2.0, 0.0], [0.0, 2.0]) == pytest.approx(2.0)  # disjoint shapes: the largest distance


def test_seed_distance_rows_per_role_panel_state_and_seed():
    """Two panels of one MHA run, trained and at init: λ₁ is read at index 1 of its own panel's layer,
    d₁ is against that panel's seed curve, and the other circuit, kind and mla_rope are ignored."""
    def rows(layer, eigenvalues, seed=0, **columns):
        base = {"model": "Standard MHA", "role": "mha", "layer": layer, "circuit": "qk", "kind": "uncentered",
                "mla_rope": "included", "measure": "frobenius", "seed": seed}
        return pd.DataFrame([{**base, **columns, "index": i + 1, "eigenvalue": v} for i, v in enumerate(eigenvalues)])

    flat = [1.0] * 6
    early = [2.5, 1.0, 0.8, 0.7, 0.6, 0.4]
    trained = pd.concat([rows(0, early), rows(3, flat), rows(0, flat, circuit="ov"), rows(0, flat, kind="centered"),
                         rows(0, flat, mla_rope="excluded")], ignore_index=True)
    init = pd.concat([rows(0, flat), rows(3, flat)], ignore_index=True)
    table = seed_distance(trained, init, {"Early": 0, "Late": 3}, "included")
    assert len(table) == 4
    got = table.set_index(["panel", "state"])
    assert got.loc[("Early", "trained"), "first_eigenvalue"] == 2.5
    assert got.loc[("Early", "init"), "first_eigenvalue"] == 1.0
    assert got.loc[("Late", "trained"), "paper_layer"] == 11
    for panel, state, values in (("Early", "trained", early), ("Early", "init", flat), ("Late", "init", flat)):
        seed_curve = SEED_SPECTRA["mha"][panel]
        assert got.loc[(panel, state), "seed_first_eigenvalue"] == seed_curve.first
        assert got.loc[(panel, state), "l1_to_seed"] == pytest.approx(normalised_l1(values, seed_curve.eigenvalues()))
