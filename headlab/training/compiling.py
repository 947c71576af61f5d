"""Which `torch.compile` backend a run trains with (`TrainConfig.compile`), and the step that
falls back to eager when compiling fails.

`compile` is "auto" (the default), "off", or a backend of `torch.compile`. "auto" compiles with
inductor where its kernels can run: a CUDA device of compute capability 7.0 or later (Triton's
floor) with Triton installed; elsewhere the run is eager, and on a GPU one line says why. A named
backend ("inductor", "aot_eager", ...) compiles on any device, so the CPU tests run the compiled
distributed paths with "aot_eager" (dynamo and AOT autograd without code generation).
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from headlab.training.config import AUTO_COMPILE, GPU_BACKEND, NO_COMPILE

TRITON_CAPABILITY = (7, 0)  # Triton, inductor's GPU code generator, needs Volta or later


# Backends "auto" found unable to run in this process (a compile failed, or the GPU or Triton
# cannot run it): it trains eager from then on, without a second attempt (minutes of compiling
# to fail again) or a second line for every run of a study.
UNAVAILABLE: set[str] = set()


def compile_backend(requested: str, device: torch.device) -> tuple[str | None, str | None]:
    """(the backend a run on `device` compiles with, or None for eager; why "auto" leaves a GPU
    run eager, said once per process: None when there is nothing new to say)."""
    if requested == NO_COMPILE:
        return None, None
    if requested != AUTO_COMPILE:
        return requested, None
    if device.type != "cuda" or GPU_BACKEND in UNAVAILABLE:
        return None, None
    capability = torch.cuda.get_device_capability(device)
    if capability < TRITON_CAPABILITY:
        UNAVAILABLE.add(GPU_BACKEND)
        return None, (f"not compiling: {torch.cuda.get_device_name(device)} has compute capability "
                      f"{capability[0]}.{capability[1]}, below the {TRITON_CAPABILITY[0]}.{TRITON_CAPABILITY[1]} "
                      "that torch.compile's GPU kernels (Triton) need; training eager")
    if importlib.util.find_spec("triton") is None:
        UNAVAILABLE.add(GPU_BACKEND)
        return None, ("not compiling: Triton, which torch.compile's GPU kernels need, is not installed "
                      "(pip install triton); training eager")
    return GPU_BACKEND, None


def compiled_forward(module: torch.nn.Module, requested: str, backend: str | None,
                     say: Callable[[str], None]) -> Callable:
    """`module` as a run with `TrainConfig.compile = requested` calls it: compiled with `backend`
    (None: `module` itself), and under "auto", where compiling was not asked for, falling back
    to `module` if the compile fails (`FirstCallFallback`); a backend asked for by name fails as
    torch.compile does."""
    if backend is None:
        return module
    compiled = torch.compile(module, backend=backend)
    return FirstCallFallback(compiled, module, backend, say) if requested == AUTO_COMPILE else compiled


class FirstCallFallback:
    """Calls `compiled` and, should its first call fail to compile (torch.compile compiles on
    that call: a missing compiler, an unsupported operation), calls `eager` from then on, after
    one line to `say`, and records `backend` in `UNAVAILABLE`. Nothing has run when the compile fails,
    so the eager call that replaces it trains as if it had been eager from the start. Later
    failures are errors like any other."""

    def __init__(self, compiled: Callable, eager: Callable, backend: str, say: Callable[[str], None]):
        self.compiled, self.eager, self.backend, self.say = compiled, eager, backend, say
        self.forward: Callable | None = None

    def __call__(self, *args, **kwargs):
        if self.forward is not None:
            return self.forward(*args, **kwargs)
        try:
            output = self.compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            cause = getattr(error, "inner_exception", error)  # what the backend raised, not dynamo's wrapper
            reason = (f"{type(cause).__name__}: {cause}".splitlines() or [""])[0][:200]
            self.say(f"torch.compile ({self.backend}) failed at the first step ({reason}); training eager, "
                     "as every later run of this process will (--compile off skips the attempt)")
            UNAVAILABLE.add(self.backend)
            self.forward = self.eager
            return self.eager(*args, **kwargs)
        self.forward = self.compiled
        return output
