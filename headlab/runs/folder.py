"""A run folder behind one object: `RunFolder` writes it as a run trains, `load_weights` reads it.

    manifest.json                 what headlab wrote here: each file's size and SHA-256, the
                                  current checkpoint {"step": 40, "folder": "checkpoint-00000040"},
                                  whether the run diverged (`headlab.runs.divergence`)
    config.json                   model + training config, data identity, headlab version, git
                                  commit (`headlab.runs.layout`)
    tokenizer.json                the trained BPE, for runs on a `bpe:<vocab>` tokenizer
    metrics.jsonl                 one JSON record per log/eval line (`headlab.runs.metrics`)
    checkpoint-00000040/          the current checkpoint, one unit (`headlab.runs.checkpoints`)
    starts.jsonl                  one record per start or resume: the step, how it executes (processes,
                                  threads, device, compile, ...) and what changed since the previous start
    snapshots/                    analysis snapshots (`headlab.runs.snapshots`), also listed
    .lock                         held (flock) by the one trainer writing the folder

Every write goes through the manifest (`headlab.io`), so a kill or a full disk at any instant
leaves a run that resumes from its last complete checkpoint, and the next start removes exactly
the leftovers the manifest names. A folder without a manifest is not a run: it is refused unless
it is empty. The trainer's side, under torchrun too (rank 0 owns the folder, the others read it):

    with RunFolder.open(out, model_config, train_config, corpus, resume, owner, together) as folder:
        start = folder.start(model, optimizers, generator, processes, device)   # 0, or the resumed step
        for step in range(start, train_config.steps):
            folder.snapshot(model, step)
            ...                                                                 # one optimizer step
            folder.log({"step": step + 1, ...})
            if folder.checkpoint_due(step + 1):                                 # asked once per step
                folder.checkpoint(model, optimizers, generator, step + 1)

A checkpoint is due every `checkpoint_every` steps (unless 0), at the last step and, with `checkpoint_minutes`,
on the first logging step (`log_every`) at which that many minutes have passed on rank 0's `clock`
since the previous checkpoint ended (or training started): rank 0 decides, every rank follows
(`decided`), so they all enter the checkpoint's collectives together.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

import torch

from headlab.io import FolderLock, Manifest, append_line, make_folder, read_regular, refuse_foreign
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT, build_for_loading
from headlab.runs.checkpoints import (
    Checkpoint,
    checkpoint_of,
    gather_training_state,
    gathered_by_every_rank,
    load_checkpoint,
    parse_weights,
    read_current,
    save_checkpoint,
    set_weights,
)
from headlab.runs.divergence import DIVERGED, Divergence, run_divergence
from headlab.runs.layout import (
    CONFIG,
    EXECUTION_FIELDS,
    MANIFEST,
    METRICS,
    RUN,
    STARTS,
    check_resumable,
    read_config,
    run_manifest,
    write_run_config,
)
from headlab.runs.metrics import MetricsLog
from headlab.runs.snapshots import is_snapshot_step, write_snapshot

clock = time.monotonic  # seconds, for checkpoint_minutes (a test injects its own)


class RunFolder:
    """The folder one run trains into, or none (`path` None: the metrics stay in memory and
    nothing is written). Only the `owner` process (rank 0) writes; the others read what it
    wrote. `together()` is the context under which the ranks agree that a step succeeded on
    every rank (`headlab.training.distributed.together`), so a failed write ends them all;
    `decided(choice)` is the owner's choice on every rank. A checkpoint to resume is hashed by the
    processes that `verify` (one per node), which `together` holds the others to."""

    def __init__(self, path: Path | None, train_config, owner: bool = True,
                 together: Callable[[], ContextManager] = nullcontext, decided: Callable[[bool], bool] = bool,
                 verifies: bool = True):
        self.path, self.train_config, self.owner, self.together = path, train_config, owner, together
        self.decided, self.verifies = decided, verifies
        self.checkpointed_at = clock()  # when the last checkpoint ended, or training started
        self.metrics = MetricsLog(path / METRICS if path is not None else None, write=owner)
        self.last_checkpoint: int | None = None  # the step of the checkpoint on disk, once there is one
        self.resume_from: Checkpoint | None = None
        self.held = ExitStack()

    @classmethod
    def open(cls, path: str | Path | None, model_config: ModelConfig, train_config, corpus, resume: bool = False,
             owner: bool = True, together: Callable[[], ContextManager] = nullcontext,
             decided: Callable[[bool], bool] = bool, verifies: bool = True) -> "RunFolder":
        """Claim `path` for this run (`train_config` a `TrainConfig`) and hold its lock until
        `close`. A non-empty folder headlab did not write is refused. Without `resume`, a folder
        with a checkpoint is refused; with it, the saved config must match (the error names
        every difference). Only after these checks the owner removes leftovers and, for a fresh
        start, writes config.json."""
        folder = cls(Path(path) if path is not None else None, train_config, owner, together, decided, verifies)
        if folder.path is None:
            return folder
        try:
            with together():  # the owner claims and cleans the folder first; if it cannot, no rank trains
                if owner:
                    refuse_foreign(folder.path, MANIFEST)
                    make_folder(folder.path)
                    folder.held.enter_context(FolderLock(folder.path, "trainer"))
                    folder.resume_from = _checked(Manifest.claim(folder.path, MANIFEST, RUN), model_config,
                                                  train_config, corpus, resume, write=True)
            with together():  # then the others read what it left
                if not owner:
                    folder.resume_from = _checked(run_manifest(folder.path), model_config, train_config, corpus,
                                                  resume, write=False)
        except BaseException:
            folder.close()
            raise
        return folder

    def close(self) -> None:
        self.held.close()

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, model: torch.nn.Module, optimizers, generator: torch.Generator, processes: int,
              device: torch.device) -> int:
        """The step this run starts at: 0, or that of the checkpoint it resumes, whose weights,
        optimizer and RNG states are then restored (on every rank) and whose metrics are kept
        (a cut-short run's later lines dropped). The start is recorded in starts.jsonl."""
        if self.path is None:
            return 0
        step, shared = 0, processes > 1
        with self.together():  # hashed by one rank per node before any rank loads: a damaged file ends all here
            if self.resume_from is not None and shared and self.verifies:
                self.resume_from.verify()
        with self.together():
            if self.resume_from is not None:
                step = self.last_checkpoint = load_checkpoint(self.resume_from, model, optimizers, generator,
                                                              verified=shared)
                self.metrics.truncate_after(step)
            else:
                self.metrics.reset()
            if step < self.train_config.steps and self.owner and run_divergence(self.path) is not None:
                # trained again from an earlier step: judged again at the end
                manifest = run_manifest(self.path)
                del manifest.meta[DIVERGED]
                manifest.save()
            if self.owner:
                record_start(self.path, step, {"processes": processes, "threads": torch.get_num_threads(),
                                               "device": str(device), **{k: getattr(self.train_config, k) for k in
                                                                        EXECUTION_FIELDS if k != "device"}})
        self.checkpointed_at = clock()  # checkpoint_minutes count training time, not the time spent starting
        return step

    def log(self, record: dict) -> None:
        """Append a metrics record (every rank holds them all; the owner writes them)."""
        self.metrics.append(record)

    @property
    def records(self) -> list[dict]:
        return self.metrics.records

    def snapshot_due(self, step: int) -> bool:
        return self.path is not None and is_snapshot_step(step, self.train_config.snapshot_every)

    def snapshot(self, model: torch.nn.Module, step: int) -> None:
        """The analysis snapshot of `step`, if the schedule has one there: called before the
        update of `step` on every rank (an FSDP model's shards are gathered collectively)."""
        if self.path is not None:
            write_snapshot(self.path, model, step, self.train_config.snapshot_every, write=self.owner)

    def checkpoint_due(self, done: int) -> bool:
        """Whether a checkpoint is due after `done` optimizer steps (every `checkpoint_every`, the last,
        and on time: module docstring). Every rank asks, once per step: on a logging step with
        `checkpoint_minutes` the ranks exchange rank 0's answer."""
        config = self.train_config
        if self.path is None:
            return False
        if config.checkpoint_every and done % config.checkpoint_every == 0 or done == config.steps:
            return True
        if not config.checkpoint_minutes or done % config.log_every:
            return False
        return self.decided(clock() - self.checkpointed_at >= 60 * config.checkpoint_minutes)

    def checkpoint(self, model: torch.nn.Module, optimizers, generator: torch.Generator, step: int) -> None:
        """Make the state after `step` updates the run's current checkpoint (`save_checkpoint`).
        Every rank calls it: all join the gather of FSDP shards or of a sharded optimizer state,
        and a failed write on the owner raises on every rank."""
        if gathered_by_every_rank(model, optimizers) or self.owner:
            weights, optimizer_states = gather_training_state(model, optimizers)
        with self.together():
            if self.owner:
                save_checkpoint(self.path, weights, optimizer_states, generator, step, self.metrics)
        self.last_checkpoint, self.checkpointed_at = step, clock()

    def mark_diverged(self, divergence: Divergence) -> None:
        """Record in the manifest that the run diverged (`headlab.runs.divergence`): a study then
        reports it and never trains it again. Every rank calls it; the owner writes."""
        with self.together():
            if self.owner and self.path is not None:
                manifest = run_manifest(self.path)
                manifest.meta[DIVERGED] = divergence.to_dict()
                manifest.save()

    def kept(self) -> str:
        """What the folder keeps if training stops now, as the end of an error message."""
        if self.path is None:
            return ""
        if self.last_checkpoint is None:
            return "; no checkpoint was written before it"
        return f"; the run folder keeps the checkpoint of step {self.last_checkpoint}"


def _checked(manifest: Manifest, model_config: ModelConfig, train_config, corpus, resume: bool,
             write: bool) -> Checkpoint | None:
    """The checkpoint to resume from (None: step 0) once the run's folder is checked (see
    `RunFolder.open`); with `write`, leftovers removed and a fresh start's config.json written."""
    run_dir = manifest.folder
    checkpoint = checkpoint_of(manifest)
    if checkpoint is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds a run: resume it (resume=True, --resume) or choose another "
                              "folder")
    if resume and CONFIG in manifest.files:
        check_resumable(run_dir, model_config, train_config, corpus)
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


# ---- reading a run ------------------------------------------------------------------------

@dataclass(frozen=True)
class Weights:
    """A run's current checkpoint as read: its config.json, its weights and their step."""

    file: Path  # the checkpoint's model.safetensors
    config: dict  # config.json: {"model": ..., "train": ..., "data": ..., "headlab_version": ...}
    model_config: ModelConfig
    tensors: dict[str, torch.Tensor]
    step: int  # optimizer steps behind the weights

    def model(self, device: str | torch.device = "cpu") -> GPT:
        """A GPT holding these weights (refused unless they fit its config and are finite), in eval mode."""
        model = build_for_loading(self.model_config)
        set_weights(model, self.tensors, self.file)  # every weight: none is left as allocated
        return model.to(device).eval()


def load_weights(run: str | Path) -> Weights:
    """The weights of a run folder's current checkpoint with its config, read whole even while a
    trainer writes the next one. Refuses, naming the file, anything truncated, corrupt, changed
    since it was written, or not written by headlab."""
    run_dir = Path(run)
    config = read_config(run_dir)
    model_config = ModelConfig.from_dict(config["model"])
    current = read_current(run_dir, ("model.safetensors",))
    if current is None:
        raise ValueError(f"{run_dir} has no checkpoint yet: train or resume it first")
    checkpoint, files = current
    where = checkpoint.manifest.file(checkpoint.weights)
    tensors, metadata = parse_weights(files["model.safetensors"], where)
    return Weights(where, config, model_config, tensors, int(metadata.get("step", 0)))
