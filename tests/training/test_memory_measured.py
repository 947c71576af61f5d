"""The memory model's activation bytes against torch's profiler: the peak of the CPU
allocator's live bytes over one eager training step (forward under autocast, loss, backward),
gradients already allocated by a step before, of every attention family in bf16 autocast and
fp32. The planner sizes GPU setups from these bytes, so an under-count there is an
out-of-memory on a card the plan called large enough."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants
from headlab.training.memory import activation_bytes

BATCH, SEQ_LEN = 8, 64  # 512 tokens: the per-token terms dwarf weight-sized temporaries
VARIANTS = [config.replace(seq_len=SEQ_LEN) for config in comparison_variants("tiny")]
VARIANTS += [VARIANTS[0].replace(mlp="swiglu"), VARIANTS[4].replace(q_latent_dim=16, qk_norm=False)]


def measured_step_peak(config, dtype: str) -> int:
    """Peak bytes the CPU allocator holds above its level at the start of one training step."""
    torch.manual_seed(0)
    model = GPT(config)
    x, y = (torch.randint(0, config.vocab_size, (BATCH, SEQ_LEN)) for _ in range(2))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            _, loss = model(x, y)
        loss.backward()

    step()  # the gradients now exist; the measured step accumulates into them
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    changes = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]")
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.attention}-{c.label}-{c.mlp}-q{c.q_latent_dim}")
def test_planned_activations_are_within_ten_percent_of_the_profiled_eager_peak(config, dtype):
    """The whole step, and its growth from 2 to 4 layers (the per-layer part alone: at this
    width the head's V·14 bytes are half of the whole and would hide a wrong layer term)."""
    deeper = config.replace(n_layer=2 * config.n_layer)
    peak, deeper_peak = measured_step_peak(config, dtype), measured_step_peak(deeper, dtype)
    planned, deeper_planned = activation_bytes(config, BATCH, dtype), activation_bytes(deeper, BATCH, dtype)
    assert peak == pytest.approx(planned, rel=0.10)
    assert deeper_peak - peak == pytest.approx(deeper_planned - planned, rel=0.10)
