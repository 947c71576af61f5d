"""torch.compile by default where it can run, eager after one line where it cannot or fails."""

import re

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from headlab import preset, train, train_preset
from headlab.training import compiling, hardware
from headlab.training import trainer as trainer_module
from headlab.training.compiling import compile_backend, compiled_forward
from headlab.training.config import TrainConfig
from headlab.training.flops import rank_training_flops
from headlab.training.hardware import measure_step

CUDA = torch.device("cuda", 0)
FAILING_BACKEND = "headlab_test_without_triton"


@torch._dynamo.register_backend(name=FAILING_BACKEND)
def _without_triton(graph, example_inputs):
    """A backend that fails as inductor does on a GPU machine without Triton."""
    raise RuntimeError("Cannot find a working triton installation. Either the package is not installed or it is "
                       "too old.")


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test starts as a new process would: no backend known to fail, no compiled frames."""
    monkeypatch.setattr(compiling, "UNAVAILABLE", set())
    monkeypatch.setattr(compiling, "_SAID", set())
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _gpu(monkeypatch, capability: tuple[int, int], triton: bool) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100")
    monkeypatch.setattr(compiling.importlib.util, "find_spec", lambda name: object() if triton else None)


def test_auto_compiles_with_inductor_on_a_gpu_that_can_run_it_and_never_on_a_cpu(monkeypatch):
    assert TrainConfig().compile == "auto"
    _gpu(monkeypatch, (8, 0), triton=True)
    assert compile_backend("auto", CUDA) == ("inductor", None)
    assert compile_backend("auto", torch.device("cpu")) == (None, None)
    assert compile_backend("off", CUDA) == (None, None)
    assert compile_backend("aot_eager", torch.device("cpu")) == ("aot_eager", None)  # named: on any device
    compiling.UNAVAILABLE.add("inductor")  # as when a compile failed earlier in this process
    assert compile_backend("auto", CUDA) == (None, None)


@pytest.mark.parametrize("capability, triton, why", [((6, 0), True, "compute capability 6.0, below the 7.0"),
                                                     ((7, 5), False, "Triton, .* is not installed")])
def test_auto_leaves_a_gpu_that_cannot_compile_eager_saying_why_once(monkeypatch, capability, triton, why):
    _gpu(monkeypatch, capability, triton)
    backend, reason = compile_backend("auto", CUDA)
    assert backend is None and reason.startswith("not compiling: ") and "\n" not in reason
    assert re.search(why, reason)
    assert compile_backend("auto", CUDA) == (None, None)  # the next run of the process says nothing more
    assert compile_backend("inductor", CUDA) == ("inductor", None)  # asked for by name: tried, and fails loudly


def test_an_unknown_backend_is_refused_naming_the_allowed_values():
    with pytest.raises(ValueError, match=r"TrainConfig\.compile = 'inductr' is invalid: allowed values are auto, "
                                         r"off or a torch.compile backend \(.*inductor"):
        TrainConfig(compile="inductr")


def test_runs_saved_when_compile_was_a_switch_load_with_its_meaning():
    saved = {k: v for k, v in TrainConfig().__dict__.items()}
    assert TrainConfig.from_dict({**saved, "compile": False}).compile == "off"
    assert TrainConfig.from_dict({**saved, "compile": True}).compile == "auto"  # it compiled on a GPU only


def _losses(run) -> list[float]:
    return [r[k] for r in run.metrics for k in ("train_loss", "val_loss") if k in r]


def test_a_compile_failing_at_the_first_step_falls_back_to_eager_with_one_line(monkeypatch, capsys):
    """Under "auto", a compile that fails at the first step (here dynamo's failing test backend
    stands in for a missing Triton or an unsupported operation) trains on eagerly, to the very
    losses of an eager run, after one line; the process does not try that backend again."""
    config = train_preset("tiny", steps=3, eval_every=3, device="cpu", compile="auto")
    eager = train(preset("tiny", "mha"), config.replace(compile="off"), "synthetic", progress=False)
    capsys.readouterr()
    monkeypatch.setattr(trainer_module, "compile_backend", lambda requested, device, *_: (FAILING_BACKEND, None))
    fallen_back = train(preset("tiny", "mha"), config, "synthetic", progress=False)
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith(f"torch.compile ({FAILING_BACKEND}) failed at the first step (")
    assert "training eager" in said[0]
    assert _losses(fallen_back) == _losses(eager)
    assert compiling.UNAVAILABLE == {FAILING_BACKEND}


def test_a_backend_asked_for_by_name_fails_loudly_rather_than_training_otherwise():
    config = train_preset("tiny", steps=2, eval_every=2, device="cpu", compile=FAILING_BACKEND)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed):
        train(preset("tiny", "mha"), config, "synthetic", progress=False)


def test_the_timed_step_is_the_compiled_step_training_will_run(monkeypatch):
    """The training notice times `measure_step`: it must compile as training does, and a compile
    that fails there leaves training eager too (what was timed is what runs)."""
    counters.clear()
    measure_step(preset("tiny", "mha"), train_preset("tiny", device="cpu", compile="eager"), repeats=1)
    assert counters["stats"]["unique_graphs"] >= 1
    monkeypatch.setattr(hardware, "compile_backend", lambda requested, device, *_: (FAILING_BACKEND, None))
    measure_step(preset("tiny", "mha"), train_preset("tiny", device="cpu", compile="auto"), repeats=1)
    assert compiling.UNAVAILABLE == {FAILING_BACKEND}


def test_auto_trains_bf16_eager_on_a_gpu_without_native_bf16_saying_so_once(monkeypatch):
    """Below compute capability 8.0 inductor skips a bf16 graph (SkipFrame) and the run trains eager
    without a word: "auto" does not compile it, and says why."""
    _gpu(monkeypatch, (7, 5), triton=True)
    backend, reason = compile_backend("auto", CUDA, "bfloat16")
    assert backend is None and "no native bf16" in reason and "\n" not in reason
    assert compile_backend("auto", CUDA, "bfloat16") == (None, None)  # said once per process
    assert compile_backend("auto", CUDA, "float32") == ("inductor", None)
    assert compile_backend("inductor", CUDA, "bfloat16") == ("inductor", None)  # asked for by name


@pytest.mark.parametrize("gpu", ["Tesla T4", "NVIDIA H100 80GB HBM3"])
def test_auto_compiles_only_runs_long_enough_for_compiling_to_pay(monkeypatch, gpu):
    """The cpu presets train for seconds on a GPU; compiling them would cost minutes (Colab)."""
    _gpu(monkeypatch, (7, 5) if "T4" in gpu else (9, 0), triton=True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    for name in ("cpu-small", "cpu-small-adamw-qk", "cpu-deep"):
        config = train_preset(name)
        backend, reason = compile_backend("auto", CUDA, config.dtype, rank_training_flops(preset(name), config))
        assert backend is None and (reason is None or "less than the 300 s" in reason), name
    paper = train_preset("paper-128m")
    assert compile_backend("auto", CUDA, "float32", rank_training_flops(preset("paper-128m"), paper)) == \
        ("inductor", None)
    assert compile_backend("inductor", CUDA, "float32", 1.0) == ("inductor", None)


class Small(torch.nn.Module):
    """A model defined outside torch (dynamo compiles such a forward; torch.nn's own it steps into)."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(width, width), torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.nn.functional.gelu(self.inner(x)))


def _watched(backend: str, requested: str, said: list[str], width: int = 4):
    """A small model compiled as a run compiles its model (`compiled_forward`), and its eager twin."""
    torch.manual_seed(0)
    module = Small(width)
    return compiled_forward(module, requested, backend, said.append), module


def _step(forward, x: torch.Tensor) -> list[torch.Tensor]:
    """Loss and gradients of one training step through `forward`."""
    module = forward.eager if hasattr(forward, "eager") else forward
    module.zero_grad(set_to_none=True)
    loss = forward(x).square().mean()
    loss.backward()
    return [loss.detach(), *(p.grad for p in module.parameters())]


def test_a_backward_that_fails_to_compile_falls_back_to_eager_with_one_line():
    """AOT autograd compiles the backward lazily, at the first backward, out of the fallback's
    reach (the run would end there): the first step compiles it with the forward, so its failure
    is caught there too, and the step is the eager step."""
    def failing_backward(graph, example_inputs):
        raise RuntimeError("no kernel for this backward")

    torch._dynamo.register_backend(aot_autograd(fw_compiler=lambda graph, inputs: graph, bw_compiler=failing_backward),
                                   name="headlab_test_failing_backward")
    said, x = [], torch.randn(3, 4)
    forward, eager = _watched("headlab_test_failing_backward", "auto", said)
    assert all(torch.equal(a, b) for a, b in zip(_step(forward, x), _step(eager, x)))
    assert len(said) == 1 and "failed at the first step (" in said[0] and "no kernel for this backward" in said[0]


def test_a_model_that_dynamo_skips_is_said_not_trained_silently_eager():
    """inductor raises SkipFrame for bf16 on a T4: dynamo then runs the model eager, in silence."""
    @torch._dynamo.register_backend(name="headlab_test_skipping")
    def skipping(graph, example_inputs):
        raise torch._dynamo.exc.SkipFrame("BF16 is not supported")

    said = []
    forward, _ = _watched("headlab_test_skipping", "headlab_test_skipping", said)
    _step(forward, torch.randn(3, 4))
    assert len(said) == 1 and said[0].startswith("torch.compile (headlab_test_skipping) compiled nothing")


def _compiled_versions(module: torch.nn.Module) -> int:
    return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(type(module).forward.__code__))


def test_a_study_compiles_every_model_past_torchs_recompile_limit(monkeypatch):
    """A study's models (six variants, more under FSDP's per-block compiles) each add compiled
    versions of the same code: past torch's recompile limit the later ones trained eager in silence."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    said = []
    for width in (2, 3, 4):
        forward, module = _watched("eager", "eager", said, width)
        _step(forward, torch.randn(3, width))
    assert _compiled_versions(module) == 3 and said == []


def test_a_model_past_the_recompile_limit_trains_eager_saying_so(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    monkeypatch.setattr(compiling, "FIRST_STEP_RECOMPILE_LIMIT", 1)
    said = []
    for width in (2, 3):
        forward, module = _watched("eager", "eager", said, width)
        _step(forward, torch.randn(3, width))
    assert _compiled_versions(module) == 1
    assert len(said) == 1 and said[0].startswith("torch.compile (eager) hit its recompile limit")
