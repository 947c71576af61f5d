"""A study's tables: every number its report states, computed once from the trained runs and kept
on disk, so the report, the figures, the widgets and the notebooks only ever read tables.

    tables = analyze_study(runs, corpus, preset="cpu-small")   # all the torch work
    write_study_tables(tables, folder)                         # CSVs + study.json (hashes), atomically
    tables = read_study_tables(folder)                         # what `headlab report DIR` starts from

Writing and reading them (`headlab.study.table_files`) loads no torch, so the report layer
imports that module, never this one.

Tables (CSV, one row per observation):
    similarity, spectra, summary, norms   `analyze()` of every run at both `mla_rope` settings, both circuits,
                                          with `seed` and `role` columns
    init_spectra, init_summary            the random-initialisation baseline: spectra and summary of every
                                          run's step-0 weights (QK), the same seeds, the same columns
    training          role, model, seed, step, tokens, val_loss, val_bpb, kv_cache_pct, loss_unit
    cache             role, model, kv_values_per_token, kv_cache_pct (of MHA)
    norm_effect       QK-norm's 1/rms: what A_h leaves out (seed-0 runs with QK-norm)
    rope_ratio        MLA: ‖A_h^RoPE‖_F / ‖A_h^latent‖_F per seed
    measures          the three views (weights, data-aware, behaviour) of every run (summary rows)
    measure_agreement Spearman correlation between the views
    snapshot_summary  the QK summary of every snapshot step of every run
    factor_training   LRKV: the key residual-to-shared norm ratio per layer at every snapshot step
    lrkv_factors      LRKV: norm ratio and principal angles per layer, projection and head (final weights)
    rank_bound        MHA: what a rank-r residual could keep of W_h − W̄, and MHA rebuilt from it
    metrics, claims, seed_distance, ... what the study concludes from the tables above, computed once
                      (`headlab.study.conclusions`): the report renders them
The meta (study.json) records the preset, the model's shape, the corpus and tokenizer, the
training recipe (`train`: every TrainConfig field that moves a number) and each setting changed
from the preset (`changed`), the analysis options, and how long training and analysis took.

headlab ships the tables of some studies as package data, a folder per preset
(`table_files.shipped_folder`); `study_tables` reads them where nothing of the study is on disk yet.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headlab.analysis.gram import frobenius_gram
from headlab.analysis.heads import load_heads
from headlab.analysis.lrkv import deviation_table, factor_table, rank_r_model
from headlab.analysis.measures import measure_agreement, measure_views
from headlab.analysis.qk_norm import norm_scale_effect
from headlab.analysis.similarity import analyze, concat, stack_tables
from headlab.analysis.snapshots import analyze_snapshots_each, snapshot_heads
from headlab.data.shards import Corpus, random_windows
from headlab.model.gpt import initial_model
from headlab.runs.divergence import run_divergence
from headlab.runs.layout import resume_differences, run_identity
from headlab.schema import ALL_CIRCUITS, CIRCUITS, FLAGSHIP_MLA_ROPE, MLA_ROPE
from headlab.study.comparable import NOT_RECIPE, UnlearnedRuns, check_alike, no_learning
from headlab.study.conclusions import conclusions
from headlab.study.paths import shown_path
from headlab.study.roles import comparison_roles
from headlab.study.study import DivergedRuns, Study, StudyRun, settings_key
from headlab.study.table_files import (
    SHIPPED_ROOT,
    StudyTables,
    loss_unit,
    read_study_tables,
    write_study_tables,
)
from headlab.training.config import TrainConfig, train_preset
from headlab.training.optimizers import optimizer_table
from headlab.training.reads import model_setting_reaches, train_change_reaches
from headlab.training.runs import Run

# The figures and claims use the whole pre-softmax score of MLA, as for every other family (see
# `headlab.analysis.similarity`); the paper's latent-only definition is in the tables beside it.
# `analysis_tables` analyses every one of CIRCUITS; recorded in study.json, so older tables are remade
MOMENT_WINDOWS = 32  # validation windows Σ is estimated on (the data-aware view)
BEHAVIOUR_WINDOWS = 8  # validation windows the attention maps are taken on (the behaviour view)


def analysis_tables(runs: list[StudyRun]) -> dict[str, pd.DataFrame]:
    """similarity, spectra, summary, norms of every run at every `mla_rope` setting and for both
    circuits (qk, the paper's and the report's; ov, for the explorer's circuit control), with
    `seed` and `role` columns. Filter on `mla_rope` and `circuit` before drawing a figure."""
    return stacked_analyses(runs, lambda r: r.run.model, ALL_CIRCUITS)


def init_tables(runs: list[StudyRun]) -> dict[str, pd.DataFrame]:
    """The random-initialisation baseline: init_spectra and init_summary, the spectra and summary
    of every run's step-0 weights (`initial_weights`) for the QK circuit at every `mla_rope`
    setting, with `seed` and `role` columns: the same columns as spectra and summary."""
    tables = stacked_analyses(runs, initial_weights, "qk")
    return {f"init_{name}": tables[name] for name in ("spectra", "summary")}


def initial_weights(r: StudyRun):
    """The heads of `r` at step 0: its step-0 snapshot where its folder kept one, else the draw
    its config and seed give (`initial_model`, what training starts from: the same weights)."""
    heads = snapshot_heads(r.folder, 0, r.label) if r.folder.exists() else None
    return heads if heads is not None else initial_model(r.config, r.seed)


def stacked_analyses(runs: list[StudyRun], source, circuit: str) -> dict[str, pd.DataFrame]:
    """similarity, spectra, summary, norms of `source(run)` (a model or its heads) for every run
    at every `mla_rope` setting, stacked, with `seed` and `role` columns."""
    per_seed: dict[int, list] = {}
    for r in runs:
        model = source(r)  # read once per run (a study reads each run from its folder)
        per_seed.setdefault(r.seed, []).extend(analyze(model, label=r.label, mla_rope=s, circuit=circuit)
                                               for s in MLA_ROPE)
    roles = {r.label: r.role for r in runs}
    tables = {}
    for name in ("similarity", "spectra", "summary", "norms"):
        stacked = pd.concat([getattr(concat(analyses), name).assign(seed=seed) for seed, analyses in per_seed.items()],
                            ignore_index=True)
        tables[name] = stacked.assign(role=stacked["model"].map(roles))
    return tables


def training_table(runs: list[StudyRun], unit: str) -> pd.DataFrame:
    """Every validation record of every run: role, model, seed, step, tokens, val_loss, val_bpb,
    kv_cache_pct and loss_unit (`unit`, the runs' tokenizer's: `headlab.study.table_files.loss_unit`)."""
    return pd.DataFrame([
        {"model": r.label, "role": r.role, "seed": r.seed, "step": m["step"], "tokens": m["tokens"],
         "val_loss": m["val_loss"], "val_bpb": m["val_bpb"], "kv_cache_pct": 100 * r.config.kv_cache_fraction_of_mha(),
         "loss_unit": unit}
        for r in runs for m in r.run.metrics if "val_loss" in m])


def cache_table(runs: list[StudyRun]) -> pd.DataFrame:
    """KV values cached per token and layer, and their % of MHA's, per role."""
    configs = {r.role: r.config for r in runs}
    return pd.DataFrame([{"role": role, "model": config.label,
                          "kv_values_per_token": config.kv_cache_values_per_token(),
                          "kv_cache_pct": 100 * config.kv_cache_fraction_of_mha()} for role, config in configs.items()])


def validation_windows(corpus: Corpus, n: int, seq_len: int) -> torch.Tensor:
    """`n` seeded validation windows of `corpus`: the same windows for every run of a study."""
    return random_windows(corpus.val, n, seq_len, torch.Generator().manual_seed(0))[0]


def norm_effect_table(runs: list[StudyRun], corpus: Corpus, batch_size: int = 8) -> pd.DataFrame:
    """`norm_scale_effect` of every QK-normed variant's seed-0 run on validation windows: per model
    and kind, the largest change over layers (points of % of H) that a per-head median 1/rms and the
    per-token 1/rms make, and the range of the median 1/rms."""
    rows = []
    for r in runs:
        if r.seed != 0 or not r.config.qk_norm:
            continue
        effect = norm_scale_effect(r.run.model, validation_windows(corpus, batch_size, r.config.seq_len), r.label)
        ranks = effect.pivot_table(index=["layer", "kind"], columns="measure", values="effective_rank_pct_of_heads")
        for kind in ("uncentered", "centered"):
            k = ranks.xs(kind, level="kind")
            rows.append({"model": r.label, "kind": kind,
                         "median 1/rms per head": (k["weights, median 1/rms per head"] - k["weights"]).abs().max(),
                         "per-token 1/rms": (k["token scores with 1/rms"] - k["token scores"]).abs().max(),
                         "median 1/rms range": f"{effect['median_inv_rms_min'].min():.2f}–"
                                               f"{effect['median_inv_rms_max'].max():.2f}"})
    return pd.DataFrame(rows, columns=["model", "kind", "median 1/rms per head", "per-token 1/rms",
                                       "median 1/rms range"])


def rope_ratio_table(runs: list[StudyRun]) -> pd.DataFrame:
    """Per MLA run (seed): the mean over layers and heads of ‖A_h^RoPE‖_F / ‖A_h^latent‖_F, the
    RoPE part of each head's QK form against its latent part (A_h^RoPE = A_h with the RoPE parts
    included minus A_h without them)."""
    rows = []
    for r in runs:
        if r.role != "mla":
            continue
        heads, per_layer = load_heads(r.run.model), []
        for layer in range(heads.n_layers):
            weights = heads.layer(layer)
            rope = np.diag(frobenius_gram(*weights.rope_factors()))  # ‖A_h^RoPE‖²_F, from d_h × d_h products
            latent = np.diag(frobenius_gram(*weights.factors("qk", mla_rope="excluded")))
            per_layer.append(np.sqrt(rope / latent))
        rows.append({"seed": r.seed, "rope_to_latent": float(np.mean(per_layer))})
    return pd.DataFrame(rows, columns=["seed", "rope_to_latent"])


def measures_table(runs: list[StudyRun], corpus: Corpus) -> tuple[pd.DataFrame, float, int]:
    """The three views of every run (`measure_views`, at `FLAGSHIP_MLA_ROPE`, with seed and role),
    the seconds spent estimating Σ and its tokens in total."""
    pieces, seconds, tokens = [], 0.0, 0
    for r in runs:
        summary, spent, n = measure_views(
            r.run.model, r.label, validation_windows(corpus, MOMENT_WINDOWS, r.config.seq_len),
            validation_windows(corpus, BEHAVIOUR_WINDOWS, r.config.seq_len), FLAGSHIP_MLA_ROPE,
            text=f"{corpus.name} validation windows")
        pieces.append(summary.assign(seed=r.seed, role=r.role))
        seconds, tokens = seconds + spent, tokens + n
    return pd.concat(pieces, ignore_index=True), seconds, tokens


def snapshot_tables(runs: list[StudyRun]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The QK summary of every snapshot (and the last checkpoint) of every run at both `mla_rope`
    settings, with step, seed and role columns: the claims' half-way point and the figure through
    training; and for LRKV runs the key residual-to-shared norm ratio through training (model,
    seed, role, step, layer, norm_ratio: the mean over heads of ‖U_h B_hᵀ‖_F over ‖W_shared‖_F)."""
    summaries, ratios = [], []
    for r in runs:
        for analysis in analyze_snapshots_each(r.folder, [{"mla_rope": setting} for setting in MLA_ROPE], r.label):
            summaries.append(analysis.summary.assign(seed=r.seed, role=r.role))
        if r.config.attention == "lrkv":  # LRKV's norms do not depend on mla_rope
            norms = analysis.norms.pivot_table(index=["model", "step", "layer"], columns="part",
                                               values="frobenius_norm").reset_index()
            ratios.append(norms.assign(norm_ratio=norms["key_residual"] / norms["key_shared"], seed=r.seed, role=r.role)
                          [["model", "seed", "role", "step", "layer", "norm_ratio"]])
    columns = ["model", "seed", "role", "step", "layer", "norm_ratio"]
    return (pd.concat(summaries, ignore_index=True),
            pd.concat(ratios, ignore_index=True) if ratios else pd.DataFrame(columns=columns))


def lrkv_factor_table(runs: list[StudyRun]) -> pd.DataFrame:
    """`headlab.analysis.lrkv.factor_table` of every LRKV run's final weights, with seed, role and rank."""
    tables = [factor_table(r.run.model, r.label).assign(seed=r.seed, role=r.role, rank=r.config.kv_rank)
              for r in runs if r.config.attention == "lrkv"]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(
        columns=["model", "layer", "projection", "head", "norm_ratio", "angle_mean", "angle_min", "angle_max",
                 "angle_random", "seed", "role", "rank"])


def lrkv_ranks(runs: list[StudyRun]) -> tuple[int, ...]:
    return tuple(sorted({r.config.kv_rank for r in runs if r.config.attention == "lrkv"}))


def rank_bound_table(runs: list[StudyRun], ranks: tuple[int, ...] | None = None) -> pd.DataFrame:
    """The best a rank-r residual could do, for every Standard MHA run and each LRKV rank r of
    the study (`headlab.analysis.lrkv`): per layer the mean over heads of the key and value
    deviation energy W_h − W̄ that the rank-r truncated SVD keeps, and the QK effective rank (% of
    H, both kinds) of MHA rebuilt as W̄ + [W_h − W̄]_r (`ranks`: the LRKV ranks, default those of
    `runs`). Columns: model, seed, role, layer, rank,
    key_energy_kept, value_energy_kept, kind, effective_rank_pct_of_heads."""
    ranks = lrkv_ranks(runs) if ranks is None else ranks
    rows = []
    for r in runs:
        if r.role != "mha" or not ranks:
            continue
        model = r.run.model  # read from its folder once
        energy = (deviation_table(model, ranks, r.label).groupby(["layer", "rank", "projection"])["energy_kept"]
                  .mean().unstack("projection"))
        for rank in ranks:
            summary = analyze(rank_r_model(model, rank, r.label)).summary
            for row in summary.itertuples():
                rows.append({"model": r.label, "seed": r.seed, "role": r.role, "layer": row.layer, "rank": rank,
                             "key_energy_kept": energy.loc[(row.layer, rank), "key"],
                             "value_energy_kept": energy.loc[(row.layer, rank), "value"], "kind": row.kind,
                             "effective_rank_pct_of_heads": row.effective_rank_pct_of_heads})
    return pd.DataFrame(rows, columns=["model", "seed", "role", "layer", "rank", "key_energy_kept",
                                       "value_energy_kept", "kind", "effective_rank_pct_of_heads"])


def corpus_description(corpus: Corpus) -> str:
    """How the report names the training data: 'Shakespeare (byte-level)', '`hf:…` (gpt2 tokens)'."""
    name = "Shakespeare" if corpus.name == "shakespeare" else f"`{corpus.name}`"
    return f"{name} ({'byte-level' if corpus.tokenizer_name == 'byte' else corpus.tokenizer_name + ' tokens'})"


def training_recipe(run: Run) -> dict:
    """The TrainConfig fields that move a number, as `run` was trained (one recipe per study)."""
    return {k: v for k, v in asdict(run.train_config).items() if k not in NOT_RECIPE}


def changed_settings(runs: list[StudyRun], train_config: TrainConfig, preset_name: str) -> tuple[dict, dict]:
    """Every model or training setting in which the runs (trained with `train_config`) differ from
    `preset_name`'s own (besides the vocabulary, which follows the tokenizer, and the steps,
    which the meta states), as two dicts 'field': value: those that bear on a run, and those that
    bear on none (`headlab.training.reads`: set, yet nothing trained differs for them)."""
    roles = comparison_roles(preset_name)
    preset_recipe = {k: v for k, v in asdict(train_preset(preset_name)).items() if k not in NOT_RECIPE}
    changed = {k: v for k, v in asdict(train_config).items() if k not in NOT_RECIPE and preset_recipe[k] != v}
    reached = {k for k in changed if any(train_change_reaches(k, r.config, train_config, preset_recipe[k])
                                         for r in runs)}
    for r in runs:
        ours, theirs = r.config.to_dict(), roles[r.role].replace(vocab_size=r.config.vocab_size).to_dict()
        for k, v in ours.items():
            if theirs[k] != v:
                changed[k] = v
                reached |= {k} if model_setting_reaches(k, r.config) else set()
    return ({k: v for k, v in changed.items() if k in reached}, {k: v for k, v in changed.items() if k not in reached})


def optimizer_rows(runs: list[StudyRun], train_config: TrainConfig) -> list[dict]:
    """Which optimizer trains which tensor of each role's model, as the runs were trained: the plan
    the optimizers are made from (`headlab.training.optimizers.optimizer_table`), one row per role
    and group of tensors: role, model, optimizer, lr (and the setting it comes from), weight decay
    (and its setting) and the tensors, named as in every block ('attn.c_q': each block's query matrix)."""
    rows, seen = [], set()
    for r in runs:
        if r.role in seen:
            continue
        seen.add(r.role)
        groups: dict[tuple, list[str]] = {}
        for row in optimizer_table(r.config, train_config):
            name = re.sub(r"^blocks\.\d+\.", "", row["parameter"]).removesuffix(".weight")
            key = (row["optimizer"], row["lr_setting"], row["lr"], row["decay_setting"], row["weight_decay"])
            groups.setdefault(key, []).append(name) if name not in groups.get(key, []) else None
        rows += [{"role": r.role, "model": r.label, "optimizer": optimizer, "lr": lr, "lr_setting": lr_setting,
                  "weight_decay": decay, "decay_setting": decay_setting, "tensors": names}
                 for (optimizer, lr_setting, lr, decay_setting, decay), names in groups.items()]
    return rows


def analyze_study(runs: list[StudyRun], corpus: Corpus, preset: str, started: float | None = None,
                  learning_checked: bool = True) -> StudyTables:
    """Every table of the study of `runs` (trained on `corpus`), and its meta; `started` is the
    `time.perf_counter()` at which the study began, for the minutes it records. Each run's model
    is read from its folder once and dropped before the next is read.

    Refused, naming the runs: runs not trained alike but for their attention (`check_alike`),
    and runs that diverged or learned nothing (`headlab.study.comparable`). learning_checked
    False skips the second check, for a smoke test of a pipeline whose few steps teach a large
    model nothing; the meta records it and the report says so beside every comparison."""
    unit, ranks = loss_unit(corpus.tokenizer_name), lrkv_ranks(runs)
    check_alike(runs, preset)
    pieces: dict[str, list[pd.DataFrame]] = {}
    moment_seconds, moment_tokens, steps, recipe, trained_with = 0.0, 0, 0, None, None
    diverged, unlearned = {}, {}
    for r in runs:
        one = [replace(r, held=r.run)]
        if divergence := one[0].run.diverged or run_divergence(r.folder):
            diverged[r.folder] = divergence
        elif learning_checked and (failure := no_learning(r, one[0].run.model, corpus)):
            unlearned[r.folder] = failure
        if diverged or unlearned:
            continue  # the study is refused below, naming every run that failed: nothing more to analyse
        measures, seconds, tokens = measures_table(one, corpus)
        moment_seconds, moment_tokens = moment_seconds + seconds, moment_tokens + tokens
        steps, recipe = max(steps, one[0].run.step), recipe or training_recipe(one[0].run)
        trained_with = trained_with or one[0].run.train_config
        for name, table in {**analysis_tables(one), **init_tables(one), "training": training_table(one, unit),
                            "norm_effect": norm_effect_table(one, corpus), "rope_ratio": rope_ratio_table(one),
                            "measures": measures, "lrkv_factors": lrkv_factor_table(one),
                            "rank_bound": rank_bound_table(one, ranks)}.items():
            pieces.setdefault(name, []).append(table)
        del one
    if diverged:
        raise DivergedRuns(diverged, unit)
    if unlearned:
        raise UnlearnedRuns(unlearned, unit)
    tables = {name: stack_tables(tables) for name, tables in pieces.items()}
    tables.update(cache=cache_table(runs), measure_agreement=measure_agreement(tables["measures"],
                                                                                pair_pattern_with="qk"))
    tables["snapshot_summary"], tables["factor_training"] = snapshot_tables(runs)
    config = runs[0].config
    changed, unread = changed_settings(runs, trained_with, preset)
    meta = {
        "preset": preset, "n_layer": config.n_layer, "n_head": config.n_head, "d_model": config.d_model,
        "head_dim": config.head_dim, "n_runs": len(runs), "seeds": sorted({r.seed for r in runs}),
        "corpus": corpus.name, "tokenizer": corpus.tokenizer_name, "corpus_description": corpus_description(corpus),
        "bytes_per_token": corpus.bytes_per_token, "loss_unit": unit, "flagship_mla_rope": FLAGSHIP_MLA_ROPE,
        "circuits": list(CIRCUITS), "train": recipe, "changed": changed, "unread": unread,
        "optimizers": optimizer_rows(runs, trained_with), "learning_checked": learning_checked,
        "moment_seconds": moment_seconds, "moment_tokens": moment_tokens,
        "steps": steps, "runs": {r.folder.name: run_identity(r.folder) for r in runs},
        "minutes": None if started is None else (time.perf_counter() - started) / 60,
    }
    return StudyTables({**tables, **conclusions(tables, meta)}, meta)


def tabulate_study(runs: list[StudyRun], corpus: Corpus, preset: str, folder: str | Path,
                   started: float | None = None, learning_checked: bool = True) -> StudyTables:
    """`analyze_study`, written into `folder` and read back: the tables exactly as `headlab report`
    will find them, so a report drawn now and one redrawn later are the same."""
    write_study_tables(analyze_study(runs, corpus, preset, started, learning_checked), folder)
    return read_study_tables(folder)


def are_tables_of(tables: StudyTables, study: Study, seeds: int) -> bool:
    """Whether `tables` were made from exactly `study`'s runs of seeds 0 … seeds − 1 (preset,
    seeds, steps, circuits)."""
    wanted = {"preset": study.preset, "seeds": list(range(seeds)), "steps": study.train_config(0).steps,
              "circuits": list(CIRCUITS)}
    return all(tables.meta.get(key) == value for key, value in wanted.items())


def shipped_tables(study: Study, seeds: int, root: Path | None = None) -> StudyTables | None:
    """The tables shipped with headlab for `study`'s preset (the folder named so under `root`, default
    `SHIPPED_ROOT`), if they are of `study`'s runs and of every setting behind them (`settings_key`,
    which scripts/ship_tables.py records), else None. Tables that cannot be read as shipped
    (edited, deleted) are a damaged installation, and the error says so."""
    root = root or SHIPPED_ROOT
    if not (root / study.preset).is_dir():
        return None
    try:
        tables = read_study_tables(root / study.preset)
    except ValueError as error:
        raise ValueError(f"the {study.preset} tables shipped with headlab are damaged, so is this installation of "
                         f"headlab ({error}): reinstall headlab (pip install --force-reinstall headlab; in a checkout, "
                         f"git checkout headlab/study/shipped/{study.preset})") from None
    meta = tables.meta
    same = (are_tables_of(tables, study, seeds)
            and (meta["corpus"], meta["tokenizer"]) == (study.corpus, study.tokenizer)
            and meta.get("shipped", {}).get("settings_key") == settings_key(study.preset, study.steps)
            and not (study.model_overrides or study.train_overrides or study.corpus_options or study.only))
    return tables if same else None


def tabulated_from(tables: StudyTables, study: Study, seeds: int) -> bool:
    """Whether `tables` were made from exactly the runs `study` asks for: the same run folders
    (so the same roles: `only`), each still holding the config.json the tables were made from,
    and that config the study's own (model and training settings, corpus and tokenizer)."""
    wanted = {"preset": study.preset, "seeds": list(range(seeds)), "steps": study.train_config(0).steps,
              "circuits": list(CIRCUITS), "tokenizer": study.tokenizer}
    if not all(tables.meta.get(key) == value for key, value in wanted.items()):
        return False
    folders = {study.run_folder(config, seed): (config, study.train_config(seed))
               for seed in range(seeds) for config in study.variants}
    if tables.meta.get("runs") != {folder.name: run_identity(folder) for folder in folders}:
        return False
    corpus = study.load_corpus()
    return not any(resume_differences(folder, config, train_config, corpus)
                   for folder, (config, train_config) in folders.items())


def study_tables(study: Study, seeds: int, log=print, train: bool = True, stand_in: bool = True) -> StudyTables:
    """The tables of `study` for seeds 0 … seeds − 1: read from its folder when `headlab reproduce`
    (or an earlier call) left them for exactly these runs, else, where nothing of the study is
    on disk yet, the ones shipped with headlab for the same settings (`shipped_tables`), else
    trained (finished runs reused) and tabulated into the folder. What the notebooks start from.

    train False: never train; a finished study's tables are shown, also where its runs are no longer
    beside them (`log` says so); without finished tables, the shipped ones, else a ValueError saying
    how to make them. Notebooks 02 and 03 in full mode, which show results and leave training to
    notebook 01 and `make demo`.
    stand_in False: shipped tables never stand in for the study (a folder the user named): a folder
    without the study's finished tables is a ValueError. Where they do stand in, `log` says why."""
    why = f"no study in {shown_path(study.folder)}"
    try:
        tables = read_study_tables(study.folder)
    except ValueError:
        tables = None  # no tables yet (or incomplete ones): make them
    if tables is not None:
        try:
            if tabulated_from(tables, study, seeds):
                return tables
        except ValueError:
            pass  # a run they were made from is gone or unreadable
        shown = {"preset": tables.meta.get("preset"), "seeds": len(tables.meta.get("seeds", []))}
        if not train and are_tables_of(tables, study, seeds) and not (study.folder / "runs").exists():
            log(f"{shown_path(study.folder)} holds the tables of a {study.preset} study without its runs: shown as "
                "written")
            return tables
        why = (f"{shown_path(study.folder)} holds {shown['seeds']} seed(s) of a {shown['preset']} study, not "
               f"{seeds} of {study.preset}" if shown != {"preset": study.preset, "seeds": seeds} else
               f"the tables in {shown_path(study.folder)} are not of the runs beside them (changed since)")
    elif (study.folder / "runs").exists():
        why = f"the study in {shown_path(study.folder)} is not finished (no tables yet)"
    begun = (study.folder / "runs").exists()
    if not stand_in and not train:
        raise ValueError(f"{why}: nothing to show (finish it with headlab reproduce --out {shown_path(study.folder)}, "
                         "or leave RUNS = None for the tables shipped with headlab)")
    if stand_in and (not begun or not train) and (shipped := shipped_tables(study, seeds)):
        log(f"{why}: showing instead the {study.preset} tables shipped with headlab "
            f"({shipped.meta['shipped']['note']}); nothing is trained")
        return shipped
    if not train:
        raise ValueError(f"{why}, and no {study.preset} tables of {seeds} seed(s) ship with headlab for its "
                         "settings: train them first (notebook 01 with SMALL = False, or headlab reproduce)")
    runs = study.train(seeds, progress=False, log=log)
    return tabulate_study(runs, study.load_corpus(), study.preset, study.folder)
