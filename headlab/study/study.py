"""A study: the six comparison variants, keyed by role, times seeds, as run folders that are
trained, reused or resumed in one way, for `headlab reproduce` and the notebooks alike.

    study = Study("cpu-small", steps=None, folder=Path("runs/reproduce"))
    runs = study.train(seeds=3)            # list[StudyRun]: role, config, seed, folder, run
    runs[0].role, runs[0].label            # "mha", "Standard MHA"

    # the paper's scale: FineWeb-Edu, GPT-2 tokens, a budget of tokens per run
    Study("paper-128m", None, Path("runs/paper"), corpus="hf:HuggingFaceFW/fineweb-edu:sample-10BT",
          tokenizer="gpt2", tokens=2_000_000_000)

Layout: <folder>/runs/<ModelConfig.run_name>-seed<k>/ (a run folder: see `headlab.runs.folder`). A
finished run is loaded, an interrupted one resumed; a seed's data order and initial weights depend
on the seed alone, so the runs of one seed form a paired comparison.

Roles (`headlab.study.roles.comparison_roles`) are what the paper's numbers are keyed by: mha,
lrkv-small, lrkv-large, mqa, mla, gqa. Analysis and prose live in `headlab.report`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headlab.data.corpus import load_corpus
from headlab.data.encoding import available_cores
from headlab.data.shards import Corpus
from headlab.data.tokenizers import PADDED_GPT2_VOCAB, tokenizer_vocab_size
from headlab.io import LOCK, Manifest, being_written, inside, make_folder
from headlab.model.config import RELEASED_FIELDS, ModelConfig, preset, recorded_fields
from headlab.runs.checkpoints import checkpoint_step, has_checkpoint
from headlab.runs.divergence import Divergence, run_divergence
from headlab.runs.layout import CONFIG, EXECUTION_FIELDS, check_resumable, run_manifest
from headlab.runs.layout import MANIFEST as RUN_MANIFEST
from headlab.runs.layout import METRICS as RUN_METRICS
from headlab.runs.metrics import read_metrics
from headlab.runs.snapshots import study_snapshot_every
from headlab.study.paths import shown_path
from headlab.study.roles import comparison_roles
from headlab.study.table_files import MANIFEST, STUDY, loss_unit
from headlab.training.config import MAX_STEPS, TrainConfig, train_preset
from headlab.training.distributed import training_device
from headlab.training.hardware import RUN_THREADS, TIMING_STEPS, load_note, measure_step, run_seconds, step_fits
from headlab.training.processes import is_main_process, launched_processes
from headlab.training.reads import model_setting_reaches, train_setting_reaches
from headlab.training.runs import Run, load_run
from headlab.training.trainer import (
    TrainingDiverged,
    collecting_only_what_is_made_within,
    free_finished_run,
    keep_freed_cpu_memory,
    prepared_corpus,
    repetition_note,
    train,
)

# Settings a study makes itself, which overrides cannot replace, and what sets each.
STUDY_SETS = {"attention": "a study's roles are its attention families; choose roles with only (--only)",
              "vocab_size": "it follows the tokenizer (--tokenizer)",
              "seed": "a study trains seeds 0 … seeds − 1 (--seeds)"}


@dataclass(frozen=True)
class StudyRun:
    """One trained variant of a study. Its model is not kept: `run` reads it from `folder` onto
    `device` each time it is asked for (or is `held`, a Run given in memory), so a study of
    many large models holds none of them between runs, and whoever reads one frees it by
    dropping it."""

    role: str  # a key of `comparison_roles`: what the variant stands for in the paper's tables
    config: ModelConfig
    seed: int
    folder: Path
    held: Run | None = None
    device: str = "cpu"  # where `run` puts the model it reads: the device the study trained on

    @property
    def run(self) -> Run:
        return self.held if self.held is not None else load_run(self.folder, self.device)

    @property
    def label(self) -> str:
        return self.config.label


@dataclass(frozen=True)
class Study:
    """The comparison variants of `preset`, trained for `steps` (None: the preset's own) into `folder`.

    corpus, tokenizer, corpus_options: what `headlab.data.load_corpus` reads (options such as
    `max_chars` and `data_files` for an `hf:` corpus); every variant's vocab_size follows the
    tokenizer. tokenizer None: the preset's (gpt2 for the paper presets' 50304-token vocabulary, else byte).
    tokens: a budget per run instead of `steps`: ceil(tokens / (batch_size · seq_len)) steps.
    model_overrides, train_overrides: ModelConfig / TrainConfig fields that replace the preset's
    (e.g. a shorter seq_len and a tiny batch to run a paper-scale shape on a CPU).
    only: a subset of the roles to train (None: all six), for the same reason."""

    preset: str
    steps: int | None
    folder: Path
    corpus: str = "shakespeare"
    tokenizer: str | None = None
    corpus_options: dict = field(default_factory=dict)
    tokens: int | None = None
    model_overrides: dict = field(default_factory=dict)
    train_overrides: dict = field(default_factory=dict)
    only: tuple[str, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "folder", Path(self.folder))
        if self.tokenizer is None:
            gpt2 = preset(self.preset).vocab_size == PADDED_GPT2_VOCAB
            object.__setattr__(self, "tokenizer", "gpt2" if gpt2 else "byte")
        for name in ("steps", "tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} = {value!r} is invalid: must be a positive integer or None (the preset's)")
        if self.steps is not None and self.tokens is not None:
            raise ValueError(f"steps = {self.steps} and tokens = {self.tokens}: give one budget, not both")
        every = comparison_roles(self.preset)  # refuses an unknown preset, naming the allowed ones
        unknown = sorted(set(self.only or ()) - set(every))
        if unknown or self.only == ():
            raise ValueError(f"only = {self.only!r} is invalid: choose roles among {', '.join(every)}")
        tokenizer_vocab_size(self.tokenizer)  # refuses an unknown tokenizer, naming the allowed ones
        for name in set(STUDY_SETS) & {*self.model_overrides, *self.train_overrides}:
            value = {**self.model_overrides, **self.train_overrides}[name]
            raise ValueError(f"{name} = {value!r} cannot replace the preset's: {STUDY_SETS[name]}")
        self._check_overrides_reach_a_role()
        folders = {}  # every setting checked before anything is written: a refused one leaves no folder
        for role, config in self.roles.items():
            if config.run_name in folders:
                raise ValueError(f"roles {folders[config.run_name]} and {role} become the same model "
                                 f"({config.label}) with {self.model_overrides}: give settings that keep them apart")
            folders[config.run_name] = role
        self.train_config(0)

    def _check_overrides_reach_a_role(self) -> None:
        """Refuse a setting that bears on none of the roles trained: its runs would be the preset's,
        trained again under another name. What bears on a role is derived from the code that builds
        and trains it (`headlab.training.reads`): the fields its model reads as it is built, and the
        training fields that change which optimizer trains which of its tensors, at which rate and
        decay, or that the training loop reads. A setting the others need to be valid (n_kv_head
        dividing a new n_head, optimizer muon under muon_qk False) is kept, though no role reads it."""
        recipe = train_preset(self.preset, **self.train_overrides)
        for name, value in {**self.model_overrides, **self.train_overrides}.items():
            model_field = name in self.model_overrides
            reaches = ((lambda config, field: model_setting_reaches(field, config)) if model_field else
                       (lambda config, field: train_setting_reaches(field, config, recipe)))
            if any(reaches(config, name) for config in self.roles.values()) or self._needed(name):
                continue
            every = Study(self.preset, self.steps, self.folder, tokenizer=self.tokenizer).roles  # all six, as preset
            readers = [role for role, config in every.items()
                       if reaches(config.replace(**self.model_overrides), name)]
            why = (f"only {', '.join(readers)} read it" if readers else
                   f"no role of {self.preset} reads it" + ("" if model_field else
                                                           f" under optimizer {recipe.optimizer}"))
            hint = f"train one of them too (only, --only) or leave {name} out" if readers else f"leave {name} out"
            raise ValueError(f"{name} = {value!r} changes none of the roles trained ({', '.join(self.roles)}): {why} "
                             f"(what a role's model reads as it is built, and which optimizer trains which of its "
                             f"tensors: headlab.training.reads); {hint}")

    def _needed(self, name: str) -> bool:
        """Whether the study's other settings are invalid without `name`'s override (every role's
        config and the recipe are checked)."""
        model = {k: v for k, v in self.model_overrides.items() if k != name}
        training = {k: v for k, v in self.train_overrides.items() if k != name}
        try:
            train_preset(self.preset, **training)
            for config in comparison_roles(self.preset).values():
                config.replace(vocab_size=tokenizer_vocab_size(self.tokenizer), **model)
        except ValueError:
            return True
        return False

    @property
    def loss_unit(self) -> str:
        return loss_unit(self.tokenizer)

    @property
    def roles(self) -> dict[str, ModelConfig]:
        """Role -> config, in the flagship figure's order, sized for the tokenizer's vocabulary."""
        vocab_size = tokenizer_vocab_size(self.tokenizer)
        return {role: config.replace(vocab_size=vocab_size, **self.model_overrides)
                for role, config in comparison_roles(self.preset).items() if self.only is None or role in self.only}

    @property
    def variants(self) -> list[ModelConfig]:
        """The configs of `roles`, in order."""
        return list(self.roles.values())

    def train_config(self, seed: int = 0) -> TrainConfig:
        """The preset's training settings for `seed` with `train_overrides`; `steps`, or the step
        count of the `tokens` budget, replaces the preset's. Runs keep analysis snapshots
        (`headlab.runs.snapshots.study_snapshot_every`) unless `train_overrides` say otherwise."""
        config = train_preset(self.preset, seed=seed, **self.train_overrides)
        if self.tokens is not None:
            steps = math.ceil(self.tokens / (config.batch_size * self.variants[0].seq_len))
            if steps > MAX_STEPS:
                raise ValueError(f"tokens = {self.tokens:,} is invalid: {steps:,} steps of {config.batch_size} x "
                                 f"{self.variants[0].seq_len} tokens, more than the {MAX_STEPS:,} a run may take")
            config = config.replace(steps=steps)
        elif self.steps:
            config = config.replace(steps=self.steps)
        if "snapshot_every" in self.train_overrides:
            return config
        return config.replace(snapshot_every=study_snapshot_every(config.steps))

    def load_corpus(self) -> Corpus:
        """The study's tokenized corpus (built once, then read from the cache)."""
        return load_corpus(self.corpus, self.tokenizer, **self.corpus_options)

    def run_folder(self, config: ModelConfig, seed: int = 0) -> Path:
        """Where one variant's run of `seed` lives: <folder>/runs/<ModelConfig.run_name>-seed<k>,
        refused if runs/ is a link (it would lead into another study's runs) or not a folder."""
        return inside(self.folder, f"runs/{config.run_name}-seed{seed}")

    def finished_runs(self, seed: int = 0) -> list[Path]:
        """The run folders of `seed` that hold trained weights, in variant order."""
        return [folder for folder in (self.run_folder(c, seed) for c in self.variants) if has_checkpoint(folder)]

    def steps_left(self, seeds: int = 1) -> dict[tuple[int, str], int]:
        """(seed, role) -> the training steps that run still needs: 0 for a finished run, and for a
        diverged one (`headlab.runs.divergence`): it is reported, never trained again."""
        return {(seed, role): 0 if run_divergence(folder) else max(0, self.train_config(seed).steps
                                                                    - checkpoint_step(folder))
                for seed in range(seeds) for role, config in self.roles.items()
                for folder in [self.run_folder(config, seed)]}

    def diverged_runs(self, seeds: int = 1) -> dict[tuple[int, str], Divergence]:
        """(seed, role) -> how that run diverged, for the runs of this study that did."""
        return {(seed, role): divergence for seed in range(seeds) for role, config in self.roles.items()
                if (divergence := run_divergence(self.run_folder(config, seed)))}

    def check_resumable(self, seeds: int, corpus: Corpus) -> None:
        """Refuse, before anything is said or trained, a run folder of this study that holds a run
        of other settings (it could be neither reused nor resumed)."""
        for seed in range(seeds):
            for config in self.variants:
                folder = self.run_folder(config, seed)
                if (folder / RUN_MANIFEST).is_file() and CONFIG in run_manifest(folder).files:
                    check_resumable(folder, config, self.train_config(seed), corpus)

    def training_notice(self, seeds: int = 1, jobs: int = 1) -> str | None:
        """One line saying what `train(seeds)` will train and about how long it takes on this
        machine (a step of every variant with steps left is timed now, on `RUN_THREADS` threads as each run trains,
        evaluations counted: `headlab.training.hardware.run_seconds`); None when every run is finished.
        Runs that each have no more steps left than timing a step takes (warm-up included) are not
        timed: the timing would cost more than the training it estimates.
        Under torchrun only rank 0 times the step (one rank's share of it, on its own device) and
        the other ranks get None: every rank timing at once would crowd the node's memory."""
        left = {key: steps for key, steps in self.steps_left(seeds).items() if steps}
        if not left or not is_main_process():
            return None
        config = self.train_config(0)
        what = (f"training {len(left)} of {seeds * len(self.roles)} runs ({len(self.roles)} {self.preset} variants x "
                f"{seeds} seed(s), {sum(left.values()):,} steps) into {shown_path(self.folder / 'runs')}")
        if max(left.values()) <= TIMING_STEPS:
            return f"{what}: not timed (no run has more steps left than the {TIMING_STEPS} that timing a step takes)"
        device = training_device(config.device, launched_processes().local_rank)
        # only the variants with steps left: each timing compiles its model on a GPU (minutes at scale)
        training = {role: self.roles[role] for role in dict.fromkeys(role for _, role in left)}
        if not all(step_fits(variant, config, device) for variant in training.values()):
            return (f"{what}: not timed here (an unsharded step of the largest variant does not fit {device}; "
                    "`headlab reproduce --plan` estimates the time from FLOPs); finished runs are kept")
        steps = {role: measure_step(variant, config, RUN_THREADS) for role, variant in training.items()}
        seconds = sum(run_seconds(steps[role], config, n) for (_, role), n in left.items()) / jobs
        took = f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"
        return (f"{what}: about {took} here ({load_note()}); finished runs are kept, "
                "so this happens once")

    def default_jobs(self, seeds: int = 1) -> int:
        """Runs to train at once when none is said: one per CPU core this process may run on (its
        affinity, e.g. under a batch scheduler; at most one per run), since
        every run trains on `RUN_THREADS`; 1 under torchrun or on a GPU, where each run has the device."""
        on_gpu = self.train_config(0).device.startswith("cuda") or (self.train_config(0).device == "auto"
                                                                    and torch.cuda.is_available())
        if on_gpu or launched_processes().world_size > 1:
            return 1
        return max(1, min(available_cores(), seeds * len(self.roles)))

    @collecting_only_what_is_made_within()
    def train(self, seeds: int = 1, progress: bool = True, log=print, jobs: int = 1) -> list[StudyRun]:
        """Every variant for seeds 0 … seeds − 1, seed by seed: finished runs are loaded,
        interrupted ones resumed, missing ones trained. When anything is to be trained, `log` gets
        `training_notice` first, and without per-step bars (`progress` False) a bar counts the runs;
        then a line per run trained (its loss and seconds) and one line for the finished runs reused.
        A run that diverges (`headlab.runs.divergence`) is finished, never trained again: once the
        others are trained, `DivergedRuns` names every diverged run, and no conclusions are drawn.

        `jobs` > 1 trains that many runs at once in worker processes (`default_jobs`: one per core).
        Every run trains on `RUN_THREADS` torch threads whatever `jobs` is, so a study's numbers
        are the same bits under any `jobs` on one machine. Not under torchrun, where every rank
        trains each run together."""
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"seeds = {seeds!r} is invalid: must be a positive integer")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs = {jobs!r} is invalid: must be a positive integer")
        if jobs > 1 and launched_processes().world_size > 1:
            raise ValueError(f"jobs = {jobs} is invalid under torchrun: every rank trains each run, so jobs must be 1")
        if is_main_process():
            claim_study_folder(self.folder)  # a folder headlab did not write is refused
        keep_freed_cpu_memory()  # small CPU models train ~10% faster; a study opts in for its processes
        corpus = prepared_corpus(self.load_corpus, self.train_config(0).device)
        self.check_resumable(seeds, corpus)
        if note := repetition_note(self.train_config(0), self.variants[0].seq_len, corpus):
            log(note)
        work = [(seed, role, config) for seed in range(seeds) for role, config in self.roles.items()]
        diverged = set(self.diverged_runs(seeds))
        reused = {key for key, steps in self.steps_left(seeds).items() if not steps} - diverged
        if reused:
            log(f"  {len(reused)} finished run(s) in {shown_path(self.folder / 'runs')} reused")
        notice = self.training_notice(seeds, jobs)
        if notice:
            log(notice)
        runs_bar = {"total": len(work), "desc": "runs", "unit": "run",
                    "disable": progress or notice is None or not watched()}
        device = str(training_device(self.train_config(0).device, launched_processes().local_rank))
        said = reused | diverged  # what this call trains is logged as it finishes
        work_left = [(seed, role, config) for seed, role, config in work if (seed, role) not in diverged]
        if jobs == 1:
            for seed, role, config in tqdm(work_left, **runs_bar):
                start = time.perf_counter()
                with torch_threads(RUN_THREADS):
                    train_study_run(self, seed, config, corpus, progress)
                free_finished_run()  # the model leaves the device before the next one is built (its folder keeps it)
                if (seed, role) not in said:
                    self._log_run(log, config, seed, time.perf_counter() - start)
        else:
            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_prepare_worker,
                                     initargs=(RUN_THREADS,)) as pool:
                pending = {pool.submit(_train_one, self, seed, config): (seed, role, config)
                           for seed, role, config in work_left}
                for future in tqdm(as_completed(pending), **runs_bar):
                    seed, role, config = pending[future]
                    elapsed = future.result()
                    if (seed, role) not in said:
                        self._log_run(log, config, seed, elapsed)
        if diverged := self.diverged_runs(seeds):
            raise DivergedRuns({self.run_folder(self.roles[role], seed): divergence
                                for (seed, role), divergence in diverged.items()}, self.loss_unit)
        return [StudyRun(role, config, seed, self.run_folder(config, seed), device=device)
                for seed, role, config in work]

    def _log_run(self, log, config: ModelConfig, seed: int, elapsed: float) -> None:
        folder = self.run_folder(config, seed)
        divergence = run_divergence(folder)
        if divergence is not None:
            what = f"diverged: {divergence.describe(self.loss_unit)}"
        else:
            final = [r["val_loss"] for r in read_metrics(folder / RUN_METRICS) if "val_loss" in r][-1]
            what = f"validation loss {final:.3f} {self.loss_unit}"
        log(f"  {config.label:<20} seed {seed}: {what} ({elapsed:.0f} s)")


class DivergedRuns(ValueError):
    """Runs of a study diverged (`headlab.runs.divergence`): it draws no conclusions from them.
    `runs`: run folder -> how it diverged."""

    def __init__(self, runs: dict[Path, Divergence], unit: str):
        self.runs = runs
        super().__init__(f"{len(runs)} run(s) diverged, so no conclusions are drawn from them: "
                         + "; ".join(f"{shown_path(folder)}: {divergence.describe(unit)}"
                                     for folder, divergence in runs.items())
                         + ". Train with other settings (a lower lr) into another folder")


def train_study_run(study: "Study", seed: int, config: ModelConfig, corpus: Corpus, progress: bool = False) -> None:
    """Train, resume or reuse one run of `study`. A run that diverges is left as its manifest
    records it, for the study to report with the others (`Study.train`)."""
    try:
        train(config, study.train_config(seed), corpus, out=study.run_folder(config, seed), resume=True,
              progress=progress)
    except TrainingDiverged:
        pass


@contextmanager
def torch_threads(threads: int):
    """This process's torch threads set to `threads` for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def claim_study_folder(folder: Path) -> Manifest:
    """The study manifest of `folder`, made (with the folder) if missing. A folder whose only
    content is runs/ of headlab runs, each vouched for by its own manifest, is a study begun by
    training a variant into `Study.run_folder` before `Study.train` (notebook 01 does): headlab
    wrote all of it, so it is taken up, whichever came first. Anything else there is refused."""
    make_folder(folder)
    if not (folder / MANIFEST).exists() and holds_only_runs(folder):
        Manifest(folder, MANIFEST, STUDY).save()
    return Manifest.claim(folder, MANIFEST, STUDY)


def holds_only_runs(folder: Path) -> bool:
    """Whether `folder` holds nothing but a runs/ folder of headlab run folders (each with its
    manifest, or locked by a trainer writing it)."""
    runs = folder / "runs"
    if sorted(p.name for p in folder.iterdir() if p.name != LOCK) != ["runs"] or runs.is_symlink() or not runs.is_dir():
        return False
    return all(run.is_dir() and not run.is_symlink() and ((run / RUN_MANIFEST).is_file() or being_written(run))
               for run in runs.iterdir())


def _prepare_worker(threads: int) -> None:
    """A training worker's process: `threads` torch threads and the trainer's allocator setting."""
    torch.set_num_threads(threads)
    keep_freed_cpu_memory()


def watched() -> bool:
    """Whether a person watches this process's output: a terminal, or a notebook's kernel (where
    tqdm.auto draws a widget); never a pipe or a log file, where a bar is only noise. A kernel is
    one that runs this process's code, not merely an imported ipykernel module (a test runner that
    executed notebooks has one loaded)."""
    if sys.stderr.isatty():
        return True
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _train_one(study: Study, seed: int, config: ModelConfig) -> float:
    """`train_study_run` in a worker process; returns its seconds."""
    start = time.perf_counter()
    train_study_run(study, seed, config, study.load_corpus())
    return time.perf_counter() - start


def settings_key(preset: str, steps: int | None) -> str:
    """8 hex digits naming every setting of a study's runs (model and training configs), so runs
    left by a checkout with other settings are never resumed: changed settings start fresh runs."""
    study = Study(preset, steps, Path("."))
    return settings_digest([[config.to_dict(), asdict(study.train_config(0))] for config in study.variants])


# The fields a settings key names whatever their value: every field the two configs had when
# ModelConfig.arch was added. A field added since is named only away from its default, so a new
# option leaves the key of every setting that does not use it (trained runs, the shipped tables) as it was.
# How a run is executed (`HOW_RUN`: processes, device, compiling) is never keyed: it does not change what is
# trained, and a run resumes across it.
# The checkpoint cadence stays keyed as it was before a run could resume under another, so the keys of
# the studies already trained (and the shipped tables) do not move.
HOW_RUN = tuple(name for name in EXECUTION_FIELDS if name not in ("snapshot_every", "checkpoint_every",
                                                                  "checkpoint_minutes"))
ALWAYS_KEYED = {
    ModelConfig: RELEASED_FIELDS,
    TrainConfig: ("steps", "batch_size", "optimizer", "lr", "matrix_lr", "embedding_lr", "unembedding_lr",
                  "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip", "eval_every", "eval_batches",
                  "checkpoint_every", "log_every", "dtype", "seed", "lrkv_factor_decay", "lrkv_b_optimizer",
                  "muon_qk", "snapshot_every"),
}


def settings_digest(settings: list) -> str:
    """`settings_key` of [[model config, training config of seed 0] per variant] as dicts (what a
    run's config.json records, so the key of runs already trained can be checked too). Fields
    outside `ALWAYS_KEYED` are left out where they hold their default."""
    named = [[_keyed(model, ModelConfig), _keyed(train, TrainConfig)] for model, train in settings]
    return hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _keyed(values: dict, config_class) -> dict:
    return {name: value for name, value in recorded_fields(values, config_class, ALWAYS_KEYED[config_class]).items()
            if name not in HOW_RUN}
