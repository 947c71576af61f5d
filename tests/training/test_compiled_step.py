"""What the compiled training step holds, seen through a recording backend (aot_eager: dynamo and
AOT autograd without code generation, so on the CPU): the step returns no logits, so its
backward is handed no logits-sized gradient."""

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop

from headlab import preset, train, train_preset

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
