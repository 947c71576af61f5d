"""What the compiled training step holds, seen through a recording backend (aot_eager: dynamo and
AOT autograd without code generation, so on the CPU): the step returns no logits, so its
backward is handed no logits-sized gradient; and under DDP the step compiles its own graph,
split at DDP's buckets, even after the training notice compiled the model without DDP."""

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._dynamo.backends.distributed import DDPOptimizer

from headlab import preset, train, train_preset
from headlab.training.distributed import join_process_group
from headlab.training.hardware import measure_step
from ranks import on_ranks

RECORDING_BACKEND = "headlab_test_recording"
RECORDED: dict[str, list] = {"outputs": [], "tangents": []}


def _shapes(nodes) -> list[tuple[int, ...]]:
    values = [node.meta.get("val", node.meta.get("example_value")) for node in nodes]
    return [tuple(value.shape) for value in values if isinstance(value, torch.Tensor)]


def _recording_backward(graph, example_inputs):
    RECORDED["tangents"] += _shapes(n for n in graph.graph.nodes if n.op == "placeholder"
                                    and n.name.startswith("tangents"))
    return boxed_nop(graph, example_inputs)


@torch._dynamo.register_backend(name=RECORDING_BACKEND)
def _recording(graph, example_inputs):
    """aot_eager, recording the shapes each captured graph returns and its backward's tangents."""
    results = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    results = results if isinstance(results, (tuple, list)) else [results]
    RECORDED["outputs"] += _shapes(n for n in results if isinstance(n, torch.fx.Node))
    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=_recording_backward)(graph, example_inputs)


@pytest.fixture(autouse=True)
def fresh_compiles():
    torch.compiler.reset()
    for recorded in RECORDED.values():
        recorded.clear()
    yield
    torch.compiler.reset()


def test_the_compiled_training_step_returns_the_loss_alone_and_its_backward_gets_no_logits_gradient():
    """Logits returned from a compiled graph are an output autograd must give a gradient: AOT
    autograd then materialises a zero tensor of the logits' shape in every backward (6.6 GB at
    paper-128m's micro-batch 32). The training step returns the loss alone."""
    config = preset("tiny", "mha")
    train_config = train_preset("tiny", steps=1, eval_every=1, batch_size=4, device="cpu", compile=RECORDING_BACKEND)
    train(config, train_config, "synthetic", progress=False)
    logits = (train_config.batch_size, config.seq_len, config.vocab_size)
    assert RECORDED["outputs"] and RECORDED["tangents"]  # the step was compiled and differentiated
    assert logits not in RECORDED["outputs"] and RECORDED["outputs"] == [()]  # the loss, a scalar
    assert all(shape == () for shape in RECORDED["tangents"])


def _notice_then_ddp_step(rank: int) -> int:
    """Under 2 DDP ranks, rank 0 times the step first as a study's training notice does; then both
    train. How many graphs this rank's DDP step handed to DDPOptimizer (the split at DDP's buckets)."""
    join_process_group(torch.device("cpu"))
    config = train_preset("tiny", steps=2, eval_every=2, batch_size=4, device="cpu", compile="aot_eager")
    if rank == 0:
        measure_step(preset("tiny", "mha"), config, repeats=1)
    split, compile_fn = [0], DDPOptimizer.compile_fn

    def counted(self, *args, **kwargs):
        split[0] += 1
        return compile_fn(self, *args, **kwargs)

    DDPOptimizer.compile_fn = counted  # this forked rank's own class
    train(preset("tiny", "mha"), config, "synthetic", progress=False)
    return split[0]


@pytest.mark.slow
def test_the_ddp_step_after_the_training_notice_compiles_its_own_split_graph():
    """Dynamo keeps compiled graphs with the function compiled: had the notice compiled
    `GPT.forward` without DDP, the DDP step would be served that graph, unsplit (its gradient
    all-reduce waiting for the whole backward). Rank 0 must split as rank 1, which timed nothing."""
    split_0, split_1 = on_ranks(_notice_then_ddp_step, timeout=90)
    assert split_0 == split_1 >= 1
