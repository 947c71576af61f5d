"""ModelConfig.arch = "nanochat": parameter-free RMSNorms, one of them right after the token
embedding, nanochat's initialisation with the output projections and the head at zero. (Decoding
with the cache: tests/model/test_attention.py; the heads' forms: tests/analysis/test_heads.py; a
resumed run: tests/training/test_train.py.)"""

import pytest
import torch

from headlab import GPT, preset
from headlab.model.config import ModelConfig
from headlab.model.gpt import OUTPUT_PROJECTIONS, nanochat_std
from headlab.model.ops import RMSNorm
from headlab.schema import FAMILIES
from shared_fixtures import tiny_model

CASES = [*((family, {}) for family in FAMILIES), ("mla", {"q_latent_dim": 10})]  # and MLA's query-latent norm
IDS = [*FAMILIES, "mla-qlatent"]


@pytest.mark.parametrize("attention,overrides", CASES, ids=IDS)
def test_nanochat_norms_have_no_parameters_and_one_more_follows_the_embedding(attention, overrides):
    nanochat, headlab = (GPT(preset("tiny", attention, arch=arch, **overrides)) for arch in ("nanochat", "headlab"))
    norms = [module for module in nanochat.modules() if isinstance(module, RMSNorm)]
    assert all(norm.weight is None for norm in norms)
    assert not [name for name, _ in nanochat.named_parameters() if "norm" in name]
    assert nanochat.param_counts()["norms"] == 0 < headlab.param_counts()["norms"]
    assert len(norms) == sum(isinstance(module, RMSNorm) for module in headlab.modules()) + 1


def test_nanochat_logits_are_blind_to_the_scale_of_each_tokens_embedding(tokens):
    for arch, blind in (("nanochat", True), ("headlab", False)):
        model = tiny_model("mha", arch=arch)
        before = model(tokens)[0]
        with torch.no_grad():
            model.wte.weight.mul_(0.25 + 4 * torch.rand(model.config.vocab_size, 1))
        assert torch.allclose(model(tokens)[0], before, rtol=0, atol=1e-4) == blind, arch


@pytest.mark.parametrize("attention,overrides", CASES, ids=IDS)
def test_nanochat_init_zeroes_the_output_projections_and_head_and_draws_the_rest_at_its_sigma(attention, overrides,
                                                                                              tokens):
    torch.manual_seed(0)
    model = GPT(preset("cpu-small", attention, arch="nanochat", **overrides))  # matrices large enough to estimate σ
    named = dict(model.named_parameters())
    zero = sorted(name for name, p in named.items() if not p.any())
    assert zero == sorted(["lm_head.weight", *(name for name in named if name.endswith(OUTPUT_PROJECTIONS))])
    assert len(zero) == 2 * model.config.n_layer + 1
    for name, p in named.items():
        if name in zero or p.dim() != 2 or name.endswith((".u_k.weight", ".u_v.weight")):  # LRKV's: rescaled
            continue
        assert p.std().item() == pytest.approx(1.0 if name == "wte.weight" else nanochat_std(p), rel=0.1), name
    assert not model(tokens)[0].any()  # every block starts as the identity, and the head reads nothing yet


def test_nanochat_sigma_keeps_a_wide_output_at_one_over_root_fan_in_and_shrinks_a_narrow_one():
    assert nanochat_std(torch.empty(512, 128)) == pytest.approx(128 ** -0.5)  # fan_out ≥ fan_in: 1/√fan_in
    assert nanochat_std(torch.empty(32, 128)) == pytest.approx((32 / 128) ** 0.5 / 128 ** 0.5)


def test_the_arch_survives_a_json_round_trip_and_is_refused_in_one_line_when_unknown():
    config = preset("tiny", "mla", arch="nanochat")
    assert ModelConfig.from_json(config.to_json()) == config and config.replace(arch="headlab") != config
    assert ModelConfig().arch == "headlab"  # the default: make demo's models
    with pytest.raises(ValueError) as error:
        config.replace(arch="nanogpt")
    assert str(error.value) == "ModelConfig.arch = 'nanogpt' is invalid: allowed values are headlab, nanochat"
