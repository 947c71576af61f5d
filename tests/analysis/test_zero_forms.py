"""Scale and zero forms (issue 39, class 3): a cosine does not see a positive factor per head, so
weights stored at any finite scale, per head or per layer, must give the tables of scale 1 (no
underflow to rank 0, no overflow to "not symmetric"); and a head, layer or model whose forms are
zero has an undefined similarity: NaN in every table, never a number, left out of the means with
a count, and named in what `headlab analyze` prints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headlab.analysis.gram import DEAD_HEAD_RTOL, Factors, normalised_gram
from headlab.analysis.layer_weights import GroupedWeights, ModelHeads
from headlab.analysis.similarity import Analysis, analyze
from headlab.analysis.spectrum import cosine_similarity
from headlab.analysis.zero_forms import dead_heads, zero_form_note
from headlab.cli.main import main as cli_main
from headlab.report.analysis_output import layer_table as format_effective_ranks
from headlab.schema import KINDS, SPECTRUM_METRICS
from shared_fixtures import tiny_model, write_run

H, D, E, LAYERS = 4, 12, 3, 2
METRICS = [*SPECTRUM_METRICS, "mean_offdiag_similarity"]
seeds = st.integers(0, 2 ** 32 - 1)
exponents = st.floats(-300, 300)  # scales 10^x: 1e-300 … 1e300


def _layers(seed: int, groups: int = H) -> list[dict[str, np.ndarray]]:
    """LAYERS random MHA (groups = H), GQA or MQA (groups = 1) layers in PyTorch's layout."""
    rng = np.random.default_rng(seed)
    return [{"wq": rng.standard_normal((H * E, D)), "wk": rng.standard_normal((groups * E, D)),
             "wv": rng.standard_normal((groups * E, D)), "wo": rng.standard_normal((D, H * E))}
            for _ in range(LAYERS)]


def _analysis(layers: list[dict[str, np.ndarray]]) -> Analysis:
    heads = ModelHeads("toy", "headlab-gqa", len(layers), H, lambda i: GroupedWeights(**layers[i], n_heads=H))
    return analyze(heads, circuit="both")


def _scaled(layers, scales) -> list[dict[str, np.ndarray]]:
    """Each weight's rows (columns for wo) of head or KV group g multiplied by scales[layer][name][g]."""
    out = []
    for layer, per_name in zip(layers, scales):
        scaled = {}
        for name, w in layer.items():
            blocks = w.shape[1] // E if name == "wo" else w.shape[0] // E
            factor = np.repeat(np.broadcast_to(per_name[name], (blocks,)), E)
            scaled[name] = w * factor[None, :] if name == "wo" else w * factor[:, None]
        out.append(scaled)
    return out


def _assert_same_tables(ours: Analysis, reference: Analysis, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    for name in ("similarity", "spectra", "summary"):
        a, b = getattr(ours, name), getattr(reference, name)
        numbers = a.select_dtypes("number").columns
        np.testing.assert_allclose(a[numbers].to_numpy(float), b[numbers].to_numpy(float), rtol=rtol, atol=atol,
                                   err_msg=name)


# ---- any finite scale is scale 1 ---------------------------------------------------------------

@given(seed=seeds, groups=st.sampled_from([H, 2, 1]), data=st.data())
def test_any_finite_scale_per_head_gives_the_tables_of_scale_one(seed, groups, data):
    layers = _layers(seed, groups)
    scales = [{name: 10.0 ** np.array(data.draw(st.lists(exponents, min_size=n, max_size=n), label=name))
               for name, n in (("wq", H), ("wk", groups), ("wv", groups), ("wo", H))} for _ in layers]
    _assert_same_tables(_analysis(_scaled(layers, scales)), _analysis(layers))


@given(seed=seeds, layer_exponents=st.lists(exponents, min_size=LAYERS, max_size=LAYERS))
def test_any_finite_scale_per_layer_gives_the_tables_of_scale_one(seed, layer_exponents):
    layers = _layers(seed)
    scales = [dict.fromkeys(("wq", "wk", "wv", "wo"), 10.0 ** x) for x in layer_exponents]
    _assert_same_tables(_analysis(_scaled(layers, scales)), _analysis(layers))


@given(seed=seeds, powers=st.lists(st.integers(-990, 1000), min_size=LAYERS, max_size=LAYERS))
def test_a_power_of_two_scale_gives_exactly_the_tables_of_scale_one(seed, powers):
    """A power of two only changes exponents, and normalising removes it: not close, equal. The
    norms are not scale-free, but exactly scaled: 2^k times those of scale 1, never inf or 0."""
    layers = _layers(seed)
    scales = [dict.fromkeys(("wq", "wk", "wv", "wo"), 2.0 ** k) for k in powers]
    ours, reference = _analysis(_scaled(layers, scales)), _analysis(layers)
    _assert_same_tables(ours, reference, rtol=0.0, atol=0.0)
    exponents = np.array(powers)[reference.norms["layer"]]
    np.testing.assert_array_equal(ours.norms["frobenius_norm"], np.ldexp(reference.norms["frobenius_norm"], exponents))


@given(seed=seeds, base_exponent=exponents, root_exponents=st.lists(exponents, min_size=2, max_size=2),
       head_exponents=st.lists(exponents, min_size=2 * H, max_size=2 * H),
       method=st.sampled_from(["products", "reduced"]))
def test_scaled_latent_factors_and_input_moments_give_the_similarity_of_scale_one(
        seed, base_exponent, root_exponents, head_exponents, method):
    """Both routes of the Gram, a shared base narrower than d (MLA's latent), and the data measure's
    roots: scaling the base, each head's block or a root changes no cosine."""
    rng = np.random.default_rng(seed)
    m = 5
    base, latent = rng.standard_normal((D, m)), rng.standard_normal((m, H * E))
    queries = rng.standard_normal((D, H * E))
    roots = [rng.standard_normal((D, D)) for _ in range(2)]
    per_head = np.repeat(10.0 ** np.array(head_exponents), E)

    def similarity(base_scale, block_scales, root_scales):
        left = Factors.per_head(queries * block_scales[:H * E], E)
        right = Factors.per_head(latent * block_scales[H * E:], E, base=base * base_scale)
        return cosine_similarity(*normalised_gram(left, right, *(r * s for r, s in zip(roots, root_scales)), method))

    reference = similarity(1.0, np.ones(2 * H * E), (1.0, 1.0))
    scaled = similarity(10.0 ** base_exponent, per_head, 10.0 ** np.array(root_exponents))
    assert np.isfinite(reference).all()
    np.testing.assert_allclose(scaled, reference, rtol=1e-9, atol=1e-12)


# ---- zero forms: NaN, counted, named ------------------------------------------------------------

def _matrix(similarity, layer: int, circuit: str = "qk") -> np.ndarray:
    rows = similarity[(similarity["layer"] == layer) & (similarity["circuit"] == circuit)]
    return rows.pivot(index="head_i", columns="head_j", values="value").to_numpy()


@given(seed=seeds, dead=st.lists(st.booleans(), min_size=H, max_size=H), side=st.sampled_from(["wq", "wk"]),
       exponent=exponents)
def test_dead_heads_are_nan_and_left_out_of_their_layers_spectrum(seed, dead, side, exponent):
    """Zeroing some heads' queries or keys in layer 0 (the rest of the model at any scale): their
    similarity rows are NaN; the spectrum is the live heads' own (then NaN); the percentages are
    of H; with no live head, every number of the layer is NaN and the layer is named."""
    layers = _scaled(_layers(seed), [dict.fromkeys(("wq", "wk", "wv", "wo"), 10.0 ** exponent)] * LAYERS)
    dead = np.array(dead)
    layers[0][side] = layers[0][side] * np.repeat(~dead, E)[:, None]
    result = _analysis(layers)
    live = ~dead
    g = _matrix(result.similarity, 0)
    assert np.isnan(g[dead]).all() and np.isnan(g[:, dead]).all()
    block = g[np.ix_(live, live)]
    assert np.isfinite(block).all() and np.allclose(np.diag(block), 1.0)
    summary = result.summary[(result.summary["layer"] == 0) & (result.summary["circuit"] == "qk")].set_index("kind")
    spectra = result.spectra[(result.spectra["layer"] == 0) & (result.spectra["circuit"] == "qk")]
    for kind in KINDS:
        expected = np.zeros(0)
        if live.any():
            centred = block - block.mean(0) - block.mean(1)[:, None] + block.mean() if kind == "centered" else block
            expected = np.sort(np.linalg.eigvalsh(centred))[::-1]
        eigenvalues = spectra[spectra["kind"] == kind].sort_values("index")["eigenvalue"].to_numpy()
        np.testing.assert_allclose(eigenvalues[:live.sum()], expected, atol=1e-9)
        assert np.isnan(eigenvalues[live.sum():]).all()
        row = summary.loc[kind]
        if live.any():
            v = expected[expected > 1e-9] / expected[expected > 1e-9].sum()
            rank = np.exp(-(v * np.log(v)).sum()) if v.size else 0.0
            assert row["effective_rank"] == pytest.approx(rank)
            assert row["effective_rank_pct_of_heads"] == pytest.approx(100 * rank / H)  # of H: dead heads add nothing
        else:
            assert row[METRICS].isna().all()  # no circuit: never a number
            assert np.isnan(spectra[["eigenvalue", "variance_ratio", "cumulative"]].to_numpy()[:2 * H]).all()
    # the other layer and the other circuit are untouched
    assert np.isfinite(_matrix(result.similarity, 1)).all() and np.isfinite(_matrix(result.similarity, 0, "ov")).all()
    note = zero_form_note(result.similarity)
    heads = ", ".join(map(str, np.flatnonzero(dead)))
    if not dead.any():
        assert note is None
    elif not live.any():
        assert "no circuit" in note and "toy qk layer 0 (1 of 2 layers)" in note and "dead heads" not in note
    else:
        assert "no circuit" not in note and f"toy qk layer 0 head{'s' * int(dead.sum() > 1)} {heads}." in note


@given(seed=seeds, exponent=exponents, head=st.integers(0, H - 1), c=st.floats(0.1, 10))
def test_a_form_that_cancels_to_zero_is_dead_at_any_scale(seed, exponent, head, c):
    """L_h = [a, c·a], R_h = [c·b, −b]: both factors nonzero, A_h = c abᵀ − c abᵀ = 0, computed
    as a round-off residue. Dead by the rule ‖A_h‖ ≤ DEAD_HEAD_RTOL ‖L_h‖ ‖R_h‖, however large or
    small the factors are stored."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((D, H * E)), rng.standard_normal((D, H * E))
    a, b = rng.standard_normal(D), rng.standard_normal(D)
    q[:, head * E:(head + 1) * E] = np.stack([a, c * a, np.zeros(D)], axis=1)
    k[:, head * E:(head + 1) * E] = np.stack([c * b, -b, np.zeros(D)], axis=1)
    gram, live = normalised_gram(Factors.per_head(q * 10.0 ** exponent, E), Factors.per_head(k, E))
    assert list(np.flatnonzero(~live)) == [head]
    assert DEAD_HEAD_RTOL < 1e-3  # a real head's form is ~‖L‖‖R‖/√e: far from dead


def test_a_layer_without_a_circuit_is_left_out_of_the_mean_with_a_count_and_named(tmp_path):
    """The issue's case: W_Q of one layer all zero. Its row is 'undefined', not '0.00 (0.0%)'; the
    mean is over the other layers, says so, and the note names the layer; NaN survives save/load."""
    layers = _layers(0)
    layers[1]["wq"] = np.zeros_like(layers[1]["wq"])
    result = _analysis(layers)
    printed = format_effective_ranks(result.summary[result.summary["circuit"] == "qk"])
    layer_0 = result.summary.query("layer == 0 and circuit == 'qk' and kind == 'uncentered'")
    assert "    1  undefined: no qk circuit" in printed and "0.00 (0.0%)" not in printed
    assert f" mean  {layer_0['effective_rank'].iloc[0]:.2f}" in printed
    assert "over 1 of 2 layers (1 undefined left out)" in printed
    assert zero_form_note(result.similarity).startswith("Undefined, no circuit, as every head's form is zero")
    assert "toy qk layer 1 (1 of 2 layers)" in zero_form_note(result.similarity)
    loaded = Analysis.load(result.save(tmp_path / "analysis"))
    assert loaded.summary.query("layer == 1 and circuit == 'qk'")[METRICS].isna().all().all()


def test_an_all_zero_model_has_no_number_at_all():
    layers = [{name: np.zeros_like(w) for name, w in layer.items()} for layer in _layers(0)]
    result = _analysis(layers)
    for name, columns in (("similarity", ["value"]), ("spectra", ["eigenvalue", "variance_ratio", "cumulative"]),
                          ("summary", METRICS)):
        assert getattr(result, name)[columns].isna().all().all(), name
    printed = format_effective_ranks(result.summary)
    assert printed.count("undefined: no") == 2 * (LAYERS + 1)  # every layer and the mean, both circuits
    assert printed.count("over 0 of 2 layers (2 undefined left out)") == 2
    assert set(dead_heads(result.similarity)["dead"]) == {tuple(range(H))}
    note = zero_form_note(result.similarity)
    assert "toy qk layer 0, 1 (2 of 2 layers)" in note and "toy ov layer 0, 1 (2 of 2 layers)" in note


def test_headlab_analyze_prints_the_undefined_layer_and_the_dead_head(tmp_path, capsys):
    """The issue's command: a run whose layer 1 has W_Q = 0 and whose layer 0 has one dead head."""
    model = tiny_model("mha")
    e = model.config.head_dim
    with torch.no_grad():
        model.blocks[1].attn.c_q.weight.zero_()
        model.blocks[0].attn.c_k.weight[e:2 * e] = 0.0
    assert cli_main(["analyze", str(write_run(tmp_path / "run", model)), "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "    1  undefined: no qk circuit" in printed and "over 1 of 2 layers (1 undefined left out)" in printed
    assert ("Standard MHA qk layer 1 (1 of 2 layers); and dead heads, whose form is zero (similarity NaN; left out "
            "of their layer's spectrum, still counted in H): Standard MHA qk layer 0 head 1.") in printed


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weights_that_are_not_finite_are_refused_not_called_dead(bad):
    """NaN or inf is not a zero form: the layer is named, not reported as dead heads."""
    layers = _layers(0)
    layers[1]["wq"][4, 2] = bad
    with pytest.raises(ValueError, match="toy layer 1: the qk weights hold NaN or inf"):
        _analysis(layers)
