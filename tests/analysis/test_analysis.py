"""headlab.analysis: tidy tables, save/load/concat, sources, gauge invariance end to end, the
attention-pattern cross-check and the `headlab analyze` command."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from headlab.analysis.attention_maps import attention_similarity, js_distance_matrix, recorded_attention
from headlab.analysis.qk_norm import norm_scale_effect
from headlab.analysis.similarity import Analysis, analyze, concat
from headlab.cli.main import main as cli_main
from headlab.schema import COLUMNS, FAMILIES
from shared_fixtures import tiny_model, write_run


def _write_model_folder(folder, model, dtype=None):
    """A model's own folder: a ModelConfig dict beside model.safetensors (not a headlab run)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_dict()))
    save_file({k: v.to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    return folder


def _isfinite(frame: pd.DataFrame) -> bool:
    return bool(np.isfinite(frame.select_dtypes("number").to_numpy(dtype=float)).all())


@pytest.mark.parametrize("attention", FAMILIES)
def test_tables_have_the_documented_shape(attention):
    model = tiny_model(attention)
    result = analyze(model, circuit="both")
    for name, columns in COLUMNS.items():
        assert list(getattr(result, name).columns) == columns
    h, n_layer = model.config.n_head, model.config.n_layer
    label = model.config.label
    assert set(result.summary["model"]) == {label}
    assert len(result.similarity) == n_layer * 2 * h * h
    assert len(result.spectra) == n_layer * 2 * 2 * h
    assert len(result.summary) == n_layer * 2 * 2
    assert sorted(result.summary["layer"].unique()) == list(range(n_layer))  # layers from 0
    assert sorted(result.spectra["index"].unique()) == list(range(1, h + 1))  # eigen index from 1
    assert set(result.summary["kind"]) == {"centered", "uncentered"}
    assert set(result.summary["circuit"]) == {"qk", "ov"}
    for name in ("similarity", "spectra", "summary", "norms"):
        assert _isfinite(getattr(result, name))
    diagonal = result.similarity.query("head_i == head_j")["value"]
    np.testing.assert_allclose(diagonal, 1.0)
    centered = result.summary.query("kind == 'centered'")
    assert (centered["effective_rank"] <= h - 1 + 1e-9).all()
    assert set(result.norms["part"]) >= {"query", "key", "value", "output"}
    if attention == "lrkv":
        assert set(result.norms["part"]) >= {"key_shared", "key_residual", "value_shared", "value_residual"}
        assert len(result.lrkv_cosine) == n_layer * 2 * h and result.lrkv_cosine["cosine"].abs().max() <= 1
    else:
        assert result.lrkv_cosine.empty


def test_summary_agrees_with_spectra():
    result = analyze(tiny_model("gqa"))
    for (layer, kind), rows in result.spectra.groupby(["layer", "kind"]):
        v = rows["variance_ratio"].to_numpy()
        v = v[v > 0]
        row = result.summary.query("layer == @layer and kind == @kind").iloc[0]
        assert row["effective_rank"] == pytest.approx(np.exp(-(v * np.log(v)).sum()))
        assert row["n_components_90"] == int(np.argmax(rows["cumulative"].to_numpy() >= 0.9 - 1e-12)) + 1


def test_save_load_round_trip_and_concat(tmp_path):
    a = analyze(tiny_model("mha"), label="A", circuit="both")
    b = analyze(tiny_model("lrkv"), label="B")
    both = concat([a, b])
    assert both.models == ["A", "B"]
    assert len(both.summary) == len(a.summary) + len(b.summary)
    folder = both.save(tmp_path / "analysis")
    for name in ("similarity", "spectra", "summary"):
        assert (folder / f"{name}.csv").exists()
    loaded = Analysis.load(folder)
    for name in COLUMNS:
        pd.testing.assert_frame_equal(getattr(loaded, name), getattr(both, name), check_dtype=False, check_exact=True)
    with pytest.raises(ValueError, match="label 'A'"):
        concat([a, analyze(tiny_model("mqa"), label="A")])
    with pytest.raises(ValueError, match="not an analysis folder"):
        Analysis.load(tmp_path)


def test_run_folder_and_safetensors_file_match_the_model(tmp_path):
    model = tiny_model("mla", q_latent_dim=6)
    expected = analyze(model, circuit="both")
    for folder in (write_run(tmp_path / "run", model), _write_model_folder(tmp_path / "bare", model)):
        pd.testing.assert_frame_equal(analyze(folder, circuit="both").similarity, expected.similarity)
    pd.testing.assert_frame_equal(analyze(tmp_path / "bare" / "model.safetensors").summary,
                                  analyze(model).summary)
    # bf16 checkpoints are read through torch (numpy has no bfloat16)
    bf16 = _write_model_folder(tmp_path / "bf16", model, dtype=torch.bfloat16)
    pd.testing.assert_frame_equal(analyze(bf16).similarity, analyze(model.to(torch.bfloat16)).similarity)


def test_gauge_transform_of_a_model_changes_weights_not_similarity():
    """Per head, W_Q,h → W_Q,h M_h and W_K,h → W_K,h M_h⁻ᵀ: the model computes the same scores and
    the analysis gives the same similarity, though the raw weights differ."""
    model = tiny_model("mha", qk_norm=False).double()  # float64, so 1e-8 is not float32 round-off
    transformed = tiny_model("mha", qk_norm=False).double()
    h, e = model.config.n_head, model.config.head_dim
    torch.manual_seed(0)
    with torch.no_grad():
        for block in transformed.blocks:
            for head in range(h):
                rows = slice(head * e, (head + 1) * e)
                m = torch.randn(e, e, dtype=torch.float64) + 3 * torch.eye(e)
                block.attn.c_q.weight[rows] = m.T @ block.attn.c_q.weight[rows]  # (W_Q M)ᵀ
                block.attn.c_k.weight[rows] = torch.linalg.inv(m) @ block.attn.c_k.weight[rows]  # (W_K M⁻ᵀ)ᵀ

    before, after = analyze(model), analyze(transformed)
    np.testing.assert_allclose(after.similarity["value"], before.similarity["value"], atol=1e-8)

    def raw_weight_similarity(m, name):
        w = getattr(m.blocks[0].attn, name).weight.detach().double().view(h, -1)
        w = w / w.norm(dim=1, keepdim=True)
        return w @ w.T

    for name in ("c_q", "c_k"):
        assert (raw_weight_similarity(transformed, name) - raw_weight_similarity(model, name)).abs().max() > 0.05
    # The attention layer computes the same thing when its RoPE is the identity (cos 1, sin 0) ...
    x = torch.randn(1, 16, model.config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    half = e // 2
    identity = torch.ones(16, half, dtype=torch.float64), torch.zeros(16, half, dtype=torch.float64)
    rope = model.rope_cos[:16].double(), model.rope_sin[:16].double()
    with torch.no_grad():
        same = [m.blocks[0].attn(x, *identity) for m in (model, transformed)]
        rotated = [m.blocks[0].attn(x, *rope) for m in (model, transformed)]
    torch.testing.assert_close(same[1], same[0], rtol=1e-10, atol=1e-10)
    # ... but not with RoPE: only transforms commuting with the rotations are symmetries of the
    # model, so the bilinear-form similarity ignores position structure (digest caveat C8).
    assert (rotated[1] - rotated[0]).abs().max() > 1e-3


def test_identical_and_dead_heads_end_to_end():
    model = tiny_model("mha")
    e = model.config.head_dim
    with torch.no_grad():
        attn = model.blocks[0].attn
        for w in (attn.c_q.weight, attn.c_k.weight):
            w.copy_(w[:e].repeat(model.config.n_head, 1))  # every head a copy of head 0
        model.blocks[1].attn.c_q.weight[e:2 * e] = 0.0  # head 1 of layer 1 is dead
    summary = analyze(model).summary.set_index(["layer", "kind"])
    assert summary.loc[(0, "uncentered"), "effective_rank"] == pytest.approx(1.0)
    assert summary.loc[(0, "centered"), "effective_rank"] == 0.0
    assert summary.loc[(0, "uncentered"), "mean_offdiag_similarity"] == pytest.approx(1.0)
    assert _isfinite(summary)
    similarity = analyze(model, layers=[1]).similarity
    assert similarity.query("head_i == 1 or head_j == 1")["value"].isna().all()
    assert similarity.query("head_i != 1 and head_j != 1")["value"].notna().all()


def test_invalid_arguments_are_named():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="circuit = 'vo'.*qk, ov, both"):
        analyze(model, circuit="vo")
    with pytest.raises(ValueError, match="layer = 5"):
        analyze(model, layers=[5])
    with pytest.raises(ValueError, match="at least 2 heads"):
        analyze(tiny_model("mha", n_head=1, n_kv_head=1))


# ---- behaviour space ---------------------------------------------------------------------------

@pytest.mark.parametrize("attention", FAMILIES)
def test_recorded_attention_hooks_one_model_and_leave_no_hook_behind(attention, tokens):
    """The hook point sees every layer's call of the recorded model only, and is removed on exit
    (also when the block raises), so the model computes exactly as before."""
    model, other = tiny_model(attention), tiny_model(attention)
    before = model(tokens)[0]
    with recorded_attention(model) as calls:
        other(tokens)
        assert calls == []  # another model's forward is not recorded
        model(tokens)
    assert len(calls) == model.config.n_layer
    with pytest.raises(RuntimeError), recorded_attention(model) as more:
        raise RuntimeError
    model(tokens)
    assert more == [] and all(not m._forward_pre_hooks for m in model.modules())
    torch.testing.assert_close(model(tokens)[0], before, rtol=0, atol=0)


@pytest.mark.parametrize("attention", FAMILIES)
def test_attention_pattern_similarity(attention, tokens):
    model = tiny_model(attention)
    frame = attention_similarity(model, tokens)
    assert list(frame.columns) == COLUMNS["similarity"] and set(frame["circuit"]) == {"pattern"}
    h = model.config.n_head
    assert len(frame) == model.config.n_layer * h * h
    values = frame["value"].to_numpy()
    assert ((values >= -1e-12) & (values <= 1 + 1e-12)).all()
    matrix = frame.query("layer == 0").pivot(index="head_i", columns="head_j", values="value").to_numpy()
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-12)
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-7)
    assert (matrix[~np.eye(h, dtype=bool)] < 1 - 1e-3).all()  # random heads attend differently


def test_js_distance_matrix_on_known_distributions():
    """Query position 1 of three heads: [1, 0], [½, ½], [0, 1]. Disjoint maps are 1 apart; a point
    mass and the uniform map √(½ KL(p‖m) + ½ KL(q‖m)) with m = [¾, ¼] (log base 2)."""
    probs = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.0, 1.0]]])[None]
    half = np.sqrt((np.log2(4 / 3) + 0.5 * np.log2(2 / 3) + 0.5) / 2)
    np.testing.assert_allclose(js_distance_matrix(probs), [[0, half, 1], [half, 0, half], [1, half, 0]], atol=1e-12)


def test_js_distance_matrix_equals_scipys_on_causal_attention_maps():
    """Random causal maps (zeros above the diagonal, some rows near one-hot): every entry equals
    the mean of scipy's `jensenshannon` over batch and query positions 1…T−1."""
    from scipy.spatial.distance import jensenshannon

    rng = np.random.default_rng(0)
    b, h, t = 2, 4, 9
    logits = rng.normal(scale=rng.choice([0.5, 8.0], size=(b, h, t, 1)), size=(b, h, t, t))
    logits[..., np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.array([[jensenshannon(probs[:, i, 1:], probs[:, j, 1:], base=2, axis=-1).mean() for j in range(h)]
                         for i in range(h)])
    np.testing.assert_allclose(js_distance_matrix(torch.from_numpy(probs)), expected, atol=1e-12)


def test_identical_heads_have_identical_attention_maps(tokens):
    model = tiny_model("mha")
    e = model.config.head_dim
    with torch.no_grad():
        attn = model.blocks[1].attn
        attn.c_q.weight[e:2 * e] = attn.c_q.weight[:e]
        attn.c_k.weight[e:2 * e] = attn.c_k.weight[:e]
    # weight space and behaviour space in one tidy table
    both = pd.concat([analyze(model).similarity, attention_similarity(model, tokens)], ignore_index=True)
    pair = both.query("layer == 1 and head_i == 0 and head_j == 1").set_index("circuit")["value"]
    assert pair["qk"] == pytest.approx(1.0) and pair["pattern"] == pytest.approx(1.0, abs=1e-7)


# ---- command line ------------------------------------------------------------------------------

def test_cli_analyze_writes_tables_and_prints_ranks(tmp_path, capsys):
    run_a = write_run(tmp_path / "mha", tiny_model("mha"))
    run_b = write_run(tmp_path / "mha-seed1", tiny_model("mha", seed=1))
    out = tmp_path / "analysis"
    assert cli_main(["analyze", str(run_a), str(run_b), "--out", str(out), "--circuit", "ov"]) == 0
    printed = capsys.readouterr().out
    assert "Standard MHA [mha] · ov · frobenius · 4 heads" in printed and "Standard MHA [mha-seed1]" in printed
    assert printed.count("mean") == 2
    summary = Analysis.load(out).summary
    assert set(summary["circuit"]) == {"ov"} and len(summary) == 2 * 2 * 2

    assert cli_main(["analyze", str(tmp_path), "--out", str(out)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_mla_rope_is_a_recorded_choice_that_moves_only_mla():
    """Both settings of every family stack into one table (a column tells them apart); they agree
    exactly for families without RoPE parts in A_h and differ for MLA."""
    by_setting = {}
    for attention in ("mha", "mla"):
        model = tiny_model(attention)
        result = concat(analyze(model, mla_rope=setting) for setting in ("included", "excluded"))
        for name in ("similarity", "spectra", "summary", "norms"):
            assert set(getattr(result, name)["mla_rope"]) == {"included", "excluded"}, name
        values = result.spectra.pivot_table(index=["layer", "kind", "index"], columns="mla_rope", values="eigenvalue")
        by_setting[attention] = values["included"] - values["excluded"]
    assert (by_setting["mha"] == 0).all()
    assert (by_setting["mla"].abs() > 1e-6).any()
    with pytest.raises(ValueError, match="mla_rope = 'both' is invalid"):
        analyze(tiny_model("mla"), mla_rope="both")


def test_cli_analyze_mla_rope_option(tmp_path):
    run = write_run(tmp_path / "mla", tiny_model("mla"))
    ranks = {}
    for setting in ("included", "excluded"):
        assert cli_main(["analyze", str(run), "--out", str(tmp_path / setting), "--mla-rope", setting]) == 0
        summary = Analysis.load(tmp_path / setting).summary
        assert set(summary["mla_rope"]) == {setting}
        ranks[setting] = summary["effective_rank"].to_numpy()
    assert not np.allclose(ranks["included"], ranks["excluded"])


def test_norm_scale_effect_separates_per_head_constants_from_per_token_scales():
    model = tiny_model("gqa")
    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    table = norm_scale_effect(model, tokens).set_index(["layer", "kind", "measure"])["effective_rank_pct_of_heads"]
    ranks = table.unstack("measure")
    summary = analyze(model).summary.set_index(["layer", "kind"])["effective_rank_pct_of_heads"]
    np.testing.assert_allclose(ranks["weights"], summary.loc[ranks.index], rtol=1e-12)
    # a constant per head cancels in the cosine; the per-token part of 1/rms does not
    np.testing.assert_allclose(ranks["weights, median 1/rms per head"], ranks["weights"], rtol=1e-12)
    assert not np.allclose(ranks["token scores with 1/rms"], ranks["token scores"], rtol=1e-6)
    with pytest.raises(ValueError, match="needs a headlab GPT with QK-norm"):
        norm_scale_effect(tiny_model("mla"), tokens)
