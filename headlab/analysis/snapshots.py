"""The head analysis of every snapshot of a run (`headlab.runs.snapshots`), step by step.

    analyze_snapshots("runs/x")             # an Analysis whose tables carry a `step` column
    analyze_snapshots_each("runs/x", [{"mla_rope": "included"}, {"mla_rope": "excluded"}])  # one read, both
    snapshot_heads("runs/x", 0)             # the heads of one snapshot (None: the run kept none there)
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from headlab.analysis.heads import ModelHeads, from_state_dict
from headlab.analysis.similarity import Analysis, analyze, stack_tables
from headlab.analysis.tensors import TensorStore
from headlab.model.config import ModelConfig
from headlab.model.gpt import initial_model
from headlab.runs.checkpoints import has_checkpoint
from headlab.runs.folder import load_weights
from headlab.runs.layout import read_config, run_manifest
from headlab.runs.snapshots import FOLDER, attention_tensors, snapshot_files
from headlab.schema import COLUMNS


def analyze_snapshots(run_dir: str | Path, label: str | None = None, **options) -> Analysis:
    """`analyze()` of every snapshot of the run in `run_dir` and of its current checkpoint, as
    one Analysis whose tables gain a `step` column (after `model`). `options` are analyze()'s
    (circuit, layers, mla_rope); measure must stay "frobenius" (snapshots hold attention weights only)."""
    (analysis,) = analyze_snapshots_each(run_dir, [options], label)
    return analysis


def analyze_snapshots_each(run_dir: str | Path, option_sets: list[dict], label: str | None = None) -> list[Analysis]:
    """`analyze_snapshots(run_dir, label, **options)` for each `options` of `option_sets` (both
    MLA RoPE settings, say), every snapshot and the checkpoint read and verified once."""
    for options in option_sets:
        if options.get("measure", "frobenius") != "frobenius" or options.get("inputs") is not None:
            raise ValueError(f"measure = {options.get('measure')!r} is invalid for snapshots: they keep attention "
                             "weights only, so only measure 'frobenius' applies")
    run_dir = Path(run_dir)
    config = ModelConfig.from_dict(read_config(run_dir)["model"])
    files = snapshot_files(run_dir)
    if has_checkpoint(run_dir):
        weights = load_weights(run_dir)
        files.setdefault(weights.step, weights.tensors)
    if not files:
        raise ValueError(f"{run_dir} has no snapshots and no checkpoint: train it with snapshot_every > 0")
    label = label or config.label
    if isinstance(files.get(0), Path):
        check_initial_snapshot(run_dir, config, files[0])
    per_options: list[list[Analysis]] = [[] for _ in option_sets]
    for step, source in sorted(files.items()):  # one step's heads in memory at a time
        heads = _heads(config, source, label, f"{run_dir} step {step}")
        for analyses, options in zip(per_options, option_sets):
            analyses.append(_with_step(analyze(heads, **options), step))
    return [Analysis(**{name: stack_tables([getattr(a, name) for a in analyses]) for name in COLUMNS})
            for analyses in per_options]


def snapshot_heads(run_dir: str | Path, step: int, label: str | None = None) -> ModelHeads | None:
    """The heads of the snapshot of `step` of the run in `run_dir` (verified against its manifest),
    labelled `label` (default: the config's label); None where the run kept no snapshot of that step."""
    file = snapshot_files(run_dir).get(step)
    if file is None:
        return None
    config = ModelConfig.from_dict(read_config(run_dir)["model"])
    if step == 0:
        check_initial_snapshot(run_dir, config, file)
    return _heads(config, file, label or config.label, f"{run_dir} step {step}")


_INITIAL_SNAPSHOTS: set[tuple] = set()  # (content hash, config, seed) of step-0 snapshots found to be their draw


def check_initial_snapshot(run_dir: str | Path, config: ModelConfig, file: Path) -> None:
    """Refuse a step-0 snapshot that is not the run's own initialisation: the weights its config
    and seed draw (`initial_model`, what training starts from), drawn again here and compared bit
    for bit. A snapshot swapped for another run's, its hash listed anew, would otherwise become the
    random-initialisation baseline of the wrong run."""
    train = read_config(run_dir).get("train")
    seed = train.get("seed", 0) if isinstance(train, dict) else 0  # a training config's default seed is 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{Path(run_dir) / 'config.json'} records seed {seed!r}, not a seed: write the run again")
    checked = (run_manifest(run_dir).entry(f"{FOLDER}/{file.name}")["sha256"], config, seed)
    if checked in _INITIAL_SNAPSHOTS:
        return
    drawn = attention_tensors(initial_model(config, seed))
    with safe_open(str(file), framework="pt") as saved:
        same = set(saved.keys()) == set(drawn) and all(torch.equal(saved.get_tensor(name), tensor)
                                                       for name, tensor in drawn.items())
    if same:
        _INITIAL_SNAPSHOTS.add(checked)
    else:
        raise ValueError(f"{file} is not the step-0 weights of the run in {run_dir}: its config and seed {seed} draw "
                         "other weights (drawn again and compared), so it was replaced or written by another run; "
                         "the run's random-initialisation baseline cannot come from it: train the run again")


def _heads(config: ModelConfig, source, label: str, where: str) -> ModelHeads:
    """The heads of a snapshot file, or of a checkpoint's tensors (`source`)."""
    tensors = TensorStore.from_safetensors([source]) if isinstance(source, Path) else source
    return from_state_dict(config, tensors, label, where=where)


def _with_step(analysis: Analysis, step: int) -> Analysis:
    tables = {}
    for name in COLUMNS:
        table = getattr(analysis, name).copy()
        table.insert(1, "step", step)
        tables[name] = table
    return Analysis(**tables)
