"""Inputs on any device: a study's run is read back onto the device it trained on (a GPU after
`reproduce` there), while prompts and token windows are built on the CPU. Every public entry
point a notebook feeds tensors to moves them to the model's device. Shown with the models on the
meta device, which is not the CPU and needs no accelerator: a missed move fails there the way it
fails on CUDA ("Tensor on device meta is not on the expected device cpu")."""

import pytest
import torch

from headlab.model import decoding
from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants

META = torch.device("meta")


@pytest.fixture(scope="module")
def meta_models():
    with META:
        return {config.label: GPT(config.replace(seq_len=64)).eval() for config in comparison_variants("tiny")}


def cpu_tokens(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(length))


def test_forward_takes_cpu_tokens_and_targets_on_a_model_elsewhere(meta_models):
    for model in meta_models.values():
        logits, loss = model(cpu_tokens(2, 12), targets=cpu_tokens(2, 12))
        assert logits.device == META and logits.shape == (2, 12, model.config.vocab_size)
        assert loss.device == META and loss.shape == ()


def test_generate_takes_a_cpu_prompt_in_every_mode(meta_models):
    """Notebook 01's sampling cell (temperature 0.8, top-k 40) and the other decoding modes,
    the cache rebuilt once when it fills (a 60-token prompt, 8 new tokens, seq_len 64)."""
    for model in meta_models.values():
        modes = [dict(temperature=0.8, top_k=40), dict(temperature=0, use_cache=False)]
        modes += [dict(temperature=0, mla_absorb=False)] if model.config.attention == "mla" else []
        for mode in modes:
            out = model.generate(cpu_tokens(1, 60), 8, **mode)
            assert out.device == META and out.shape == (1, 68), (model.config.label, mode)


def test_notebook_04_decoding_tables_take_a_cpu_prompt(meta_models, monkeypatch):
    """Notebook 04's three tables on models held elsewhere. Meta tensors hold no values, so the
    token comparison of generation_speed is stubbed to compare shapes."""
    monkeypatch.setattr(torch, "equal", lambda a, b: a.shape == b.shape)
    speed = decoding.generation_speed(meta_models, cpu_tokens(1, 20), new_tokens=3, repeats=1)
    assert list(speed.index) == list(meta_models) and speed["same tokens"].all()
    monkeypatch.undo()
    latency = decoding.step_latency(meta_models, [8], min_run_time=0.001)
    assert list(latency["model"]) == list(meta_models)
    assert decoding.cache_bytes_table(meta_models, context=16)["agree"].all()
