"""Which runs a study may compare: runs trained alike but for their attention (the same steps,
tokens, recipe, data and shape, every role over the same seeds), each of which learned something.

    check_alike(runs)                          # ValueError naming the runs that differ, and how
    no_learning(run, model, corpus)            # NoLearning, or None for a run that learned

A run learned nothing when its validation loss ends within the report's loss margin δ
(`headlab.study.claims.MARGINS`, the smallest difference it states as real) of the uniform guess
ln V, or has not fallen by δ below its own loss at step 0 (its initial weights drawn again from its
config and seed, scored on the same validation windows). Such a run is named and kept out of every
comparison, as a diverged one is (`headlab.runs.divergence`): its numbers are its initialisation's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from headlab.data.shards import Corpus, random_windows
from headlab.model.config import ModelConfig
from headlab.model.gpt import initial_model
from headlab.model.reads import fields_read
from headlab.runs.checkpoints import checkpoint_step
from headlab.runs.divergence import uniform_loss
from headlab.runs.layout import EXECUTION_FIELDS, read_config, saved_train_config
from headlab.schema import FAMILIES
from headlab.study.claims import MARGINS
from headlab.study.paths import shown_path
from headlab.study.roles import comparison_roles
from headlab.training.config import TrainConfig
from headlab.training.trainer import eval_mode

LEARNING_WINDOWS = 8  # validation windows the step-0 and final losses are scored on (the same for both)
NOT_RECIPE = ("seed", "steps", *EXECUTION_FIELDS)  # how a run is executed, which seed, how long: not its recipe


def trained_as(run) -> tuple[TrainConfig, dict]:
    """A study run's training settings and its data identity, as its folder records them (the
    run's in memory where it is `held`)."""
    payload = read_config(run.folder) if run.folder.exists() else {}
    train_config = run.held.train_config if run.held is not None else saved_train_config(run.folder, payload,
                                                                                         TrainConfig)
    return train_config, payload.get("data", {})


def shared_fields(config: ModelConfig) -> set[str]:
    """The ModelConfig fields every family's model reads (`fields_read`) but `attention`: the shape
    that runs of different families compare at."""
    return set.intersection(*(set(fields_read(config.replace(attention=family))) for family in FAMILIES)) - {
        "attention"}


def check_alike(runs: list, preset_name: str) -> None:
    """Refuse in one line runs that are not alike but for their attention: other steps, tokens
    per step, training recipe, data or shared shape (`shared_fields`: one value for every run, or
    each run its role's own in `preset_name`, as MLA's qk_norm), or roles over other seeds."""
    roles = comparison_roles(preset_name)
    described = []
    for r in runs:
        train_config, data = trained_as(r)
        steps = checkpoint_step(r.folder) if r.held is None else r.held.step
        if steps < train_config.steps:
            raise ValueError(f"run {shown_path(r.folder)} stopped at step {steps:,} of its {train_config.steps:,}: an "
                             "unfinished run is not compared; finish it first (rerunning the same reproduce or train "
                             "command resumes it)")
        recipe = {k: v for k, v in asdict(train_config).items() if k not in NOT_RECIPE}
        described.append((r, {"steps": steps, "tokens per step": train_config.batch_size * r.config.seq_len,
                              "recipe": recipe, "data": data.get("sha256")}))
    first, wanted = described[0]
    for r, have in described[1:]:
        for what in wanted:
            if have[what] != wanted[what]:
                unequal(r, first, what if what != "recipe" else
                        f"recipe ({', '.join(k for k in wanted[what] if have[what].get(k) != wanted[what][k])})",
                        f" ({have[what]:,} against {wanted[what]:,})" if isinstance(have[what], int) else "")
    for field in sorted(shared_fields(first.config)):
        values = {getattr(r.config, field) for r in runs}
        own = [r for r in runs if r.role in roles and getattr(r.config, field) == getattr(roles[r.role], field)]
        if len(values) > 1 and len(own) < len(runs):
            other = next(r for r in runs if getattr(r.config, field) != getattr(first.config, field))
            unequal(other, first, f"shape ({field} {getattr(other.config, field)!r} against "
                                  f"{getattr(first.config, field)!r})", "")
    seeds: dict[str, list[int]] = {}
    for r in runs:
        seeds.setdefault(r.role, []).append(r.seed)
    every = sorted({seed for listed in seeds.values() for seed in listed})
    for role, listed in seeds.items():
        if sorted(listed) != every:
            raise ValueError(f"role {role} has the runs of seeds {sorted(listed)}, the study's roles those of seeds "
                             f"{every}: every role is compared with Standard MHA seed by seed, so each needs one run "
                             "of every seed")


def unequal(run, first, differ: str, amounts: str) -> None:
    raise ValueError(f"runs that differ in {differ}{amounts}, not only in their attention, cannot be compared: "
                     f"{shown_path(run.folder)} and {shown_path(first.folder)}: train them as one study (headlab "
                     "reproduce, Study.train)")


@dataclass(frozen=True)
class NoLearning:
    """A run that learned nothing: its final and step-0 losses on the same validation windows
    (per token), the uniform guess ln V and the margin δ it was held to, in the same unit."""

    step: int
    loss: float
    initial_loss: float
    vocab_size: int
    margin: float

    def describe(self, unit: str = "nats/token") -> str:
        uniform = uniform_loss(self.vocab_size)
        return (f"learned nothing: loss {self.loss:.3f} {unit} at step {self.step} against {self.initial_loss:.3f} at "
                f"step 0 and a uniform guess's ln {self.vocab_size} = {uniform:.3f}, not {self.margin:.3g} (the "
                "report's loss margin) below either")


def window_loss(model: torch.nn.Module, windows: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Mean cross-entropy (nats/token) of `model` on `windows` (inputs, targets)."""
    device = next(model.parameters()).device
    with eval_mode(model), torch.no_grad():
        return float(model(windows[0].to(device), windows[1].to(device))[1])


def no_learning(run, model: torch.nn.Module, corpus: Corpus) -> NoLearning | None:
    """How `run` (a StudyRun whose trained model is `model`) learned nothing (module docstring), or
    None when its loss fell by the margin δ below both its step-0 loss and ln V."""
    margin = MARGINS["val_loss"] * corpus.bytes_per_token  # δ per byte, in the runs' nats per token
    windows = random_windows(corpus.val, LEARNING_WINDOWS, run.config.seq_len, torch.Generator().manual_seed(0))
    loss = window_loss(model, windows)
    initial = initial_model(run.config, run.seed).to(next(model.parameters()).device)
    initial_loss = window_loss(initial, windows)
    if math.isfinite(loss) and loss < min(initial_loss, uniform_loss(corpus.vocab_size)) - margin:
        return None
    step = checkpoint_step(run.folder) if run.held is None else run.held.step
    return NoLearning(step, loss, initial_loss, corpus.vocab_size, margin)


class UnlearnedRuns(ValueError):
    """Runs of a study learned nothing (`no_learning`): it compares none of them. `runs`: run folder -> how."""

    def __init__(self, runs: dict[Path, NoLearning], unit: str):
        self.runs = runs
        super().__init__(f"{len(runs)} run(s) learned nothing, so no conclusions are drawn from them: "
                         + "; ".join(f"{shown_path(folder)}: {how.describe(unit)}" for folder, how in runs.items())
                         + ". Train longer or with a larger learning rate, into another folder")


def check_learned(runs: list, corpus: Corpus, unit: str) -> None:
    """Refuse, naming each of them (`UnlearnedRuns`), study runs that learned nothing (`no_learning`);
    each run's model is read from its folder and dropped before the next."""
    failures = {r.folder: how for r in runs if (how := no_learning(r, r.run.model, corpus))}
    if failures:
        raise UnlearnedRuns(failures, unit)
