"""A study's tables on disk (and the manifest names of study and sweep folders), and nothing that
makes them: what `headlab report DIR`, the figures and the widgets read, so that drawing a report
loads neither the trainer nor torch.

    write_study_tables(tables, folder)      # <name>.csv each, then study.json (meta, row counts, hashes)
    tables = read_study_tables(folder)      # each table checked against study.json, the meta against both

Which tables a study has and how they are computed: `headlab.study.tables`.

headlab ships the tables of finished studies (not their runs) as package data, one folder per
study under `SHIPPED_ROOT`, named by its preset (`shipped_folder`): `make demo`'s (`DEMO_PRESET`,
also `SHIPPED`) and the same study with AdamW on W_Q, W_K (`cpu-small-adamw-qk`), each with the
commit and settings that produced it in its meta (`shipped`; scripts/ship_tables.py copies them
there), so a notebook installed without the repository (Colab) shows them untrained. A folder
there holds a study's tables (study.json), for a pretrained checkpoint an analysis's (analysis.json,
`headlab.analysis.similarity.Analysis.load`), or a science page's small table (tables.json: the
regime study's two views through training, `regime-through-training`); `shipped_names` lists them
all, `read_shipped` reads any.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from headlab.analysis.tables import load_tables, save_tables
from headlab.io import Manifest
from headlab.model.config import PRESETS, ModelConfig
from headlab.study.claims import BYTE_LOSS_UNIT
from headlab.study.conclusions import DISPLAY, with_conclusions

MANIFEST = "study.json"  # the study folder's manifest: its tables, with hashes
STUDY = "a study folder"
# A sweep folder: <folder>/sweep.csv listed in <folder>/sweep.json (besides its points' study folders).
SWEEP_MANIFEST, SWEEP = "sweep.json", "a sweep folder"
SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"  # tables shipped inside the package, a folder each
DEMO_PRESET = "cpu-small"  # make demo's study
SHIPPED = SHIPPED_ROOT / DEMO_PRESET  # make demo's tables, inside the package
# What a shipped folder may hold, by its manifest: a study's tables, an analysis of one model (a pretrained
# checkpoint: `Analysis.save`), or tables of another kind (a science page's, e.g. the regime study's probe).
SHIPPED_MANIFESTS = {MANIFEST: STUDY, "analysis.json": "an analysis folder", "tables.json": "a folder of tables"}


def shipped_folder(name: str, root: Path | None = None) -> Path:
    """The folder of the tables shipped as `name` (a study's preset, or a checkpoint's name) under
    `root` (default `SHIPPED_ROOT`); a ValueError naming the shipped ones if there is none."""
    names = shipped_names(root)
    if name not in names:
        raise ValueError(f"no tables named {name!r} ship with headlab: choose one of {', '.join(names) or 'none'}")
    return (root or SHIPPED_ROOT) / name


def shipped_names(root: Path | None = None) -> list[str]:
    """The names of the tables shipped under `root` (default `SHIPPED_ROOT`): its folders holding a
    manifest of `SHIPPED_MANIFESTS`, in name order."""
    root = root or SHIPPED_ROOT
    return sorted(p.name for p in root.iterdir() if any((p / m).is_file() for m in SHIPPED_MANIFESTS)) \
        if root.is_dir() else []


def read_shipped(name: str, root: Path | None = None) -> StudyTables:
    """The tables shipped as `name` (`shipped_names`) and their meta, each table verified against its
    manifest; a study's also against its meta (`read_study_tables`)."""
    folder = shipped_folder(name, root)
    manifest = next(m for m in SHIPPED_MANIFESTS if (folder / m).is_file())
    if manifest == MANIFEST:
        return read_study_tables(folder)
    return StudyTables(*load_tables(folder, manifest, SHIPPED_MANIFESTS[manifest]))


def recipe_name(meta: dict) -> str:
    """A study's training recipe in a few words, for figure titles (`recipe_text` says it in full):
    "Muon split" (the paper's: Muon on the blocks' matrices, AdamW on the rest), "AdamW on W_Q, W_K"
    (that split with W_Q and W_K taken from Muon), "AdamW" (AdamW everywhere); "recipe not recorded"
    for tables written before studies recorded it."""
    train = meta.get("train")
    if not isinstance(train, dict):
        return "recipe not recorded"
    if train.get("optimizer") != "muon":
        return "AdamW"
    # muon_qk is absent from tables written before it was an option: Muon trained W_Q, W_K then
    return "Muon split" if train.get("muon_qk", True) else "AdamW on W_Q, W_K"


def with_recipe(tables: StudyTables) -> StudyTables:
    """`tables` with a `recipe` column (`recipe_name` of their meta) in every table of methods (a
    `model` column), so that a figure's title names the recipe and tables of two recipes can be
    stacked (the explorer then offers the recipe as a choice)."""
    recipe = recipe_name(tables.meta)
    return StudyTables({name: table.assign(recipe=recipe) if "model" in table.columns else table
                        for name, table in tables.tables.items()}, tables.meta)


SHAPE = ("n_layer", "n_head", "d_model", "head_dim", "corpus", "tokenizer", "steps", "seeds")  # what recipes share


def recipes_beside(tables: StudyTables, root: Path | None = None) -> list[StudyTables]:
    """The studies shipped with headlab (under `root`, default `SHIPPED_ROOT`) that differ from
    `tables` in their recipe alone: the same `SHAPE` (model, corpus, steps, seeds), another
    `recipe_name`; in name order. What the explorer sets beside a study to switch recipes. Each
    study is chosen by the meta in its study.json, and only a chosen one's tables are read (and
    verified: `read_study_tables`), so the shipped studies of other shapes cost a notebook nothing."""
    beside = []
    for name in shipped_names(root):
        folder = (root or SHIPPED_ROOT) / name
        meta = study_meta(folder) if (folder / MANIFEST).is_file() else None  # None: an analysis of one model
        if (meta is not None and all(meta.get(key) == tables.meta.get(key) for key in SHAPE)
                and recipe_name(meta) != recipe_name(tables.meta)):
            beside.append(read_study_tables(folder))
    return beside


def stack_recipes(studies: list[StudyTables]) -> dict[str, pd.DataFrame]:
    """The tables the studies all have, each study's rows marked with its recipe (`with_recipe`) and
    stacked, for the explorer (which then offers the recipe as a choice). Studies of two recipes of
    one name cannot be told apart: a ValueError."""
    recipes = [recipe_name(study.meta) for study in studies]
    if len(set(recipes)) != len(recipes):
        raise ValueError(f"studies of the recipes {', '.join(recipes)} cannot be stacked: a recipe appears twice")
    names = [name for name in studies[0].tables if all(name in study.tables for study in studies)]
    labelled = [with_recipe(study) for study in studies]
    return {name: pd.concat([study[name] for study in labelled], ignore_index=True) for name in names}


def loss_unit(tokenizer: str) -> str:
    """What a validation loss is per: a byte for the byte tokenizer (a token is a byte), else a token."""
    return BYTE_LOSS_UNIT if tokenizer == "byte" else "nats/token"


@dataclass(frozen=True)
class StudyTables:
    """A study's tables by name and its meta (what each holds: `headlab.study.tables`)."""

    tables: dict[str, pd.DataFrame]
    meta: dict

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def write_study_tables(tables: StudyTables, folder: str | Path) -> Path:
    """Every table as <name>.csv in `folder`, then study.json (meta, row counts, hashes) last."""
    return save_tables(folder, tables.tables, MANIFEST, STUDY, tables.meta)


def read_study_tables(folder: str | Path) -> StudyTables:
    """The tables `write_study_tables` left in `folder`, each checked against study.json, and
    the meta against the tables (`unsupported_meta`); with the study's conclusions
    (`headlab.study.conclusions`), computed here for tables written before studies kept them."""
    tables, meta = load_tables(folder, MANIFEST, STUDY, text_tables=DISPLAY)
    problem = unsupported_meta(tables, meta)
    if problem:
        raise ValueError(f"{Path(folder) / MANIFEST} says {problem} (edited by hand?): the report would state what "
                         "the study is not; write the study's tables again (headlab reproduce)")
    return StudyTables(with_conclusions(tables, meta), meta)


def study_meta(folder: str | Path) -> dict | None:
    """The meta of the study whose tables `folder` holds, read from its study.json (the tables are not
    read: `read_study_tables` verifies them); None where the folder has no study.json, or one that
    lists no tables yet (a study whose runs are still training). A study.json that is not a study
    folder's manifest is a ValueError."""
    if not (Path(folder) / MANIFEST).is_file():
        return None
    meta = Manifest.read(Path(folder), MANIFEST, STUDY).meta
    return meta.get("meta") if isinstance(meta.get("meta"), dict) and "tables" in meta else None


def unsupported_meta(tables: dict[str, pd.DataFrame], meta: dict) -> str | None:
    """What a study's meta claims that its preset or its tables contradict, else None. The
    tables are hashed but the meta beside them in study.json is not, so it is checked by what
    it states: a headlab preset which, with the settings the meta says were changed (or set), has the
    meta's shape (layers, heads, widths), and tables of that many layers and heads, of the meta's
    seeds and number of runs."""
    preset_name = meta.get("preset")
    if not isinstance(preset_name, str) or preset_name not in PRESETS:
        return f"preset {preset_name!r}, which headlab has not"
    model_fields = {f.name for f in fields(ModelConfig)}
    # every setting of the runs' configs: those that change them, and those they hold though no run reads
    # them (n_kv_head beside an n_head it must divide)
    changed = {k: v for key in ("unread", "changed") if isinstance(meta.get(key), dict) for k, v in meta[key].items()}
    try:
        shape = PRESETS[preset_name].replace(**{k: v for k, v in changed.items() if k in model_fields})
    except (TypeError, ValueError) as error:
        return f"preset {preset_name!r} with changed settings it cannot take ({error})"
    for field in ("n_layer", "n_head", "d_model", "head_dim"):
        if meta.get(field) != getattr(shape, field):
            return f"{field} = {meta.get(field)!r}, but preset {preset_name!r} has {getattr(shape, field)!r}"
    summary, training = tables.get("summary"), tables.get("training")
    if summary is not None and len(summary):
        if (int(summary["layer"].max()) + 1, int(summary["n_heads"].max())) != (meta["n_layer"], meta["n_head"]):
            return (f"{meta['n_layer']} layers x {meta['n_head']} heads, but its tables hold "
                    f"{int(summary['layer'].max()) + 1} x {int(summary['n_heads'].max())}")
    if training is not None and len(training):
        seeds = sorted(int(s) for s in training["seed"].unique())
        runs = len(training[["role", "seed"]].drop_duplicates())
        if (meta.get("seeds"), meta.get("n_runs")) != (seeds, runs):
            return (f"seeds {meta.get('seeds')} and {meta.get('n_runs')} runs, but its tables hold seeds {seeds} "
                    f"({runs} runs)")
    return None
