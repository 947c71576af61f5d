"""GGUF files (llama.cpp's format) as headlab reads them, through the `gguf` package: the
metadata, and every tensor memory-mapped and dequantised to float only when it is asked for.

    checkpoint = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    checkpoint.architecture                       # "llama", "gemma3", ...
    checkpoint.value("attention.head_count")      # <architecture>.attention.head_count
    checkpoint.tensor("blk.0.attn_q.weight")      # float (out, in), as a PyTorch Linear stores it

Every type that `gguf.quants.dequantize` knows is read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, the K-quants Q2_K … Q6_K, the IQ types); a type it does not know is one line naming the
tensor and the type. A file that is not GGUF, is cut short, or whose tensors do not fit it is one
line too. The tensors stay in the file (a read-only memory map): a tensor is dequantised when read,
so a model is never held whole in memory by this module.

How tensor names and row orders map onto the Hugging Face checkpoint a file was converted from:
`headlab.analysis.gguf_layouts`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from headlab.io.files import open_regular

GGUF_MAGIC = b"GGUF"
LONG_ARRAY = 64  # metadata arrays longer than this (the tokenizer's vocabulary) are not copied into `metadata`


def gguf_module():
    try:
        import gguf
    except ImportError as error:  # a dependency of headlab: only a broken environment lacks it
        raise RuntimeError("reading GGUF files needs the gguf package: pip install 'gguf>=0.10'") from error
    return gguf


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    type_name: str  # "F32", "Q4_K", ...
    shape: tuple[int, ...]  # numpy order: (rows, columns), as a PyTorch Linear weight


class GGUFCheckpoint:
    """One open GGUF file: `architecture`, scalar `metadata`, `tensors` (name → GGUFTensorInfo)
    and `tensor(name)`, dequantised on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        gguf = gguf_module()
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except (ValueError, IndexError, OSError, KeyError) as error:
            raise ValueError(f"{self.path} is not a readable GGUF file (truncated or corrupt?): {error}") from None
        self.metadata: dict[str, object] = {}
        self.array_lengths: dict[str, int] = {}
        for key, field in self._reader.fields.items():
            if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > LONG_ARRAY:
                self.array_lengths[key] = len(field.data)
            else:
                self.metadata[key] = _field_value(field, gguf)
        self._by_name = {t.name: t for t in self._reader.tensors}
        self.tensors = {t.name: GGUFTensorInfo(t.name, t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)))
                        for t in self._reader.tensors}
        architecture = self.metadata.get("general.architecture")
        if not isinstance(architecture, str):
            raise ValueError(f"{self.path} has no general.architecture: not a model GGUF file")
        self.architecture = architecture

    def value(self, key: str, default=None):
        """Metadata `<architecture>.<key>` (e.g. "block_count"), or `default` if the file has none."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def required(self, key: str) -> object:
        """Metadata `<architecture>.<key>`; its absence is one line naming it."""
        value = self.value(key)
        if value is None:
            raise ValueError(f"{self.path} lacks the metadata {self.architecture}.{key}: cannot read this "
                             f"{self.architecture} model")
        return value

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` in numpy (row-major, PyTorch Linear) order: F16, F32 and F64 as stored (a
        view of the file), every other type dequantised to float32."""
        if name not in self._by_name:
            raise ValueError(f"{self.path} has no tensor {name!r}: this {self.architecture} file is incomplete or "
                             "not laid out as llama.cpp writes the architecture")
        stored = self._by_name[name]
        gguf = gguf_module()
        try:
            floats = stored.data.dtype.kind == "f"  # F16/F32/F64 (BF16 is stored as bytes: dequantised)
            array = stored.data if floats else gguf.quants.dequantize(stored.data, stored.tensor_type)
        except (NotImplementedError, KeyError) as error:
            raise ValueError(f"{self.path}: tensor {name} is stored as {stored.tensor_type.name}, which gguf "
                             f"{_version(gguf)} cannot dequantise ({error})") from None
        expected = self.tensors[name].shape
        if array.shape != expected:
            raise ValueError(f"{self.path}: tensor {name} holds {array.shape} values where its header says {expected} "
                             "(truncated or corrupt file?)")
        return array


def _version(gguf) -> str:
    try:
        return version("gguf")
    except PackageNotFoundError:
        return getattr(gguf, "__version__", "(unknown version)")


def _field_value(field, gguf):
    """A metadata field's value: int, float, bool, str, or a list of them."""
    types = list(field.types)

    def scalar(kind, part):
        if kind == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        return part.tolist()[0]

    if types[0] == gguf.GGUFValueType.ARRAY:
        return [scalar(types[-1], field.parts[index]) for index in field.data]
    return scalar(types[0], field.parts[field.data[0]])


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, size: int, modified: int) -> GGUFCheckpoint:
    return GGUFCheckpoint(Path(path))


def open_gguf(path: str | Path) -> GGUFCheckpoint:
    """The GGUF file at `path`, opened once per process while it is unchanged (parsing the header
    of a 262k-token vocabulary takes seconds; the views of one model share it)."""
    path = Path(path)
    fd = open_regular(path)  # a regular file, reached through no link
    try:
        stat, magic = os.fstat(fd), os.pread(fd, 4, 0)
    finally:
        os.close(fd)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    return _open_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
