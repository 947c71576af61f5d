"""The behaviour view's effective rank, pairing attention maps with the
QK circuit, and the report sentences on diversity through training and on whether the measures
agree, generated from synthetic statistics where each claim must appear and must vanish."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon
from scipy.stats import spearmanr

from headlab.analysis.measures import behaviour_summary, measure_agreement, spearman
from headlab.analysis.spectrum import clipped_spectrum, similarity_spectrum
from headlab.report import plots
from headlab.study.claims import compensation_onset, measure_claims, per_step_metrics, training_claims

ROLES = {"mha": "Standard MHA", "mqa": "MQA", "lrkv-small": "LRKV (r=4)"}


def _js_similarity(rng, heads=6, positions=20, keys=9) -> np.ndarray:
    p = rng.dirichlet(np.full(keys, 0.3), size=(heads, positions))
    distance = np.array([[jensenshannon(p[i], p[j], base=2, axis=-1).mean() for j in range(heads)]
                         for i in range(heads)])
    return 1 - distance


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-1e3, 1e3)), min_size=3, max_size=30))
def test_spearman_is_scipys_with_tied_ranks(pairs):
    """Few distinct values on one side, so most draws hold ties: each gets its average rank."""
    a, b = (pd.Series([float(pair[i]) for pair in pairs]) for i in (0, 1))
    if a.nunique() < 2 or b.nunique() < 2:
        return
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)


def test_behaviour_similarity_centered_is_psd_and_negative_eigenvalues_are_clipped_and_reported():
    rng = np.random.default_rng(0)
    for _ in range(20):  # the mean JS distance is conditionally negative definite: J S J ⪰ 0
        s = _js_similarity(rng)
        spectrum, negative = clipped_spectrum(s, "centered")
        assert negative < 1e-12
        assert spectrum.effective_rank == pytest.approx(similarity_spectrum(s, "centered").effective_rank)
    indefinite = np.array([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]])  # eigenvalues 2.17, 1.73, -0.9
    values = np.linalg.eigvalsh(indefinite)
    spectrum, negative = clipped_spectrum(indefinite, "uncentered")
    assert negative == pytest.approx(-values[0] / np.abs(values).sum())
    assert np.array_equal(spectrum.eigenvalues, np.clip(values[::-1], 0, None))
    kept = values[values > 0] / values[values > 0].sum()
    assert spectrum.effective_rank == pytest.approx(np.exp(-(kept * np.log(kept)).sum()))
    with pytest.raises(ValueError, match="not positive semi-definite"):
        similarity_spectrum(indefinite, "uncentered")  # why the weight views' path cannot take it


def test_behaviour_summary_reads_the_similarity_table_per_layer():
    rng = np.random.default_rng(1)
    matrices = [_js_similarity(rng, heads=4) for _ in range(2)]
    table = pd.DataFrame([{"model": "m", "layer": layer, "circuit": "pattern", "measure": "jensen_shannon",
                           "mla_rope": "n/a", "head_i": i, "head_j": j, "value": m[i, j]}
                          for layer, m in enumerate(matrices) for i in range(4) for j in range(4)])
    summary = behaviour_summary(table)
    assert len(summary) == 4 and set(summary["circuit"]) == {"pattern"}
    row = summary.query("layer == 1 and kind == 'centered'").iloc[0]
    assert row["effective_rank"] == pytest.approx(clipped_spectrum(matrices[1], "centered")[0].effective_rank)


def test_measure_agreement_pairs_attention_maps_with_the_qk_circuit_by_convention():
    rows = []
    for seed in range(2):
        for layer in range(3):
            rank = layer + 10 * seed
            rows += [{"model": "m", "circuit": "qk", "measure": "frobenius", "kind": "centered", "layer": layer,
                      "seed": seed, "effective_rank": rank},
                     {"model": "m", "circuit": "pattern", "measure": "jensen_shannon", "kind": "centered",
                      "layer": layer, "seed": seed, "effective_rank": -rank}]
    summary = pd.DataFrame(rows)
    assert measure_agreement(summary).empty  # different circuits: nothing to pair by default
    paired = measure_agreement(summary, pair_pattern_with="qk").iloc[0]
    assert (paired["circuit"], paired["measure_a"], paired["measure_b"]) == ("qk", "frobenius", "jensen_shannon")
    assert paired["n_points"] == 6 and paired["spearman"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="circuit = 'pattern' is invalid"):
        measure_agreement(summary, pair_pattern_with="pattern")


def _ranks(weights_gap: float, behaviour_gap: float, noise: float, seeds: int = 3) -> pd.DataFrame:
    """Layer-mean ranks per seed: MQA − MHA is `weights_gap` under frobenius and data and
    `behaviour_gap` in behaviour, plus ±`noise` alternating by seed; LRKV equals MHA."""
    rows = []
    for seed in range(seeds):
        wobble = noise * (-1) ** seed
        for measure, gap in (("frobenius", weights_gap), ("data", weights_gap), ("jensen_shannon", behaviour_gap)):
            for kind in ("uncentered", "centered"):
                base = 80.0 + seed
                for role, value in (("mha", base), ("mqa", base + gap + wobble), ("lrkv-small", base + wobble)):
                    rows.append({"role": role, "model": ROLES[role], "measure": measure, "kind": kind,
                                 "seed": seed, "rank": value})
    return pd.DataFrame(rows)


def test_measure_claims_say_where_the_weight_ordering_holds_up_in_behaviour():
    holds = measure_claims(_ranks(weights_gap=-10.0, behaviour_gap=-8.0, noise=0.5))
    mqa = [s for s in holds if s.startswith("MQA, uncentered")]
    assert len(mqa) == 1 and "weights lower by 9.8 ± " in mqa[0]
    assert "behaviour (attention maps): lower by 7.8 ± " in mqa[0] and mqa[0].endswith("holds up.")
    reversed_ = measure_claims(_ranks(weights_gap=-10.0, behaviour_gap=6.0, noise=0.5))
    assert any("behaviour (attention maps): higher by" in s and "reversed" in s for s in reversed_)
    noisy = measure_claims(_ranks(weights_gap=-10.0, behaviour_gap=0.0, noise=3.0))
    assert any("behaviour (attention maps): undecided at ±3 (" in s and "not confirmed" in s for s in noisy)
    nothing = measure_claims(_ranks(weights_gap=0.0, behaviour_gap=-8.0, noise=3.0))
    assert not any(s.startswith("MQA, ") for s in nothing)  # no weight-space ordering, nothing to test
    assert nothing[-1].startswith("No weight-space ordering") and "MQA (uncentered)" in nothing[-1]
    assert measure_claims(_ranks(-10.0, -8.0, 0.5, seeds=1)) == [
        "One seed: no orderings claimed, so no weight-space conclusion is tested."]


def _snapshot_summary(onset: int | None, lrkv_departs: int | None, seeds: int = 3,
                      mqa_noise: float = 0.0) -> pd.DataFrame:
    """Summary rows over steps: MQA's centered rank rises by 6 points over MHA's from `onset` on;
    LRKV's uncentered rank drops by 8 from `lrkv_departs` on; ±0.3 seed noise, and ±`mqa_noise`
    on MQA's centered rank (a positive mean gap, within seed noise and the ±3-point margin)."""
    rows = []
    for seed in range(seeds):
        for step in (0, 1, 2, 4, 8, 10, 20):
            for role in ROLES:
                for layer in range(2):
                    for kind in ("uncentered", "centered"):
                        rank = 70.0 + 0.3 * (-1) ** (seed + layer) + step / 10
                        if role == "mqa" and kind == "centered":
                            rank += mqa_noise * (-1) ** seed + (6 if onset is not None and step >= onset else 0)
                        if role == "lrkv-small" and kind == "uncentered" and lrkv_departs is not None \
                                and step >= lrkv_departs:
                            rank -= 8
                        rows.append({"model": ROLES[role], "role": role, "seed": seed, "step": step, "layer": layer,
                                     "circuit": "qk", "mla_rope": "included", "kind": kind,
                                     "effective_rank_pct_of_heads": rank,
                                     "effective_rank": rank / 100 * 6})
    return pd.DataFrame(rows)


def test_through_training_claims_state_the_onset_and_tracking_only_beyond_the_margin():
    metrics = per_step_metrics(_snapshot_summary(onset=8, lrkv_departs=None))
    step, d = compensation_onset(metrics)
    assert step == 8 and d.mean == pytest.approx(6.0)
    sentences = training_claims(metrics)
    assert any(s.startswith("Query compensation: MQA's centering gap first exceeds MHA's beyond the ±3-point margin "
                            "at step 8 (by 6.00 ± ") and "at 3 of the 3 snapshot steps" in s for s in sentences)
    assert "LRKV (r=4) tracks Standard MHA from the start" in " ".join(sentences)

    never = training_claims(per_step_metrics(_snapshot_summary(onset=None, lrkv_departs=4, mqa_noise=2.0)))
    assert any(s.startswith("Query compensation: MQA's centering gap exceeds MHA's beyond the ±3-point margin at "
                            "none of the 7 snapshot steps") for s in never)
    assert any(s.startswith("LRKV (r=4) departs from Standard MHA beyond the ±3-point margin first at step 4 "
                            "(uncentered effective rank -8.00 ± ") for s in never)
    assert not any("tracks" in s for s in never)
    assert training_claims(per_step_metrics(_snapshot_summary(8, 4, seeds=1))) == [
        "One seed: no onset and no ordering through training claimed."]


def test_the_two_figures_draw_every_method_and_refuse_a_missing_column():
    summary = _snapshot_summary(onset=8, lrkv_departs=4).drop(columns="role")
    figure = plots.rank_through_training_figure(summary, kind="centered")
    assert len(figure.axes) == 2 and figure.axes[0].get_xscale() == "symlog"
    assert "3 seeds" in figure._suptitle.get_text()
    with pytest.raises(ValueError, match="missing column"):
        plots.rank_through_training_figure(summary.drop(columns="step"))
    measures = pd.concat([summary[summary["step"] == 20].drop(columns="step").assign(measure=m)
                          for m in ("frobenius", "data", "jensen_shannon")])
    figure = plots.measures_figure(measures, kind="uncentered")
    assert [ax.get_title() for ax in figure.axes[:3]] == [plots.MEASURE_TITLES[m] for m in
                                                         ("frobenius", "data", "jensen_shannon")]
    with pytest.raises(ValueError, match="measures = \\['cosine'\\] is invalid"):
        plots.measures_figure(measures, measures=["cosine"])


@pytest.mark.parametrize("measurement", ["input_moments", "attention_similarity", "norm_scale_effect"])
def test_every_forward_measurement_runs_where_the_model_lives(measurement):
    """A study's models stay on the device they trained on (a GPU after `reproduce` there) while
    its token windows are CPU tensors, so each measurement must move the tokens to the model. The
    meta device stands in for a GPU here: the model's forward must see meta tokens (whatever the
    meta tensors do after that is not measured)."""
    import contextlib

    import torch

    from headlab.analysis import attention_maps, inputs, qk_norm
    from shared_fixtures import tiny_model

    model = tiny_model("mha").to("meta")
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].device.type))
    measure = next(getattr(module, measurement) for module in (inputs, attention_maps, qk_norm)
                   if hasattr(module, measurement))
    with contextlib.suppress(Exception):
        measure(model, torch.zeros(2, 8, dtype=torch.long))
    assert seen and set(seen) == {"meta"}, seen
