"""Run folders that never lose work.

    config.json                   model + training config, data identity, headlab version, git commit
    tokenizer.json                the trained BPE, for runs on a `bpe:<vocab>` tokenizer
    metrics.jsonl                 one JSON record per log/eval line
    checkpoint.json               which checkpoint is current: {"step": 40, "folder": "checkpoint-00000040", ...}
    checkpoint-00000040/          the current checkpoint, one unit:
        model.safetensors         weights (plain tensors; metadata: format=headlab, step)
        state.pt                  optimizer states (keyed by parameter name), data-generator and
                                  torch RNG state, step
    starts.jsonl                  one record per start or resume: the step, how it executes (processes,
                                  threads, device, compile, ...) and what changed since the previous start
    .lock                         held (flock) by the one trainer writing the folder

A checkpoint is written into a hidden scratch folder, fsynced, renamed to its step folder, and
only then made current by atomically replacing `checkpoint.json`; the previous step folder is
deleted after that. A kill or a full disk at any instant therefore leaves `checkpoint.json`
naming a complete checkpoint (or no `checkpoint.json`: the run starts from step 0), and the next
start removes the leftovers.

`state.pt` is read with `torch.load(weights_only=True)`, so nothing beyond tensors and plain
containers is unpickled. Weights and optimizer states are whole (gathered from FSDP shards) and
keyed by parameter name, so any number of processes, sharded or not, can resume a checkpoint.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from headlab.data.bpe import TOKENIZER_FILE
from headlab.io import (atomic_write_bytes, atomic_write_text, default_file_mode, fsync_path, remove_temporaries,
                        temporary_path)
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.training.config import TrainConfig

FORMAT = "headlab"
POINTER = "checkpoint.json"
LOCK = ".lock"
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


class RunFolderLocked(RuntimeError):
    """Another live process is writing this run folder."""


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (full disk, permissions); the previous one is intact."""


# ---- metrics ------------------------------------------------------------------------------

class MetricsLog:
    """Records in memory, appended line by line to `metrics.jsonl` (flushed each time). With
    `write=False` (the ranks other than 0) the file is only read: on resume, every rank holds
    the same records."""

    def __init__(self, path: Path | None, write: bool = True):
        self.path = path
        self.write = write
        self.records: list[dict] = []

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.path is not None and self.write:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def reset(self) -> None:
        self.records = []
        if self.path is not None and self.write:
            atomic_write_text(self.path, "")

    def truncate_after(self, step: int) -> None:
        """Keep the records up to `step` (the checkpoint a resumed run starts from)."""
        if self.path is not None:
            self.records = [r for r in read_metrics(self.path) if r["step"] <= step] if self.path.exists() else []
        if self.path is not None and self.write:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))


def read_metrics(path: Path) -> list[dict]:
    """Records of a metrics.jsonl. A half-written last line (a killed run) is dropped; any other
    line that is not a JSON record with an integer `step` is an error naming file and line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
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

def installed_version() -> str:
    """headlab's version from the installed distribution's metadata."""
    try:
        return version("headlab")
    except PackageNotFoundError:
        return "0+unknown"


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


def write_run_config(run_dir: Path, model_config: ModelConfig, train_config: TrainConfig, corpus) -> None:
    payload = {
        "format": FORMAT,
        "headlab_version": installed_version(),
        "git_commit": _git_commit(),
        "model": model_config.to_dict(),
        "train": asdict(train_config),
        "data": data_identity(corpus),
    }
    atomic_write_text(run_dir / "config.json", json.dumps(payload, indent=2))
    if corpus.tokenizer_name.startswith("bpe:"):  # trained on this corpus: the run keeps its own copy
        atomic_write_bytes(run_dir / TOKENIZER_FILE, (corpus.folder / TOKENIZER_FILE).read_bytes())


def read_config(run_dir: Path) -> dict:
    path = run_dir / "config.json"
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is missing or not valid JSON: {error}") from error
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

@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: the folder holding model.safetensors and state.pt."""

    folder: Path

    @property
    def weights(self) -> Path:
        return self.folder / "model.safetensors"

    @property
    def state(self) -> Path:
        return self.folder / "state.pt"


CHECKPOINT_FILES = ("model.safetensors", "state.pt")


def current_checkpoint(run_dir: str | Path, files: tuple[str, ...] = CHECKPOINT_FILES) -> Checkpoint | None:
    """The checkpoint `checkpoint.json` names; None if the run has none yet. Any of `files` missing or resized since it was written is an error
    naming it."""
    run_dir = Path(run_dir)
    pointer = run_dir / POINTER
    if not pointer.exists():
        return None
    try:
        payload = json.loads(pointer.read_text(encoding="utf-8"))
        checkpoint, sizes = Checkpoint(run_dir / payload["folder"]), payload["sizes"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{pointer} is not a readable checkpoint pointer: {error}") from error
    for name, size in sizes.items():
        if name not in files:
            continue
        path = checkpoint.folder / name
        actual = path.stat().st_size if path.exists() else None
        if actual != size:
            raise ValueError(f"{path} is {'missing' if actual is None else f'{actual} bytes'}, but {pointer} "
                             f"records {size} bytes: the checkpoint was damaged after it was written")
    return checkpoint


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds trained weights (a finished run, or one to resume)."""
    return (Path(run_dir) / POINTER).exists()


def checkpoint_step(run_dir: str | Path) -> int:
    """The step of the run's current checkpoint (0 when it has none), from checkpoint.json alone."""
    pointer = Path(run_dir) / POINTER
    if not pointer.exists():
        return 0
    try:
        return int(json.loads(pointer.read_text(encoding="utf-8"))["step"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{pointer} is not a readable checkpoint pointer: {error}") from error


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
                    generator: torch.Generator, step: int) -> None:
    """Write model.safetensors and state.pt (both recording `step`; the states as from
    `gather_training_state`) as one new step folder and make it current by replacing
    checkpoint.json; then delete the checkpoint it supersedes. Raises `CheckpointWriteFailed`
    (the previous checkpoint intact) if the disk refuses a write."""
    state = {"step": step, "optimizers": optimizer_states,
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state()}
    folder = run_dir / f"{CHECKPOINT_PREFIX}{step:08d}"
    scratch = temporary_path(folder)
    committed = False
    try:
        scratch.mkdir()
        with open(scratch / "state.pt", "wb") as f:  # closed even when torch.save fails
            torch.save(state, f)
        save_file(weights, str(scratch / "model.safetensors"), metadata={"format": FORMAT, "step": str(step)})
        sizes = {}
        for name in CHECKPOINT_FILES:
            os.chmod(scratch / name, default_file_mode())  # safetensors creates its file 0600
            fsync_path(scratch / name)
            sizes[name] = (scratch / name).stat().st_size
        os.rename(scratch, folder)
        fsync_path(run_dir)
        atomic_write_text(run_dir / POINTER, json.dumps({"step": step, "folder": folder.name, "sizes": sizes}))
        committed = True
    except (OSError, SafetensorError, RuntimeError) as error:  # torch.save reports a full disk as RuntimeError
        if _pointer_folder(run_dir) != folder.name:
            shutil.rmtree(folder, ignore_errors=True)
        needed = sum(t.numel() * t.element_size() for t in weights.values())
        raise CheckpointWriteFailed(
            f"could not write the step-{step} checkpoint in {run_dir} ({_describe_write_error(error, run_dir, needed)}); "
            "the previous checkpoint is intact: free space or fix permissions, then resume (--resume)") from error
    finally:
        if not committed:
            shutil.rmtree(scratch, ignore_errors=True)
    remove_superseded(run_dir)


def _pointer_folder(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / POINTER).read_text(encoding="utf-8"))["folder"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _describe_write_error(error: BaseException, folder: Path, needed: int) -> str:
    """What went wrong, in words: torch and safetensors report a full disk in their own terms."""
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno) + (f": {error.filename}" if error.filename else "")
    free = shutil.disk_usage(folder).free
    if free < needed:
        return f"No space left on device: {free:,} bytes free, the weights alone take {needed:,}"
    return f"{type(error).__name__}: {str(error)[:300]}"


def remove_superseded(run_dir: Path) -> list[str]:
    """Delete what a killed writer left in `run_dir`: temporary files, step folders that
    checkpoint.json does not name."""
    removed = remove_temporaries(run_dir)
    if not (run_dir / POINTER).exists():
        current = None
    else:
        current = current_checkpoint(run_dir, files=()).folder.name
    for folder in run_dir.glob(f"{CHECKPOINT_PREFIX}*"):
        if folder.is_dir() and folder.name != current:
            shutil.rmtree(folder)
            removed.append(folder.name)
    return removed


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    try:
        weights = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file (truncated or corrupt?): {error}") from error
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} was not written by headlab (metadata format={metadata.get('format')!r})")
    return weights, metadata


def _read_state(path: Path) -> dict:
    if not path.exists():
        raise ValueError(f"{path} is missing: the weights beside it cannot be resumed exactly (no optimizer or "
                         "data-order state); load them with load_run, or train into a new folder")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, foreign pickle (refused by weights_only), ...
        raise ValueError(f"{path} is not a readable headlab training state (truncated, corrupt or foreign): "
                         f"{type(error).__name__}: {str(error)[:300]}") from error
    if not isinstance(state, dict) or not {"step", "optimizers", "generator"} <= set(state):
        raise ValueError(f"{path} is not a headlab training state (keys: {sorted(state) if isinstance(state, dict) else type(state).__name__})")
    return state


def _load_weights_into(model: torch.nn.Module, path: Path) -> int:
    """Load whole weights into `model` (plain, or FSDP-sharded: each rank keeps its shard)."""

    weights, metadata = read_weights(path)
    expected = model.state_dict()
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"{path} does not hold weights for this model configuration")
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{path} holds non-finite (NaN or inf) values in {', '.join(bad[:5])}")
    set_model_state_dict(model, weights, options=_whole())
    return int(metadata.get("step", 0))


def load_checkpoint(checkpoint: Checkpoint, model: torch.nn.Module, optimizers, generator: torch.Generator) -> int:
    """Restore weights, optimizer and RNG state from `checkpoint` into a plain or FSDP-sharded
    model (every rank reads the whole files); returns the step reached."""

    state = _read_state(checkpoint.state)
    step = _load_weights_into(model, checkpoint.weights)
    if step != state["step"]:
        raise ValueError(f"{checkpoint.folder}: model.safetensors is at step {step} but state.pt at step {state['step']}")
    if len(state["optimizers"]) != len(optimizers):
        raise ValueError(f"{checkpoint.state} holds {len(state['optimizers'])} optimizer states, expected {len(optimizers)}")
    for optimizer, optimizer_state in zip(optimizers, state["optimizers"]):
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=_whole())
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return step


# ---- opening a run folder for training ----------------------------------------------------

class RunLock:
    """An exclusive advisory lock (flock) on `run_dir/.lock`, held while a trainer writes the
    folder. The kernel drops it when its process dies, so a dead trainer's lock is never obeyed;
    the file's text (pid, host, start time) only names the holder in the error."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunFolderLocked(f"{self.path.parent} is being written by another trainer ({holder}): wait for it "
                                  "to finish, or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None


def open_run(run_dir: Path, model_config: ModelConfig, train_config: TrainConfig, corpus, resume: bool,
             write: bool) -> Checkpoint | None:
    """Check that `run_dir` may take this run and return the checkpoint to continue from (None:
    start at step 0). Without `resume`, a folder with a checkpoint is refused; with it, the
    saved config must match (the error names every difference). When `write` (the process that
    owns the folder, holding its lock), leftovers are removed and a fresh start writes config.json."""
    if write:
        remove_superseded(run_dir)
    checkpoint = current_checkpoint(run_dir)
    if checkpoint is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds a run: resume it (resume=True, --resume) or choose another folder")
    if resume and (run_dir / "config.json").exists():
        differences = resume_differences(run_dir, model_config, train_config, corpus)
        if differences:
            raise ValueError(f"cannot resume {run_dir}: {len(differences)} setting(s) differ from the saved run: "
                             + "; ".join(differences) + ". Resume with the saved settings, or choose another folder")
    elif checkpoint is not None:
        raise ValueError(f"{run_dir} holds a checkpoint but no config.json, so what it continues cannot be checked")
    if write and checkpoint is None:
        write_run_config(run_dir, model_config, train_config, corpus)
    return checkpoint


def load_run(path: str | Path, device: str = "cpu") -> Run:
    """The model, configs and metrics of a run folder (its current checkpoint). Refuses, naming
    the file, anything truncated, corrupt or not written by headlab."""
    run_dir = Path(path)
    payload = read_config(run_dir)
    model_config = ModelConfig.from_dict(payload["model"])
    checkpoint = current_checkpoint(run_dir, files=("model.safetensors",))
    if checkpoint is None:
        raise ValueError(f"{run_dir} has no checkpoint yet (no {POINTER}): train or resume it first")
    model = GPT(model_config)
    step = _load_weights_into(model, checkpoint.weights)
    metrics_path = run_dir / "metrics.jsonl"
    metrics = read_metrics(metrics_path) if metrics_path.exists() else []
    return Run(model=model.to(device).eval(), model_config=model_config,
               train_config=TrainConfig.from_dict(payload["train"]), step=step, metrics=metrics, path=run_dir)


def record_start(run_dir: Path, step: int, execution: dict) -> dict:
    """Append to starts.jsonl that the run starts (or resumes) at `step` executing as `execution`
    (processes, threads, device, ...), and return what changed since the previous start:
    {setting: [before, now]}."""
    path = run_dir / STARTS
    previous = read_metrics(path)[-1] if path.exists() and path.stat().st_size else {}
    changed = {k: [previous[k], v] for k, v in execution.items() if k in previous and previous[k] != v}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **execution, "changed": changed}) + "\n")
    return changed
