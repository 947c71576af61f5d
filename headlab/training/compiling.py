"""Which `torch.compile` backend a run trains with (`TrainConfig.compile`), and the step that
falls back to eager when compiling fails.

`compile` is "auto" (the default), "off", or a backend of `torch.compile`. "auto" compiles with
inductor where its kernels can run: a CUDA device of compute capability 7.0 or later (Triton's
floor) with Triton installed; elsewhere the run is eager, and on a GPU one line says why. A named
backend ("inductor", "aot_eager", ...) compiles on any device, so the CPU tests run the compiled
distributed paths with "aot_eager" (dynamo and AOT autograd without code generation).

"auto" also leaves eager, in one line, a bf16 run on a GPU without native bf16 (below compute
capability 8.0: inductor would skip the model, SkipFrame, and train it eager in silence) and a run
whose whole training would take less than `COMPILE_PAYS_AFTER_S` eager on this GPU (the cpu presets
on Colab's T4: compiling would cost more minutes than it saves). Wherever torch.compile itself
falls back to eager without an error (a frame dynamo skipped, the recompile limit), the run says
so in one line (`FirstCallFallback`).
"""

from __future__ import annotations

import importlib.util
from contextlib import ExitStack
from typing import Callable

import torch

from headlab.training.config import AUTO_COMPILE, GPU_BACKEND, NO_COMPILE
from headlab.training.gpus import gpu_peak

TRITON_CAPABILITY = (7, 0)  # Triton, inductor's GPU code generator, needs Volta or later
BF16_CAPABILITY = (8, 0)  # native bf16 (Ampere): below it inductor skips a bf16 graph (SkipFrame)
# "auto" compiles a run only if it would train at least this long eager: compiling a model takes
# about a minute or two and saves at most about half of each step, so a shorter run loses time.
COMPILE_PAYS_AFTER_S = 300.0
EAGER_MFU = 0.3  # of the GPU's peak: a generous guess at eager speed, so the estimate errs short
# The recompile limit while a model compiles its first step: each model of a study (six variants,
# the training notice's timing, FSDP's per-block compiles) adds its own entries to the same code
# objects, and torch's default (8) would leave a study's later models eager.
FIRST_STEP_RECOMPILE_LIMIT = 64


# Backends "auto" found unable to run in this process (a compile failed, or the GPU or Triton
# cannot run it): it trains eager from then on, without a second attempt (minutes of compiling
# to fail again) or a second line for every run of a study.
UNAVAILABLE: set[str] = set()


def compile_backend(requested: str, device: torch.device, dtype: str = "float32",
                    run_flops: float | None = None) -> tuple[str | None, str | None]:
    """(the backend a run on `device` compiles with, or None for eager; why "auto" leaves a GPU
    run eager, said once per process: None when there is nothing new to say). `dtype` is the run's
    (TrainConfig.dtype) and `run_flops` the FLOPs of its training, if known (headlab.training.flops)."""
    if requested == NO_COMPILE:
        return None, None
    if requested != AUTO_COMPILE:
        return requested, None
    if device.type != "cuda" or GPU_BACKEND in UNAVAILABLE:
        return None, None
    capability = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if capability < TRITON_CAPABILITY:
        UNAVAILABLE.add(GPU_BACKEND)
        return None, (f"not compiling: {name} has compute capability "
                      f"{capability[0]}.{capability[1]}, below the {TRITON_CAPABILITY[0]}.{TRITON_CAPABILITY[1]} "
                      "that torch.compile's GPU kernels (Triton) need; training eager")
    if importlib.util.find_spec("triton") is None:
        UNAVAILABLE.add(GPU_BACKEND)
        return None, ("not compiling: Triton, which torch.compile's GPU kernels need, is not installed "
                      "(pip install triton); training eager")
    if dtype == "bfloat16" and capability < BF16_CAPABILITY:
        return None, _once(f"not compiling: {name} (compute capability {capability[0]}.{capability[1]}) has no "
                           "native bf16, so torch.compile would skip the model and train it eager anyway; training "
                           "eager (--set dtype=float32 compiles)")
    eager_s = _eager_seconds(run_flops, name, dtype)
    if eager_s is not None and eager_s < COMPILE_PAYS_AFTER_S:
        return None, _once(f"not compiling: this run trains in about {eager_s:.0f} s eager on {name}, less than "
                           f"the {COMPILE_PAYS_AFTER_S:.0f} s from which compiling saves more than it costs; "
                           "training eager (--set compile=inductor compiles anyway)")
    return GPU_BACKEND, None


def _eager_seconds(run_flops: float | None, gpu_name: str, dtype: str) -> float | None:
    """A short estimate of a run's eager training time on `gpu_name` (None when either is unknown)."""
    peak = gpu_peak(gpu_name, dtype) if run_flops is not None else None
    return None if peak is None else run_flops / (EAGER_MFU * peak[1] * 1e12)


_SAID: set[str] = set()  # the lines "auto" has said in this process (a study's runs share them)


def _once(line: str) -> str | None:
    if line in _SAID:
        return None
    _SAID.add(line)
    return line


def compiled_forward(module: torch.nn.Module, requested: str, backend: str | None,
                     say: Callable[[str], None]) -> Callable:
    """`module` as a run with `TrainConfig.compile = requested` calls it: compiled with `backend`
    (None: `module` itself), its first call watched (`FirstCallFallback`): under "auto", where
    compiling was not asked for, falling back to `module` if the compile fails; a backend asked
    for by name fails as torch.compile does. Either way a silent fall back to eager is said."""
    if backend is None:
        return module
    compiled = torch.compile(module, backend=backend)
    return FirstCallFallback(compiled, module, backend, say, falls_back=requested == AUTO_COMPILE)


def first_step_compiling() -> ExitStack:
    """What the first (compiling) call of a model runs under, so that no failure goes unseen:
    the backward compiled with the forward (AOT autograd compiles it lazily, at the first
    backward, out of reach of the fallback, where a failure would end the run), the recompile
    limit raised for a study's many models (FIRST_STEP_RECOMPILE_LIMIT) and made an error when
    still hit, instead of a silent eager frame. Options a torch does not have are left alone."""
    stack = ExitStack()
    dynamo, functorch = torch._dynamo.config, torch._functorch.config
    patches = [(functorch, {"force_non_lazy_backward_lowering": True}),
               (dynamo, {"fail_on_recompile_limit_hit": True,
                         "recompile_limit": max(FIRST_STEP_RECOMPILE_LIMIT, getattr(dynamo, "recompile_limit", 0)),
                         "accumulated_recompile_limit": max(8 * FIRST_STEP_RECOMPILE_LIMIT,
                                                            getattr(dynamo, "accumulated_recompile_limit", 0))})]
    for config, options in patches:
        present = {key: value for key, value in options.items() if hasattr(config, key)}
        if present:
            stack.enter_context(config.patch(**present))
    return stack


class FirstCallFallback:
    """Calls `compiled`, and watches its first call, in which torch.compile compiles
    (`first_step_compiling`): should it fail to compile (a missing compiler, an unsupported
    operation, a backward that does not compile), it calls `eager` from then on after one line to
    `say`, and records `backend` in `UNAVAILABLE`, when `falls_back` (else it raises as
    torch.compile does). Nothing has run when the compile fails, so the eager call that replaces
    it trains as if it had been eager from the start. Should torch.compile have fallen back to
    eager by itself (the recompile limit; a model dynamo skipped, leaving no compiled code), one
    line says so, with either `falls_back`. Later failures are errors like any other."""

    def __init__(self, compiled: Callable, eager: Callable, backend: str, say: Callable[[str], None],
                 falls_back: bool = True):
        self.compiled, self.eager, self.backend, self.say, self.falls_back = compiled, eager, backend, say, falls_back
        self.forward: Callable | None = None

    def __call__(self, *args, **kwargs):
        if self.forward is not None:
            return self.forward(*args, **kwargs)
        try:
            with first_step_compiling():
                output = self.compiled(*args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            return self._eager_from_now(f"torch.compile ({self.backend}) hit its recompile limit "
                                        f"({FIRST_STEP_RECOMPILE_LIMIT} compiled versions of this model's code in "
                                        "this process); training eager", *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            if not self.falls_back:
                raise
            cause = getattr(error, "inner_exception", error)  # what the backend raised, not dynamo's wrapper
            reason = (f"{type(cause).__name__}: {cause}".splitlines() or [""])[0][:200]
            UNAVAILABLE.add(self.backend)
            return self._eager_from_now(f"torch.compile ({self.backend}) failed at the first step ({reason}); "
                                        "training eager, as every later run of this process will (--compile off "
                                        "skips the attempt)", *args, **kwargs)
        self.forward = self.compiled
        if not compiled_code(self.eager):
            self.say(f"torch.compile ({self.backend}) compiled nothing at the first step (dynamo skipped the model: "
                     "TORCH_LOGS=graph_breaks says why); training eager")
        return output

    def _eager_from_now(self, line: str, *args, **kwargs):
        self.say(line)
        self.forward = self.eager
        return self.eager(*args, **kwargs)


def compiled_code(module: Callable) -> bool:
    """Whether dynamo holds compiled code for `module`'s forward (True where this torch cannot tell)."""
    entries = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
    forward = getattr(type(module), "forward", None)
    if entries is None or forward is None:
        return True
    return bool(entries(forward.__code__))
