"""A study's tables on disk (and the manifest names of study and sweep folders), and nothing that
makes them: what `headlab report DIR`, the figures and the widgets read, so that drawing a report
loads neither the trainer nor torch.

    write_study_tables(tables, folder)      # <name>.csv each, then study.json (meta, row counts, hashes)
    tables = read_study_tables(folder)      # each table checked against study.json, the meta against both

Which tables a study has and how they are computed: `headlab.study.tables`.

headlab ships the tables of `make demo`'s study (not its runs) as package data in `SHIPPED`, with
the commit and settings that produced them in their meta (`shipped`; scripts/ship_demo_tables.py
copies them there), so a notebook installed without the repository (Colab) shows them untrained.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from headlab.analysis.tables import load_tables, save_tables
from headlab.model.config import PRESETS, ModelConfig
from headlab.study.claims import BYTE_LOSS_UNIT
from headlab.study.conclusions import DISPLAY, with_conclusions

MANIFEST = "study.json"  # the study folder's manifest: its tables, with hashes
STUDY = "a study folder"
# A sweep folder: <folder>/sweep.csv listed in <folder>/sweep.json (besides its points' study folders).
SWEEP_MANIFEST, SWEEP = "sweep.json", "a sweep folder"
SHIPPED = Path(__file__).resolve().parent / "demo_tables"  # the demo study's tables, inside the package


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
