"""A scale sweep: the same comparison (six variants x seeds, paired with Standard MHA by seed) at
every point of a small grid, to see which orderings survive longer training, more depth, or any
other ModelConfig or TrainConfig setting (the optimizer, learning rates, weight decay, ...).

    points = grid("cpu-small", lengths=[1, 4, 10], depths=[4, 12], fields={"kv_residual_init": [0.0, 1.0]})
    points = grid("cpu-small", fields={"optimizer": ["adamw", "muon"]})        # TrainConfig fields too
    table = sweep_table(points, seeds=3, folder=Path("runs/sweep"))     # trains, reuses, resumes
    sweep_sentences(table)                                              # what holds, flips, shrinks

Every grid point is an ordinary `Study` with its own folder (<folder>/<point key>/runs/...), so
runs are reused and resumed like any study's. The table has one row per grid point, comparison
(variant, metric) and the paired difference to Standard MHA: mean, 95% half-width, seeds, the
metric's margin and the verdict by the rule of `headlab.study.stats`; what it says
across the grid is read from the table alone (`headlab.study.sweep_claims`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from headlab.analysis.tables import load_tables, save_tables
from headlab.io import Manifest, make_folder
from headlab.model.config import ModelConfig, preset
from headlab.runs.layout import EXECUTION_FIELDS
from headlab.schema import FLAGSHIP_MLA_ROPE
from headlab.study.claims import METRICS, difference_to_mha, margins, per_seed_metrics, variant_name, variant_rows
from headlab.study.comparable import UnlearnedRuns, check_learned
from headlab.study.roles import compared_roles, comparison_roles
from headlab.study.study import DivergedRuns, Study
from headlab.study.table_files import SWEEP, SWEEP_MANIFEST, loss_unit
from headlab.study.tables import analysis_tables, training_table
from headlab.training.config import UNSWEPT_TRAIN_FIELDS, TrainConfig, train_preset


def setting_text(value) -> str:
    """A swept value as it appears in a folder name: floats in their shortest exact form, so two
    values never share a folder (100000 and 100000.4 stay apart)."""
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    return str(value)

@dataclass(frozen=True)
class GridPoint:
    """One point of a sweep: `length` times the preset's training steps, with `model_overrides`
    (n_layer for depth, any other ModelConfig field) and `train_overrides` (TrainConfig fields)."""

    preset: str
    length: float
    model_overrides: dict = field(default_factory=dict)
    train_overrides: dict = field(default_factory=dict)

    @property
    def overrides(self) -> dict:
        """Every swept setting of the point, model and training alike."""
        return {**self.model_overrides, **self.train_overrides}

    @property
    def steps(self) -> int:
        return max(1, round(self.length * train_preset(self.preset).steps))

    @property
    def key(self) -> str:
        """The point's folder name: 'x4-n_layer12-kv_residual_init0', 'x1-optimizermuon'."""
        settings = "".join(f"-{name}{setting_text(value)}" for name, value in sorted(self.overrides.items()))
        return f"x{self.length:g}{settings}"

    def study(self, folder: Path, only: tuple[str, ...] | None = None) -> Study:
        """The point's study in <folder>/<key>; `only`: a subset of the roles (Standard MHA among them)."""
        return Study(self.preset, self.steps, Path(folder) / self.key, model_overrides=self.model_overrides,
                     train_overrides=self.train_overrides, only=only)


NOT_TRAINED = (*EXECUTION_FIELDS, "log_every")  # a sweep over these would train identical points


def grid(preset_name: str, lengths: list[float] = (1.0,), depths: list[int] | None = None,
         fields: dict[str, list] | None = None, only: tuple[str, ...] | None = None) -> list[GridPoint]:
    """Every combination of training length (multiples of the preset's steps), depth (n_layer;
    None: the preset's) and the values of other ModelConfig or TrainConfig `fields`, each checked
    as the study of the roles `only` (None: all six), which refuses a field none of them reads.
    Two points that would train the same runs (lengths that round to one step count, a value given
    twice, -0.0 and 0.0) are refused: a grid shows each setting once."""
    if not lengths or any(not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0 for x in lengths):
        raise ValueError(f"lengths = {list(lengths)!r} is invalid: give positive multiples of the preset's steps")
    fields = dict(fields or {})
    if depths and "n_layer" in fields:
        raise ValueError("depths and a swept n_layer both set the depth: give one of them")
    axes = {**({"n_layer": list(depths)} if depths else {}), **fields}
    model_fields, train_fields = set(ModelConfig.__dataclass_fields__), set(TrainConfig.__dataclass_fields__)
    unknown = sorted(set(axes) - model_fields - (train_fields - set(UNSWEPT_TRAIN_FIELDS)))
    if unknown:
        raise ValueError(f"sweep field(s) {unknown} are not ModelConfig or TrainConfig fields (steps and seed are "
                         "swept with --lengths and --seeds)")
    points, seen = [], {}
    for length in lengths:
        for values in itertools.product(*axes.values()):
            overrides = dict(zip(axes, values))
            model = {k: v for k, v in overrides.items() if k in model_fields}
            training = {k: v for k, v in overrides.items() if k not in model_fields}
            point = GridPoint(preset_name, float(length), model, training)
            study = point.study(Path("."), only)  # refuses a bad value, naming the field, for every role
            # the configs as they store the values (-0.0 is 0.0, 1e-3 is 0.001): what the runs train,
            # not how they execute (on which device, compiled or not) or how often they log: the same runs
            trained = {k: v for k, v in asdict(study.train_config(0)).items() if k not in NOT_TRAINED}
            same = (tuple(study.variants), tuple(trained.items()))
            if same in seen:
                raise ValueError(f"grid points {seen[same]} and {point.key} train the same runs ({point.steps} "
                                 f"steps, same settings; {', '.join(NOT_TRAINED)} say how a run executes or logs, "
                                 "not what it trains): give distinct lengths and values")
            seen[same] = point.key
            points.append(point)
    return points


def point_rows(point: GridPoint, metrics: pd.DataFrame) -> list[dict]:
    """The paired difference to Standard MHA of every comparison the report makes, at one point.
    A comparison is named by its role's preset label, without the point's overrides (the grid's
    columns hold those), so that it is the same comparison at every point."""
    names = {role: config.label for role, config in comparison_roles(point.preset).items()}
    rows, deltas = [], margins(metrics)
    for column, (what, unit, _) in METRICS.items():
        for role, _, mla_rope in variant_rows(metrics):
            if role == "mha" or (column == "val_loss" and mla_rope != FLAGSHIP_MLA_ROPE):
                continue
            d = difference_to_mha(metrics, role, mla_rope, column)
            rows.append({"point": point.key, "length": point.length, "steps": point.steps,
                         "n_layer": point.model_overrides.get("n_layer", preset(point.preset).n_layer),
                         **{k: v for k, v in point.overrides.items() if k != "n_layer"},
                         "role": role, "comparison": variant_name(role, names[role], mla_rope), "mla_rope": mla_rope,
                         "metric": what, "unit": unit or metrics["loss_unit"].iloc[0],
                         "mean": d.mean, "half_width": d.half_width, "seeds": d.n, "margin": deltas[column],
                         "verdict": d.verdict(deltas[column])})
    return rows


def sweep_roles(preset_name: str, only: tuple[str, ...] | None = None) -> list[str]:
    """The roles a sweep trains: `only` (None: all six), which must include Standard MHA, since
    every comparison is with it."""
    return list(Study(preset_name, None, Path("."), only=compared_roles(only)).roles)


def sweep_table(points: list[GridPoint], seeds: int, folder: Path, log=print, jobs: int | None = None,
                only: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Train (or reuse) every point's study and tabulate its comparisons (see the module docstring).
    A point with a run that diverged (`headlab.study.study.DivergedRuns`) or learned nothing
    (`headlab.study.comparable.UnlearnedRuns`) is named and left out.
    `only`: the roles to train (None: all six; see `sweep_roles`); `jobs`: runs at once (None:
    `Study.default_jobs`)."""
    sweep_roles(points[0].preset, only)
    rows, left_out = [], {"diverged": [], "learned nothing": []}
    for point in points:
        study = point.study(folder, only)
        log(f"sweep point {point.key}: {study.train_config().steps} steps, {seeds} seed(s)")
        try:
            runs = study.train(seeds, progress=False, log=log, jobs=jobs or study.default_jobs(seeds))
            check_learned(runs, study.load_corpus(), study.loss_unit)
        except (DivergedRuns, UnlearnedRuns) as error:
            log(f"sweep point {point.key} left out: {error}")
            left_out["diverged" if isinstance(error, DivergedRuns) else "learned nothing"].append(point.key)
            continue
        tables = analysis_tables(runs)
        metrics = per_seed_metrics(tables["summary"], training_table(runs, loss_unit(study.tokenizer)))
        rows += point_rows(point, metrics)
    if any(left_out.values()):
        left = "; ".join(f"{len(keys)} of {len(points)} grid point(s) {what} ({', '.join(keys)})"
                         for what, keys in left_out.items() if keys)
        if not rows:
            advice = "sweep lower learning rates" if left_out["diverged"] else "sweep longer or larger learning rates"
            raise ValueError(f"{left}: nothing to tabulate; {advice}")
        log(f"{left}: left out of the table, which holds the other points")
    return pd.DataFrame(rows)


def claim_sweep_folder(folder: Path) -> None:
    """Create `folder` and make it a sweep folder, refusing one headlab did not write before
    anything is trained in it."""
    make_folder(folder)
    Manifest.claim(folder, SWEEP_MANIFEST, SWEEP)


def save_sweep(folder: Path, table: pd.DataFrame) -> pd.DataFrame:
    """Write the sweep's table as <folder>/sweep.csv, listed in its manifest, and read it back
    checked against it: the table a report is drawn from is the one on disk."""
    save_tables(folder, {"sweep": table}, SWEEP_MANIFEST, SWEEP)
    tables, _ = load_tables(folder, SWEEP_MANIFEST, SWEEP)
    return tables["sweep"]
