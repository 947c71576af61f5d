"""headlab.model.decoding: cache bytes against the formula, cached generation, step timings and the
LRKV key-rebuild bill, on tiny models."""

import pytest
import torch
from test_cache_sizes import _formula

from headlab.model import decoding
from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {config.label: GPT(config.replace(seq_len=96)).eval() for config in comparison_variants("tiny")}


def test_cache_bytes_equal_the_formula_for_every_variant_and_both_mla_caches(models):
    table = decoding.cache_bytes_table(models, context=48)
    assert len(table) == len(models) + 1  # MLA twice
    assert table["agree"].all()
    for label, model in models.items():  # the paper's formula, written out in test_cache_sizes
        assert table.loc[label, "formula (bytes)"] == 4 * 48 * model.config.n_layer * _formula(model.config, True)
    for label, model in models.items():
        assert table.loc[label, "% of MHA"] == pytest.approx(100 * model.config.kv_cache_fraction_of_mha())
    (naive,) = [label for label in table.index if label.endswith("naive cache")]
    mla = next(model.config for model in models.values() if model.config.attention == "mla")
    # Decompressed per-head keys (no-RoPE part and the shared RoPE part) and values.
    per_head = 2 * mla.head_dim + mla.rope_head_dim
    assert table.loc[naive, "% of MHA"] == pytest.approx(100 * per_head / (2 * mla.head_dim))


def test_cached_and_uncached_generation_choose_the_same_tokens(models, monkeypatch):
    prompt = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    table = decoding.generation_speed(models, prompt, new_tokens=6, repeats=1)
    assert list(table.index) == list(models)
    assert table["same tokens"].all()
    assert table["speed-up"].to_numpy() == pytest.approx(
        (table["without cache (ms/token)"] / table["with cache (ms/token)"]).to_numpy())
    # a cached path that picks other tokens is reported, not hidden
    mqa = next(label for label in models if label.startswith("MQA"))
    generate = models[mqa].generate
    monkeypatch.setattr(models[mqa], "generate", lambda *a, use_cache=True, **k: generate(*a, use_cache=use_cache, **k)
                        .add(1 if use_cache else 0))
    table = decoding.generation_speed(models, prompt, new_tokens=2, repeats=1)
    assert list(table["same tokens"]) == [label != mqa for label in models]


def test_cache_bytes_are_the_bytes_decoding_actually_holds(models):
    """The table's cache is the one `generate` decodes with: after a prefill and a decode step the
    tensors it holds are exactly the table's bytes; a cache holding more is reported, not hidden."""
    table = decoding.cache_bytes_table(models, context=48)
    for label, model in models.items():
        cache = model.new_cache(1, 48)
        with torch.no_grad():
            model(torch.zeros(1, 47, dtype=torch.long), cache=cache)
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        assert cache.pos == 48
        assert sum(t.numel() * t.element_size() for t in cache.tensors()) == table.loc[label, "cache tensors (bytes)"]
    mqa = next(label for label in models if label.startswith("MQA"))
    original = models[mqa].new_cache

    def padded(*args, **kwargs):  # a cache with one spare layer's worth of buffers
        cache = original(*args, **kwargs)
        cache.layers.append(cache.layers[0])
        return cache

    models[mqa].new_cache = padded
    try:
        assert list(decoding.cache_bytes_table(models, context=48)["agree"]) == [
            label != mqa for label in decoding.cache_bytes_table(models, context=48).index]
    finally:
        del models[mqa].new_cache


def test_step_latency_times_one_step_at_each_stated_context(models, monkeypatch):
    """Each timed statement decodes one token on a cache already holding `context` tokens and
    rewinds it, so every repetition sees the same cache."""
    seen = []

    class Recorder:
        def __init__(self, statement, globals):
            self.statement, self.globals = statement, globals

        def blocked_autorange(self, min_run_time):
            cache = self.globals["cache"]
            before = cache.pos
            exec(self.statement, self.globals)
            seen.append((before, cache.pos))
            return type("Measurement", (), {"median": 0.001})()

    monkeypatch.setattr(decoding, "Timer", Recorder)
    latency = decoding.step_latency(models, [16, 64], min_run_time=0.01)
    assert list(zip(latency["model"], latency["context"])) == [(m, c) for c in (16, 64) for m in models]
    assert seen == [(c, c) for c in (16, 64) for _ in models] and (latency["ms"] == 1.0).all()


def test_lrkv_key_rebuild_bill_follows_its_closed_form():
    configs = comparison_variants("paper-128m")
    table = decoding.lrkv_key_rebuild_macs(configs, [2048, 8192])
    lrkv = [c for c in configs if c.attention == "lrkv"]
    assert len(table) == 2 * len(lrkv)
    for config in lrkv:
        rows = table[table["variant"] == config.label].set_index("context T")
        assert rows.loc[2048, "key rebuild (MACs/token)"] == 12 * 2048 * 6 * config.kv_rank * 128
        # r times the attention scores, linear in T; the block matmuls do not depend on T.
        assert (rows["key rebuild (MACs/token)"] == config.kv_rank * rows["attention scores (MACs/token)"]).all()
        assert rows.loc[8192, "key rebuild (MACs/token)"] == 4 * rows.loc[2048, "key rebuild (MACs/token)"]
        with torch.device("meta"):
            model = GPT(config)
        block = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("wte.", "lm_head.")))
        assert (rows["block weight matmuls (MACs/token)"] == block).all()
