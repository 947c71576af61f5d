"""Run folders that never lose work, and are never mistaken for another.

    manifest.json                 what headlab wrote here: each file's size and SHA-256, the
                                  current checkpoint {"step": 40, "folder": "checkpoint-00000040"}
    config.json                   model + training config, data identity, headlab version, git commit
    tokenizer.json                the trained BPE, for runs on a `bpe:<vocab>` tokenizer
    metrics.jsonl                 one JSON record per log/eval line (the manifest hashes it up to
                                  the current checkpoint; lines after it are a cut-short run's)
    checkpoint-00000040/          the current checkpoint, one unit:
        model.safetensors         weights (plain tensors; metadata: format=headlab, step)
        state.pt                  optimizer states (keyed by parameter name), data-generator and
                                  torch RNG state, step
    starts.jsonl                  one record per start or resume: the step, how it executes (processes,
                                  threads, device, compile, ...) and what changed since the previous start
    snapshots/                    analysis snapshots (`headlab.training.snapshots`), also listed
    .lock                         held (flock) by the one trainer writing the folder

A checkpoint's folder is first listed in the manifest as one to discard, then written (each file
hashed as it is written), and made current by atomically replacing the manifest, which then
lists the superseded folder to discard. A kill or a full disk at any instant therefore leaves a
manifest naming a complete checkpoint (or none: the run starts from step 0), and the next start
removes exactly the leftovers the manifest names (`headlab.io.Manifest`). A folder without a
manifest is not a run: `train` refuses it unless it is empty.

Every file is verified against its SHA-256 when read. `state.pt` is read with
`torch.load(weights_only=True)`, so nothing beyond tensors and plain containers is unpickled.
Weights and optimizer states are whole (gathered from FSDP shards) and keyed by parameter name,
so any number of processes, sharded or not, can resume a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load as parse_safetensors
from safetensors.torch import save as serialize_safetensors
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from headlab.data.bpe import TOKENIZER_FILE
from headlab.io import Manifest, append_line, atomic_write_bytes, fsync_path, mismatch, read_regular
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.package import installed_version
from headlab.training.config import TrainConfig

FORMAT = "headlab"
MANIFEST = "manifest.json"
RUN = "a headlab run"
METRICS = "metrics.jsonl"
CHECKPOINT_PREFIX = "checkpoint-"
DATA_IDENTITY = ("tokenizer", "vocab_size", "n_train_tokens", "n_val_tokens", "sha256")
# How the training is spread over processes and run, not what is trained: a run may resume under
# others, and starts.jsonl records each start's.
EXECUTION_FIELDS = ("parallel", "grad_accum", "snapshot_every", "compile", "device")
STARTS = "starts.jsonl"


@dataclass
class Run:
    """A trained model with its configs and metrics (and its folder, if it has one)."""

    model: GPT | None  # None on the ranks other than 0 after FSDP training (rank 0 holds it whole)
    model_config: ModelConfig
    train_config: TrainConfig
    step: int  # optimizer steps behind `model`'s weights
    metrics: list[dict] = field(default_factory=list)  # may run past `step` if a run was cut short
    path: Path | None = None

    def val_losses(self) -> list[dict]:
        return [r for r in self.metrics if "val_loss" in r]

    @property
    def final_val_loss(self) -> float | None:
        evals = self.val_losses()
        return evals[-1]["val_loss"] if evals else None

    def metrics_frame(self):
        return pd.DataFrame(self.metrics)


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (full disk, permissions); the previous one is intact."""


# ---- metrics ------------------------------------------------------------------------------

class MetricsLog:
    """Records in memory, appended line by line to `metrics.jsonl` (flushed each time) and hashed
    as they are written, so a checkpoint records the file's SHA-256 up to its step. With
    `write=False` (the ranks other than 0) the file is only read: on resume, every rank holds
    the same records."""

    def __init__(self, path: Path | None, write: bool = True):
        self.path = path
        self.write = write
        self.records: list[dict] = []
        self.digest, self.size = hashlib.sha256(), 0

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.path is not None and self.write:
            line = (json.dumps(record) + "\n").encode()
            append_line(self.path, line)
            self.digest.update(line)
            self.size += len(line)

    @property
    def entry(self) -> dict:
        return {"bytes": self.size, "sha256": self.digest.hexdigest()}

    def reset(self) -> None:
        self.records, self.digest, self.size = [], hashlib.sha256(), 0
        if self.path is not None and self.write:
            atomic_write_bytes(self.path, b"")

    def truncate_after(self, step: int) -> None:
        """Keep the records up to `step`, the current checkpoint's: the part of the file its
        manifest hashed (what a cut-short run wrote after it is dropped)."""
        if self.path is not None:
            data, verified = _metrics_bytes(self.path)
            if self.write:
                atomic_write_bytes(self.path, data[:verified])
            self.records = [r for r in _parse_metrics(self.path, data[:verified]) if r["step"] <= step]
            self.digest, self.size = hashlib.sha256(data[:verified]), verified


def _metrics_bytes(path: Path) -> tuple[bytes, int]:
    """A run's metrics.jsonl and the length of its start that the manifest hashed (checked)."""
    manifest = run_manifest(path.parent)
    entry = manifest.files.get(METRICS, {"bytes": 0, "sha256": hashlib.sha256().hexdigest()})
    try:
        data = read_regular(path)
    except FileNotFoundError:
        data = b""
    if hashlib.sha256(data[:entry["bytes"]]).hexdigest() != entry["sha256"]:
        raise mismatch(path, manifest.path)
    return data, entry["bytes"]


def read_metrics(path: Path) -> list[dict]:
    """Records of a run's metrics.jsonl: the part its manifest hashed is verified, then what a
    cut-short run appended after its last checkpoint. A half-written last line (a killed run) is
    dropped; any other line that is not a JSON record with an integer `step` is an error naming
    file and line."""
    return _parse_metrics(Path(path), _metrics_bytes(Path(path))[0])


def _parse_metrics(path: Path, data: bytes) -> list[dict]:
    lines = data.decode("utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path} line {number} is not a JSON record ({error.msg}): the metrics are corrupt; "
                             "repair or delete that line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path} line {number} is not a metrics record (a JSON object with an integer "
                             "'step'): repair or delete that line")
        records.append(record)
    return records


# ---- config.json --------------------------------------------------------------------------

def _git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def data_identity(corpus) -> dict:
    """What identifies the tokens a run trains on: corpus name, tokenizer, split sizes, content hash."""
    return {"name": corpus.name, "tokenizer": corpus.tokenizer_name, "vocab_size": corpus.vocab_size,
            "bytes_per_token": corpus.bytes_per_token, "n_train_tokens": corpus.n_train_tokens,
            "n_val_tokens": corpus.n_val_tokens, "sha256": corpus.sha256}


def write_run_config(manifest: Manifest, model_config: ModelConfig, train_config: TrainConfig, corpus) -> None:
    payload = {
        "format": FORMAT,
        "headlab_version": installed_version(),
        "git_commit": _git_commit(),
        "model": model_config.to_dict(),
        "train": asdict(train_config),
        "data": data_identity(corpus),
    }
    manifest.write_bytes("config.json", json.dumps(payload, indent=2).encode())
    if corpus.tokenizer_name.startswith("bpe:"):  # trained on this corpus: the run keeps its own copy
        manifest.write_bytes(TOKENIZER_FILE, read_regular(corpus.folder / TOKENIZER_FILE))


def run_manifest(run_dir: str | Path) -> Manifest:
    return Manifest.read(Path(run_dir), MANIFEST, RUN)


def read_config(run_dir: Path) -> dict:
    path = Path(run_dir) / "config.json"
    try:
        payload = json.loads(run_manifest(run_dir).read_bytes("config.json"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "model" not in payload:
        raise ValueError(f"{path} is not a headlab run config (no format='{FORMAT}' and 'model' entry)")
    return payload


def _differences(section: str, saved: dict, given: dict) -> list[str]:
    missing = object()
    return [f"{section}.{k}: saved {saved.get(k, '(absent)')!r}, given {given.get(k, '(absent)')!r}"
            for k in sorted(set(saved) | set(given), key=str) if saved.get(k, missing) != given.get(k, missing)]


def resume_differences(run_dir: Path, model_config: ModelConfig, train_config: TrainConfig, corpus) -> list[str]:
    """Each setting in which (model_config, train_config, corpus) differs from the run saved in
    `run_dir`, as 'section.field: saved X, given Y'. Data is compared by identity (tokenizer,
    split sizes, content hash). The
    `EXECUTION_FIELDS` (FSDP or DDP, gradient accumulation, analysis snapshots) may differ."""
    payload = read_config(run_dir)
    differences = _differences("model", ModelConfig.from_dict(payload["model"]).to_dict(), model_config.to_dict())
    what = lambda config: {k: v for k, v in asdict(config).items() if k not in EXECUTION_FIELDS}
    differences += _differences("train", what(TrainConfig.from_dict(payload.get("train", {}))), what(train_config))
    saved_data, given_data = payload.get("data", {}), data_identity(corpus)
    differences += _differences("data", {k: saved_data[k] for k in DATA_IDENTITY if k in saved_data},
                                {k: given_data[k] for k in DATA_IDENTITY})
    return differences


# ---- checkpoints --------------------------------------------------------------------------

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

    def read(self, name: str) -> bytes:
        return self.manifest.read_bytes(name)


def current_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    """The checkpoint the run's manifest names (its files are verified when read); None if the
    run has none yet."""
    return checkpoint_of(run_manifest(run_dir))


def checkpoint_of(manifest: Manifest) -> Checkpoint | None:
    current = manifest.meta.get("checkpoint")
    if current is None:
        return None
    try:
        return Checkpoint(manifest, current["folder"], int(current["step"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{manifest.path} names no readable checkpoint ({error}): write the run again") from None


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


def _whole(cpu_offload: bool = False):
    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def gather_training_state(model: torch.nn.Module, optimizers) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The whole weights and optimizer states (keyed by parameter name) on the CPU. With an
    FSDP-sharded model every rank must call it (it all-gathers the shards) and only rank 0
    receives the tensors; otherwise it is a copy of the local state."""

    weights = get_model_state_dict(model, options=_whole(cpu_offload=True))
    return ({k: v.detach().contiguous().cpu() for k, v in weights.items()},
            [get_optimizer_state_dict(model, o, options=_whole(cpu_offload=True)) for o in optimizers])


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
    manifest.remove_leftovers()


def _describe_write_error(error: BaseException, folder: Path, needed: int) -> str:
    """What went wrong, in words: torch and safetensors report a full disk in their own terms."""
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno) + (f": {error.filename}" if error.filename else "")
    free = shutil.disk_usage(folder).free
    if free < needed:
        return f"No space left on device: {free:,} bytes free, the weights alone take {needed:,}"
    return f"{type(error).__name__}: {str(error)[:300]}"


def parse_weights(data: bytes, where: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and metadata of a headlab safetensors file's (verified) content."""
    try:
        weights = parse_safetensors(data)
        header_size = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8:8 + header_size]).get("__metadata__") or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{where} is not a readable safetensors file (truncated or corrupt?): {error}") from error
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{where} was not written by headlab (metadata format={metadata.get('format')!r})")
    return weights, metadata


def _parse_state(data: bytes, where: Path) -> dict:
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, foreign pickle (refused by weights_only), ...
        raise ValueError(f"{where} is not a readable headlab training state (truncated, corrupt or foreign): "
                         f"{type(error).__name__}: {str(error)[:300]}") from error
    if not isinstance(state, dict) or not {"step", "optimizers", "generator"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{where} is not a headlab training state (keys: {keys})")
    return state


def _load_weights_into(model: torch.nn.Module, data: bytes, where: Path) -> int:
    """Load whole weights into `model` (plain, or FSDP-sharded: each rank keeps its shard)."""

    weights, metadata = parse_weights(data, where)
    expected = model.state_dict()
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"{where} does not hold weights for this model configuration")
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{where} holds non-finite (NaN or inf) values in {', '.join(bad[:5])}")
    # In the model's order: safetensors parses into a hash-ordered dict that differs between
    # processes, and FSDP scatters the tensors one by one in the order given, on every rank.
    set_model_state_dict(model, {k: weights[k] for k in expected}, options=_whole())
    return int(metadata.get("step", 0))


def load_checkpoint(checkpoint: Checkpoint, model: torch.nn.Module, optimizers, generator: torch.Generator) -> int:
    """Restore weights, optimizer and RNG state from `checkpoint` into a plain or FSDP-sharded
    model (every rank reads the whole files, each verified); returns the step reached."""

    state_path = checkpoint.manifest.file(checkpoint.state)
    try:
        state = _parse_state(checkpoint.read(checkpoint.state), state_path)
    except ValueError as error:
        raise ValueError(f"{error}. Without it the weights beside it cannot be resumed exactly (no optimizer or "
                         "data-order state); load them with load_run, or train into a new folder") from None
    step = _load_weights_into(model, checkpoint.read(checkpoint.weights), checkpoint.manifest.file(checkpoint.weights))
    if step != state["step"] or step != checkpoint.step:
        raise ValueError(f"{checkpoint.folder}: model.safetensors is at step {step}, state.pt at step {state['step']}, "
                         f"the manifest says {checkpoint.step}")
    if len(state["optimizers"]) != len(optimizers):
        raise ValueError(f"{state_path} holds {len(state['optimizers'])} optimizer states, expected {len(optimizers)}")
    for optimizer, optimizer_state in zip(optimizers, state["optimizers"]):
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=_whole())
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return step


# ---- opening a run folder for training ----------------------------------------------------

def open_run(run_dir: Path, model_config: ModelConfig, train_config: TrainConfig, corpus, resume: bool,
             write: bool) -> Checkpoint | None:
    """Check that `run_dir` may take this run and return the checkpoint to continue from (None:
    start at step 0). A non-empty folder headlab did not write is refused. Without `resume`, a
    folder with a checkpoint is refused; with it, the saved config must match (the error names
    every difference). When `write` (the process that owns the folder, holding its lock), and
    only after these checks, leftovers are removed and a fresh start writes config.json."""
    manifest = Manifest.claim(run_dir, MANIFEST, RUN) if write else run_manifest(run_dir)
    checkpoint = checkpoint_of(manifest)
    if checkpoint is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds a run: resume it (resume=True, --resume) or choose another "
                              "folder")
    if resume and "config.json" in manifest.files:
        differences = resume_differences(run_dir, model_config, train_config, corpus)
        if differences:
            raise ValueError(f"cannot resume {run_dir}: {len(differences)} setting(s) differ from the saved run: "
                             + "; ".join(differences) + ". Resume with the saved settings, or choose another folder")
    elif checkpoint is not None:
        raise ValueError(f"{run_dir} holds a checkpoint but no config.json, so what it continues cannot be checked")
    if write:
        manifest.remove_leftovers()
    if write and checkpoint is None:
        write_run_config(manifest, model_config, train_config, corpus)
        # the logs are written before a checkpoint lists them: named as being written, so a kill
        # before the first checkpoint leaves no file of headlab's that its manifest disowns
        manifest.discard += [name for name in (METRICS, STARTS)
                             if name not in manifest.files and name not in manifest.discard]
        manifest.save()
    return checkpoint


def load_run(path: str | Path, device: str = "cpu") -> Run:
    """The model, configs and metrics of a run folder (its current checkpoint, read whole even
    while a trainer writes the next one). Refuses, naming the file, anything truncated, corrupt,
    changed since it was written, or not written by headlab."""
    run_dir = Path(path)
    payload = read_config(run_dir)
    model_config = ModelConfig.from_dict(payload["model"])
    current = read_current(run_dir, ("model.safetensors",))
    if current is None:
        raise ValueError(f"{run_dir} has no checkpoint yet: train or resume it first")
    checkpoint, files = current
    model = GPT(model_config)
    step = _load_weights_into(model, files["model.safetensors"], checkpoint.manifest.file(checkpoint.weights))
    return Run(model=model.to(device).eval(), model_config=model_config,
               train_config=TrainConfig.from_dict(payload["train"]), step=step,
               metrics=read_metrics(run_dir / METRICS), path=run_dir)


def record_start(run_dir: Path, step: int, execution: dict) -> dict:
    """Append to starts.jsonl that the run starts (or resumes) at `step` executing as `execution`
    (processes, threads, device, ...), and return what changed since the previous start:
    {setting: [before, now]}. A log for people, never read back by training."""
    path = run_dir / STARTS
    try:
        data = read_regular(path)
    except FileNotFoundError:
        data = b""
    try:
        lines = data.decode("utf-8").splitlines()
        previous = json.loads(lines[-1]) if lines else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        previous = {}
    changed = {k: [previous[k], v] for k, v in execution.items() if k in previous and previous[k] != v}
    cut = b"\n" if data and not data.endswith(b"\n") else b""  # a log cut mid-line: the new record on its own line
    append_line(path, cut + (json.dumps({"step": step, **execution, "changed": changed}) + "\n").encode())
    return changed
