"""torch.compile by default where it can run, eager after one line where it cannot or fails."""

import re

import pytest
import torch
from torch._dynamo.utils import counters

from headlab import preset, train, train_preset
from headlab.training import compiling, hardware
from headlab.training import trainer as trainer_module
from headlab.training.compiling import compile_backend
from headlab.training.config import TrainConfig
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
    monkeypatch.setattr(trainer_module, "compile_backend", lambda requested, device: (FAILING_BACKEND, None))
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
    monkeypatch.setattr(hardware, "compile_backend", lambda requested, device: (FAILING_BACKEND, None))
    measure_step(preset("tiny", "mha"), train_preset("tiny", device="cpu", compile="auto"), repeats=1)
    assert compiling.UNAVAILABLE == {FAILING_BACKEND}
