"""GGUF checkpoints in the weights view: small files written here (gguf_fixtures) from tiny random
models, in float32 and quantised, read back into the Hugging Face layout they came from; spectra
against an independent float64 recomputation from explicit d × d forms; the one-line refusals."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_fixtures import LLAMA, form_spectrum, layer_forms, random_model, write_gguf

from headlab.analysis.gguf_files import open_gguf
from headlab.analysis.gguf_layouts import hf_config, hf_tensors
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import from_hf
from headlab.analysis.similarity import analyze
from headlab.analysis.tensors import TensorStore
from headlab.cli.main import main as cli_main

Q = gguf.GGMLQuantizationType


def hf_state(model) -> dict[str, np.ndarray]:
    return {name: value.double().numpy() for name, value in model.state_dict().items()}


def uncentered(analysis, layer: int) -> np.ndarray:
    rows = analysis.spectra[(analysis.spectra["layer"] == layer) & (analysis.spectra["kind"] == "uncentered")]
    return rows.sort_values("index")["eigenvalue"].to_numpy()


def similarity(analysis, layer: int) -> np.ndarray:
    rows = analysis.similarity[analysis.similarity["layer"] == layer]
    n = rows["head_i"].max() + 1
    matrix = np.zeros((n, n))
    matrix[rows["head_i"], rows["head_j"]] = rows["value"]
    return matrix


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_weights_view_is_that_of_the_hugging_face_layout(tmp_path, kind):
    """The file's tensors come back in Hugging Face order and convention (llama.cpp's Q/K row
    permutation undone with n_head for W_Q and n_head_kv for W_K; Gemma's 1 + w norms back to w),
    and every layer's similarity and spectrum equal those of the same model's Hugging Face
    weights and of explicit float64 forms A_h = W_Q,hᵀ diag(γ_q γ_k) W_K,g(h)."""
    model = random_model(kind)
    path = write_gguf(tmp_path / f"{kind}.gguf", model, kind)
    checkpoint = open_gguf(path)
    config = hf_config(checkpoint)
    assert config["num_key_value_heads"] == model.config.num_key_value_heads
    state = hf_state(model)
    tensors = hf_tensors(checkpoint)
    assert tensors.names == set(state)
    for name, value in state.items():  # float32 in the file: equal up to float32 rounding of the weights
        np.testing.assert_allclose(tensors[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    from_file = analyze(path)
    hf_layout = analyze(from_hf(config, TensorStore.from_mapping(state), "hf"))
    assert load_heads(path).label == kind
    gain_offset = 1.0 if kind == "gemma3" else 0.0  # Gemma's RMSNorm scales by 1 + w
    for layer in range(model.config.num_hidden_layers):
        expected_similarity, expected = form_spectrum(layer_forms(state, config, layer, gain_offset))
        np.testing.assert_allclose(similarity(from_file, layer), expected_similarity, atol=1e-6)
        np.testing.assert_allclose(uncentered(from_file, layer), expected, atol=1e-6)
        np.testing.assert_allclose(uncentered(from_file, layer), uncentered(hf_layout, layer), atol=1e-6)


def test_hugging_face_gemma3_folder_reads_as_its_gguf(tmp_path):
    """A Gemma 3 checkpoint folder (model_type gemma3_text) and its GGUF give one spectrum."""
    model = random_model("gemma3")
    model.save_pretrained(str(tmp_path / "hf"))
    path = write_gguf(tmp_path / "gemma3.gguf", model, "gemma3")
    folder, file = analyze(tmp_path / "hf"), analyze(path)
    for layer in range(model.config.num_hidden_layers):
        np.testing.assert_allclose(uncentered(folder, layer), uncentered(file, layer), atol=1e-6)


# type -> bound on |dequantised - original| per block of 32, as a share of the block's largest |w|
# (Q4_1's of its range max - min): half a quantisation step, with room for the float16 scale
BOUNDS = {Q.Q8_0: 1 / 127, Q.Q4_0: 1 / 8, Q.Q4_1: 1 / 15, Q.Q5_0: 1 / 16, Q.Q5_1: 1 / 31}


def test_quantised_tensors_match_the_float64_weights(tmp_path):
    """Each quantisation type gguf.quants writes comes back within half a step of every float64
    weight (after the row order is undone), and the spectra stay near the float model's."""
    model = random_model("llama")
    types = {"attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "attn_v": Q.Q4_1, "attn_output": Q.Q5_0, "ffn_up": Q.Q5_1}
    quantised = {f"blk.{i}.{name}.weight": t for i in range(LLAMA["num_hidden_layers"]) for name, t in types.items()}
    path = write_gguf(tmp_path / "q.gguf", model, "llama", quantised=quantised)
    checkpoint = open_gguf(path)
    assert {checkpoint.tensors[name].type_name for name in quantised} == {t.name for t in types.values()}
    tensors, state = hf_tensors(checkpoint), hf_state(model)
    modules = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_up": "mlp.up_proj"}
    for name, qtype in types.items():
        hf_name = f"layers.1.{modules[name]}.weight"
        original, read = state[hf_name], tensors[hf_name]
        blocks = original.reshape(original.shape[0], -1, 32)
        if qtype == Q.Q4_1 or qtype == Q.Q5_1:
            scale = blocks.max(-1) - blocks.min(-1)
        else:
            scale = np.abs(blocks).max(-1)
        error = np.abs(read - original).reshape(blocks.shape).max(-1)
        assert (error <= BOUNDS[qtype] * scale * 1.01 + 1e-6).all(), name
        assert error.max() > 0, f"{name} was not quantised"
    float_model = analyze(write_gguf(tmp_path / "f.gguf", model, "llama"))
    quantised_model = analyze(path)
    for layer in range(LLAMA["num_hidden_layers"]):
        np.testing.assert_allclose(uncentered(quantised_model, layer), uncentered(float_model, layer), atol=0.05)


def one_line_error(capsys, source, tmp_path) -> str:
    status = cli_main(["analyze", str(source), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 2, captured
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    return captured.err


def test_unreadable_models_are_one_line(tmp_path, capsys):
    """An unknown architecture, a type gguf cannot dequantise, a missing tensor, a truncated
    file and a file that is not GGUF: each one line naming what is missing, exit status 2."""
    model = random_model("llama")
    assert "'mamba' is not supported" in one_line_error(
        capsys, write_gguf(tmp_path / "mamba.gguf", model, "llama", architecture="mamba"), tmp_path)
    assert "blk.1.attn_k.weight" in one_line_error(
        capsys, write_gguf(tmp_path / "missing.gguf", model, "llama", leave_out=("blk.1.attn_k.weight",)), tmp_path)
    assert "attn_q" in one_line_error(
        capsys, write_gguf(tmp_path / "q81.gguf", model, "llama", quantised={"blk.0.attn_q.weight": Q.Q8_1}), tmp_path)
    whole = write_gguf(tmp_path / "whole.gguf", model, "llama").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) * 2 // 3])
    assert "truncated or corrupt" in one_line_error(capsys, tmp_path / "cut.gguf", tmp_path)
    (tmp_path / "text.gguf").write_bytes(b"not a model at all")
    assert "not a GGUF file" in one_line_error(capsys, tmp_path / "text.gguf", tmp_path)
