"""Attention tensors from a state dict or from safetensors files, read lazily (one tensor at a time)
and widened to float64."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
from safetensors import SafetensorError, safe_open


def _to_float64(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().cpu()
        # numpy cannot hold 16-bit floats from torch; the widening itself is done by numpy, whose
        # single-threaded copy does not leave torch's worker threads spinning against BLAS.
        tensor = tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
        return tensor.numpy().astype(np.float64)
    return np.asarray(tensor, dtype=np.float64)


class TensorStore:
    """Read-only name → float64 array access; tensors are read only when asked for."""

    def __init__(self, names: Iterable[str], read: Callable[[str], object], where: str):
        self.names = set(names)
        self._read = read
        self.where = where

    @classmethod
    def from_mapping(cls, state: Mapping, where: str = "state dict") -> "TensorStore":
        return cls(state.keys(), state.__getitem__, where)

    @classmethod
    def from_safetensors(cls, files: list[Path]) -> "TensorStore":

        file_of = {}
        for file in files:
            if not Path(file).is_file():
                raise ValueError(f"{file} is missing: the checkpoint lists it but it is not on disk")
            try:
                with safe_open(str(file), framework="pt") as f:
                    file_of.update(dict.fromkeys(f.keys(), file))
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{file} is not a readable safetensors file (truncated or corrupt?): "
                                 f"{error}") from error

        def read(name: str):
            # framework="pt" reads bf16/fp16 too (numpy cannot hold bf16)
            with safe_open(str(file_of[name]), framework="pt") as f:
                return f.get_tensor(name)

        return cls(file_of, read, ", ".join(str(f) for f in files))

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> np.ndarray:
        """The tensor as float64; a missing tensor or a NaN/inf value is an error naming it."""
        if name not in self.names:
            raise ValueError(f"tensor {name!r} not found in {self.where}")
        array = _to_float64(self._read(name))
        bad = np.count_nonzero(~np.isfinite(array))
        if bad:
            raise ValueError(f"tensor {name!r} in {self.where} holds {bad} non-finite values (NaN or inf): "
                             "these weights cannot be analysed")
        return array

    def native(self, name: str):
        """The tensor as stored (a numpy array or torch tensor, not widened, not checked): what a
        model is loaded from, where a float64 copy of a large embedding would only cost memory."""
        if name not in self.names:
            raise ValueError(f"tensor {name!r} not found in {self.where}")
        return self._read(name)

    def under(self, prefix: str) -> "Prefixed":
        return Prefixed(self, prefix)

    def prefix_of(self, probe: str, layout: str) -> str:
        """The prefix ('', 'model.', 'bert.', ...) under which `probe` is stored."""
        hits = sorted(n[: len(n) - len(probe)] for n in self.names
                      if n.endswith(probe) and (n == probe or n[-len(probe) - 1] == "."))
        if not hits:
            raise ValueError(f"{self.where} has no tensor named '*{probe}': it is not a {layout} layout")
        return hits[0]


class Prefixed:
    """The tensors under one name prefix: `w(name)` reads prefix + name; `name in w` tests it."""

    def __init__(self, tensors: TensorStore, prefix: str):
        self.tensors, self.prefix = tensors, prefix

    def __call__(self, name: str) -> np.ndarray:
        return self.tensors[self.prefix + name]

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.tensors


def check_layer_count(tensors: TensorStore, probe: str, n_layers: int, where: str) -> None:
    """`probe` (a layer-0 tensor name) exists for layers 0..n_layers-1 and not for layer n_layers."""
    present = [i for i in (n_layers - 1, n_layers) if probe.replace(".0.", f".{i}.", 1) in tensors]
    if present != [n_layers - 1]:
        more = "have more" if n_layers in present else "have fewer"
        raise ValueError(f"{where} says {n_layers} layers, but the weights {more}: "
                         f"the layer count does not match the tensors in {tensors.where}")
