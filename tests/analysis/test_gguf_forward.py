"""The forward-based views of GGUF checkpoints: the model headlab builds from a GGUF file runs as
`transformers` runs the model it was converted from (hidden states, logits, attention maps),
which for llama needs llama.cpp's Q/K row order undone and for Gemma 3 its scaled embedding,
sandwich norms, QK-norms, local sliding-window and global layers with two RoPE bases; the
data-aware view and the attention maps then equal those of the Hugging Face folder; the file's
tokenizer encodes as the vocabulary it was written from; and `headlab analyze` runs all three."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf_fixtures import GEMMA3, random_model, write_gguf

from doc_blocks import code_block, run_python
from headlab.analysis.attention_maps import attention_similarity
from headlab.analysis.gguf_models import gguf_model
from headlab.analysis.hf_models import hf_attention_maps
from headlab.analysis.inputs import encode_text, input_moments
from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main as cli_main

tokenizers = pytest.importorskip("tokenizers")

TOKENS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def converted(request, tmp_path_factory):
    """(kind, the float64 reference model, its GGUF file, its Hugging Face folder)."""
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    reference = random_model(kind)
    reference.save_pretrained(str(folder / "hf"))
    return kind, reference, write_gguf(folder / f"{kind}.gguf", reference, kind), folder / "hf"


def test_forward_pass_and_attention_maps_are_transformers_own(converted):
    kind, reference, path, _ = converted
    built, model_type = gguf_model(path)
    assert model_type == {"llama": "llama", "gemma3": "gemma3_text"}[kind]
    with torch.no_grad():
        expected = reference(TOKENS).last_hidden_state
        got = built(TOKENS).last_hidden_state.double()
        embedding = reference.embed_tokens.weight
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got @ embedding.T, expected @ embedding.T, rtol=1e-4, atol=1e-3)  # logits
        ours, theirs = hf_attention_maps(built, TOKENS), hf_attention_maps(reference, TOKENS)
    for layer, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.double(), b, atol=1e-5, err_msg=f"layer {layer}")
    if kind == "gemma3":  # the local layers see 4 tokens back, the global layer (5) all of them
        far = torch.from_numpy(np.subtract.outer(np.arange(12), np.arange(12)) >= GEMMA3["sliding_window"])
        assert (ours[0] * far).abs().max() == 0
        assert (ours[5] * far).abs().max() > 1e-3


def test_data_aware_view_and_maps_equal_the_hugging_face_folders(converted):
    kind, _, path, folder = converted
    from_file, from_folder = input_moments(path, TOKENS), input_moments(folder, TOKENS)
    np.testing.assert_allclose(from_file.query, from_folder.query, rtol=1e-4, atol=1e-6)
    spectra = [analyze(source, "m", measure="data", inputs=moments).spectra["eigenvalue"].to_numpy()
               for source, moments in ((path, from_file), (folder, from_folder))]
    np.testing.assert_allclose(*spectra, atol=1e-5)
    maps = [attention_similarity(source, TOKENS, "m")["value"].to_numpy() for source in (path, folder)]
    np.testing.assert_allclose(*maps, atol=1e-5)


TEXT = " ".join(f"word{(7 * i * i + 3 * i) % 61}" for i in range(600))


def byte_level_vocabulary() -> tuple[dict, "tokenizers.Tokenizer"]:
    """A byte-level BPE trained on TEXT, as GGUF's tokenizer.ggml fields (tokens by id, merges)."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    vocab = tokenizer.get_vocab()
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tokenizer.to_str())["model"]["merges"]]
    return dict(tokens=sorted(vocab, key=vocab.get), merges=merges, bos=vocab["<|endoftext|>"]), tokenizer


def test_gguf_tokenizer_and_the_command_line_views(tmp_path, capsys):
    """The file's byte-level BPE encodes TEXT as the vocabulary it was written from (no BOS: a
    byte-level vocabulary without add_bos_token, as llama.cpp reads it), and `headlab analyze`
    writes the weights and data-aware views (--measure both) and the attention maps of the file."""
    vocabulary, tokenizer = byte_level_vocabulary()
    path = write_gguf(tmp_path / "tok.gguf", random_model("llama"), "llama", vocabulary=vocabulary)
    windows = encode_text(path, TEXT)
    expected = tokenizer.encode(TEXT).ids
    assert windows.shape[1] == 128 and windows.flatten().tolist() == expected[: windows.numel()]
    (tmp_path / "text.txt").write_text(TEXT)
    status = cli_main(["analyze", str(path), "--measure", "both", "--text", str(tmp_path / "text.txt"),
                       "--attention-maps", "--out", str(tmp_path / "out")])
    assert status == 0, capsys.readouterr().err
    tables = Analysis.load(tmp_path / "out")
    assert set(tables.similarity["circuit"]) == {"qk", "pattern"}
    assert set(tables.summary["measure"]) == {"frobenius", "data", "jensen_shannon"}


def test_the_pretrained_pages_python_block_runs_on_a_gguf_file(tmp_path):
    """docs/pretrained.md's Python block, on a GGUF file with a tokenizer written here in place of
    the downloaded Gemma 3 (which the tests do not fetch): the weights, data-aware and attention-map
    views it names all come back, one row per layer and head pair."""
    vocabulary, _ = byte_level_vocabulary()
    path = write_gguf(tmp_path / "tok.gguf", random_model("llama"), "llama", vocabulary=vocabulary)
    run = run_python(code_block("docs/pretrained.md", "from headlab.analysis.similarity import analyze"),
                     {"__name__": "__doc_example__", "text": TEXT},
                     substitutes=[('source = ".venv/checkpoints/gemma3"', f"source = {str(path)!r}")])
    assert set(run["weights"].summary["measure"]) == {"frobenius"}
    assert set(run["data"].summary["measure"]) == {"data"}
    assert set(run["maps"]["circuit"]) == {"pattern"}

