"""Checkpoints: the weights and training state of one step, written as one unit.

    checkpoint-00000040/          the current checkpoint, one unit:
        model.safetensors         weights (plain tensors; metadata: format=headlab, step)
        state.pt                  optimizer states (keyed by parameter name), data-generator and
                                  torch RNG state, step

A checkpoint's folder is first listed in the manifest as one to discard, then written (each file
hashed as it is written), and made current by atomically replacing the manifest, which then
lists the superseded folder to discard. A kill or a full disk at any instant therefore leaves a
manifest naming a complete checkpoint (or none: the run starts from step 0), and the next start
removes exactly the leftovers the manifest names (`headlab.io.Manifest`).

Every file is verified against its SHA-256 when read (under torchrun, by one rank per node), in chunks,
and read in bounded pieces on resume (`load_checkpoint`). `state.pt` is read with
`torch.load(weights_only=True)`, so nothing beyond tensors and plain containers is unpickled.
Weights and optimizer states are whole (gathered from FSDP shards) and keyed by parameter name,
so any number of processes, sharded or not, can resume a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as parse_safetensors
from safetensors.torch import save as serialize_safetensors

from headlab.io import Manifest, fsync_path, parse_json
from headlab.runs.layout import CHECKPOINT_PREFIX, FORMAT, MANIFEST, METRICS, run_manifest
from headlab.runs.metrics import MetricsLog
from headlab.runs.optimizer_state import load_named_state, named_state


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (full disk, permissions); the previous one is intact."""


READ_ATTEMPTS = 5  # reads of a checkpoint that a live trainer superseded meanwhile, before "busy"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: the folder holding model.safetensors and state.pt, as the run's
    manifest lists them."""

    manifest: Manifest
    name: str  # the folder's name
    step: int

    def __post_init__(self):
        self.manifest.file(self.name)  # read from a file: refused unless it stays inside the run

    @property
    def folder(self) -> Path:
        return self.manifest.file(self.name)

    @property
    def weights(self) -> str:
        return f"{self.name}/model.safetensors"

    @property
    def state(self) -> str:
        return f"{self.name}/state.pt"

    def read(self, name: str, verify: bool = True) -> bytes:
        return self.manifest.read_bytes(name, verify)

    def verify(self) -> None:
        """Hash state.pt and model.safetensors (in chunks) against the manifest; raises naming a damaged one."""
        for name in (self.state, self.weights):
            self.manifest.verify(name)


def current_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    """The checkpoint the run's manifest names (its files are verified when read); None if the
    run has none yet."""
    return checkpoint_of(run_manifest(run_dir))


def checkpoint_of(manifest: Manifest) -> Checkpoint | None:
    current = manifest.meta.get("checkpoint")
    if current is None:
        return None
    step = current.get("step") if isinstance(current, dict) else None
    if type(step) is not int or step < 0 or not isinstance(current.get("folder"), str):
        raise ValueError(f"{manifest.path} names no readable checkpoint (a folder and a whole step ≥ 0; it says "
                         f"{str(current)[:80]}): write the run again")
    return Checkpoint(manifest, current["folder"], step)


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether `run_dir` is a run holding trained weights (a finished run, or one to resume)."""
    path = Path(run_dir) / MANIFEST
    return path.is_file() and run_manifest(run_dir).meta.get("checkpoint") is not None


def read_current(run_dir: str | Path, names: tuple[str, ...]) -> tuple[Checkpoint, dict[str, bytes]] | None:
    """The current checkpoint and the verified content of its files `names` ("model.safetensors",
    "state.pt"), all of one checkpoint even while a live trainer replaces it: a read that the
    next checkpoint overtook is repeated. None if the run has no checkpoint yet."""
    for _ in range(READ_ATTEMPTS):
        manifest = run_manifest(run_dir)
        try:
            checkpoint = checkpoint_of(manifest)
            if checkpoint is None:
                return None
            return checkpoint, {name: checkpoint.read(f"{checkpoint.name}/{name}") for name in names}
        except ValueError:
            if run_manifest(run_dir).meta == manifest.meta:
                raise  # no newer checkpoint: the files were damaged
    raise RuntimeError(f"{run_dir} is busy: its trainer replaced the checkpoint {READ_ATTEMPTS} times while it was "
                       "being read; retry")


def checkpoint_step(run_dir: str | Path) -> int:
    """The step of the run's current checkpoint (0 when it has none), from its manifest alone."""
    checkpoint = current_checkpoint(run_dir) if (Path(run_dir) / MANIFEST).exists() else None
    return checkpoint.step if checkpoint is not None else 0


def state_dict_api():
    """torch.distributed.checkpoint's state-dict functions, imported when first used: with the
    DTensor modules they load, ~0.7 CPU-s that a process which only reads weights (an analysis,
    a report, a notebook) need not pay."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def is_fsdp_module(model: torch.nn.Module) -> bool:
    """Whether FSDP2 shards `model`, without importing FSDP: no module can be sharded before it is."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def _whole(cpu_offload: bool = False, strict: bool = True):
    return state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload, strict=strict)


def gathered_by_every_rank(model: torch.nn.Module, optimizers) -> bool:
    """Whether `gather_training_state` is a collective: the ranks hold shards of the model (FSDP)
    or of the optimizer state (a sharded step: `headlab.runs.optimizer_state`)."""
    return is_fsdp_module(model) or any(getattr(o, "shard", None) is not None for o in optimizers)


def gather_training_state(model: torch.nn.Module, optimizers) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The whole weights and optimizer states (keyed by parameter name) on the CPU. When the
    ranks hold shards (`gathered_by_every_rank`) every rank must call it and rank 0 receives
    the whole state; otherwise it is the local state."""

    if is_fsdp_module(model):
        api = state_dict_api()
        weights = api.get_model_state_dict(model, options=_whole(cpu_offload=True))
        states = [api.get_optimizer_state_dict(model, o, options=_whole(cpu_offload=True)) for o in optimizers]
    else:  # the whole model is here: its own state dict (the distributed API checks every module at each call)
        weights, states = model.state_dict(), [named_state(model, o) for o in optimizers]
    return {k: v.detach().contiguous().cpu() for k, v in weights.items()}, states


def save_checkpoint(run_dir: Path, weights: dict[str, torch.Tensor], optimizer_states: list[dict],
                    generator: torch.Generator, step: int, metrics: MetricsLog) -> None:
    """Write model.safetensors and state.pt (both recording `step`; the states as from
    `gather_training_state`) as one new step folder and make it current by replacing the
    manifest (with `metrics` hashed up to here); then delete the checkpoint it supersedes.
    Raises `CheckpointWriteFailed` (the previous checkpoint intact) if the disk refuses a write."""
    state = {"step": step, "optimizers": optimizer_states,
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state()}
    manifest = run_manifest(run_dir)
    checkpoint = Checkpoint(manifest, f"{CHECKPOINT_PREFIX}{step:08d}", step)
    previous = checkpoint_of(manifest)
    committed = False
    try:
        if checkpoint.name not in manifest.discard:
            manifest.discard.append(checkpoint.name)  # ours from its first byte: a kill leaves it to remove
            manifest.save()
        for name, write in ((checkpoint.state, lambda file: torch.save(state, file)),
                            (checkpoint.weights, lambda file: file.write(serialize_safetensors(
                                weights, metadata={"format": FORMAT, "step": str(step)})))):
            manifest.write(name, write)
            manifest.retire(name)  # not the run's state until the manifest names the checkpoint: a kill removes it
            manifest.save()
        fsync_path(run_dir)
        for name in (checkpoint.state, checkpoint.weights):
            manifest.files[name] = manifest.retired.pop(name)
        manifest.files[METRICS] = metrics.entry
        manifest.meta["checkpoint"] = {"step": step, "folder": checkpoint.name}
        manifest.discard = [previous.name] if previous is not None else []
        for name in [n for n in manifest.files if n.startswith(previous.name + "/")] if previous is not None else []:
            manifest.retire(name)
        manifest.save()
        committed = True
    except (OSError, SafetensorError, RuntimeError) as error:  # torch.save reports a full disk as RuntimeError
        needed = sum(t.numel() * t.element_size() for t in weights.values())
        raise CheckpointWriteFailed(
            f"could not write the step-{step} checkpoint in {run_dir} "
            f"({_describe_write_error(error, run_dir, needed)}); "
            "the previous checkpoint is intact: free space or fix permissions, then resume (--resume)") from error
    finally:
        if not committed:
            with contextlib.suppress(OSError):  # a full disk: the next start removes what is listed
                manifest.remove_leftovers()
    try:
        manifest.remove_leftovers()  # a file it cannot delete is kept on record and warned about
    except OSError as error:  # the step is saved: a superseded checkpoint left behind stops nothing
        warnings.warn(f"the step-{step} checkpoint is saved, but the one it supersedes could not be removed "
                      f"({os.strerror(error.errno) if error.errno else error}); the next checkpoint tries again",
                      stacklevel=2)


def _describe_write_error(error: BaseException, folder: Path, needed: int) -> str:
    """What went wrong, in words: torch and safetensors report a full disk in their own terms."""
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno) + (f": {error.filename}" if error.filename else "")
    free = shutil.disk_usage(folder).free
    if free < needed:
        return f"No space left on device: {free:,} bytes free, the weights alone take {needed:,}"
    return f"{type(error).__name__}: {str(error)[:300]}"


def _unreadable_weights(where: Path, error: Exception) -> ValueError:
    return ValueError(f"{where} is not a readable safetensors file (truncated or corrupt?): {error}")


def _check_format(metadata: dict, where: Path) -> None:
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{where} was not written by headlab (metadata format={metadata.get('format')!r})")


def parse_weights(data: bytes, where: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and metadata of a headlab safetensors file's (verified) content."""
    try:
        weights = parse_safetensors(data)
        header_size = int.from_bytes(data[:8], "little")
        header = parse_json(data[8:8 + header_size], where)
        metadata = (header.get("__metadata__") if isinstance(header, dict) else None) or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise _unreadable_weights(where, error) from error
    _check_format(metadata, where)
    return weights, metadata


def _parse_state(file: Path, where: Path) -> dict:
    """state.pt memory-mapped (`torch.load(mmap=True)`): its tensors are views of the file's
    pages, read as they are copied where they go, so no copy of the whole file is made, and the
    ranks of a node share one in the page cache."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # truncated zip, foreign pickle (refused by weights_only), ...
        raise ValueError(f"{where} is not a readable headlab training state (truncated, corrupt or foreign): "
                         f"{type(error).__name__}: {str(error)[:300]}") from error
    if not isinstance(state, dict) or not {"step", "optimizers", "generator"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{where} is not a headlab training state (keys: {keys})")
    return state


def _check_weights(shapes: dict[str, torch.Size], model: torch.nn.Module, where: Path) -> list[str]:
    """The model's weight names in its order, once `shapes` (name -> shape, as a file holds them)
    are this model configuration's: in that order on every rank, since safetensors lists names
    in a hash order that differs between processes, and FSDP scatters the tensors one by one in
    the order given."""
    expected = model.state_dict()
    if set(shapes) != set(expected) or any(shapes[k] != expected[k].shape for k in expected):
        raise ValueError(f"{where} does not hold weights for this model configuration")
    return list(expected)


def _non_finite(weights: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]


def _refuse_non_finite(bad: list[str], where: Path) -> None:
    if bad:
        raise ValueError(f"{where} holds non-finite (NaN or inf) values in {', '.join(bad[:5])}")


def _weight_loader(model: torch.nn.Module):
    """A function that loads some of `model`'s weights ({name: tensor}, names already checked by
    `_check_weights`) into it: an FSDP model's through torch.distributed.checkpoint (each rank keeps
    its shard); a plain model's copied in place into its own state-dict tensors, without that API,
    whose import costs a process that only reads weights ~0.7-1.7 s and which checks every module at
    each call (a resume loads tensor by tensor)."""
    if is_fsdp_module(model):
        return lambda tensors: state_dict_api().set_model_state_dict(model, tensors, options=_whole(strict=False))
    own = model.state_dict()

    def load(tensors: dict[str, torch.Tensor]) -> None:
        for name, tensor in tensors.items():
            own[name].copy_(tensor)
    return load


def set_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: Path) -> None:
    """Load whole weights into `model` (plain, or FSDP-sharded: each rank keeps its shard),
    refused unless they are this model configuration's and finite."""
    order = _check_weights({k: v.shape for k, v in weights.items()}, model, where)
    _refuse_non_finite(_non_finite(weights), where)
    _weight_loader(model)({k: weights[k] for k in order})


def _stream_weights(model: torch.nn.Module, file: Path, where: Path) -> dict:
    """`set_weights` from a safetensors file read one tensor at a time (`safe_open`, which maps
    the file): the host holds one tensor beyond the model, not the file and a parsed copy.
    A tensor found non-finite stops the load with the model partly loaded (the resume fails).
    Returns the file's metadata."""
    try:
        with safe_open(file, framework="pt") as weights:
            metadata = weights.metadata() or {}
            _check_format(metadata, where)
            order = _check_weights({k: torch.Size(weights.get_slice(k).get_shape()) for k in weights.keys()},
                                   model, where)
            load = _weight_loader(model)
            for name in order:
                tensor = {name: weights.get_tensor(name)}
                _refuse_non_finite(_non_finite(tensor), where)
                load(tensor)
    except (SafetensorError, OSError) as error:
        raise _unreadable_weights(where, error) from error
    return metadata


def _own_memory(optimizer: torch.optim.Optimizer) -> None:
    """Give the optimizer's CPU state tensors memory of their own: loaded for a CPU model they
    are still views of state.pt's memory map (torch keeps a tensor already on the right device
    and dtype), which would hold that file's pages, and its disk space once the next
    checkpoint deletes it, for the rest of the run. One tensor at a time."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                state[key] = value.clone()


def load_checkpoint(checkpoint: Checkpoint, model: torch.nn.Module, optimizers, generator: torch.Generator,
                    verified: bool = False) -> int:
    """Restore weights, optimizer and RNG state from `checkpoint` into a plain or FSDP-sharded
    model (every rank reads the whole files, each verified unless this node has just `verified`
    them: `Checkpoint.verify`); returns the step reached. The files are hashed in chunks and
    read in bounded pieces (`_stream_weights` tensor by tensor, state.pt memory-mapped), so a
    rank's host memory never holds a whole file nor a parsed copy of one (110 GB per rank at 6.3B)."""

    state_path = checkpoint.manifest.file(checkpoint.state)
    weights_path = checkpoint.manifest.file(checkpoint.weights)
    with checkpoint.manifest.opened(checkpoint.state, verify=not verified) as state_file:
        try:
            state = _parse_state(state_file, state_path)
        except ValueError as error:
            raise ValueError(f"{error}. Without it the weights beside it cannot be resumed exactly (no optimizer or "
                             "data-order state); load them with load_run, or train into a new folder") from None
    with checkpoint.manifest.opened(checkpoint.weights, verify=not verified) as weights_file:
        metadata = _stream_weights(model, weights_file, weights_path)
    step = int(metadata.get("step", 0))
    if step != state["step"] or step != checkpoint.step:
        raise ValueError(f"{checkpoint.folder}: model.safetensors is at step {step}, state.pt at step {state['step']}, "
                         f"the manifest says {checkpoint.step}")
    if len(state["optimizers"]) != len(optimizers):
        raise ValueError(f"{state_path} holds {len(state['optimizers'])} optimizer states, expected {len(optimizers)}")
    for optimizer, optimizer_state in zip(optimizers, state["optimizers"]):
        if is_fsdp_module(model):
            state_dict_api().set_optimizer_state_dict(model, optimizer, optimizer_state, options=_whole())
        else:
            load_named_state(model, optimizer, optimizer_state, state_path)
        _own_memory(optimizer)
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return step

