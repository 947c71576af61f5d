"""Where a notebook's study lives, from any working directory: make demo's study folder under the
project root (`headlab.study.paths`), the study of a notebook's SMALL switch with the folder its
outputs go to, and any finished study folder, whose preset and recipe are read from the folder."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from headlab.model.config import ModelConfig
from headlab.study.paths import project_root, shown_path
from headlab.study.study import Study, settings_key
from headlab.study.table_files import DEMO_PRESET, study_meta

SMALL_PRESET, SMALL_STEPS = "tiny", 60  # the notebooks' small mode (CI's smoke test)


def default_study_folder() -> Path:
    """Where `make demo` leaves its study: $HEADLAB_STUDY if set, else <project root>/runs/reproduce."""
    return Path(os.environ.get("HEADLAB_STUDY") or project_root() / "runs" / "reproduce")


class StudyNotShown(ValueError):
    """A study a notebook was asked to show and cannot: IPython shows the message as one line, not a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


@dataclass(frozen=True)
class NotebookStudy(Study):
    """The study a notebook reads. Small mode (CI's smoke test): the tiny preset for 60 steps,
    runs under <project root>/runs/notebooks/small/<settings key>. Full mode: the study of `make demo`
    (`default_study_folder`), so a finished demo is reused rather than trained again. A folder
    that holds a finished study (its study.json) is that study: preset, steps, corpus, tokenizer and
    every setting it changed are read from the folder, never assumed.

    `named`: the folder was named by the user (RUNS), so nothing may stand in for it (`stand_in`).
    `seeds`: how many seeds the folder's study has (None: no study there yet).
    `outputs` is where a notebook writes what it makes (figures, tables): always
    <project root>/runs/notebooks/<small|full>, never another study's folder."""

    outputs: Path | None = None  # None: <project root>/runs/notebooks/custom
    named: bool = False
    seeds: int | None = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "outputs", Path(self.outputs or project_root() / "runs" / "notebooks" / "custom"))

    @property
    def stand_in(self) -> bool:
        """Whether tables shipped with headlab may be shown where this study is not on disk: only
        for the default folder, never for one the user named."""
        return not self.named

    @classmethod
    def choose(cls, small: bool, runs: str | Path | None = None, preset: str | None = None) -> "NotebookStudy":
        """The study of a notebook's `SMALL` switch. `runs`: the study folder instead of the mode's
        (a finished study there is shown whatever its preset). `preset`: the study's preset where
        the folder holds none (default: tiny in small mode, cpu-small in full mode); a folder named
        in `runs` that holds a study of another preset is refused (StudyNotShown), one that
        is only the default is passed over for that preset's shipped tables."""
        outputs = project_root() / "runs" / "notebooks" / ("small" if small else "full")
        wanted = preset or (SMALL_PRESET if small else DEMO_PRESET)
        steps = SMALL_STEPS if small and wanted == SMALL_PRESET else None
        folder = Path(runs) if runs else outputs / settings_key(wanted, steps) if small else default_study_folder()
        try:
            meta = study_meta(folder)
        except ValueError as error:
            raise StudyNotShown(f"cannot show {shown_path(folder)}: {error}") from None
        if meta is None or (preset is not None and meta.get("preset") != preset and not runs):
            try:
                return cls(wanted, steps, folder, outputs=outputs, named=runs is not None)
            except ValueError as error:  # an unknown preset: the error names the known ones
                raise StudyNotShown(str(error)) from None
        if preset is not None and meta.get("preset") != preset:
            raise StudyNotShown(f"{shown_path(folder)} holds a {meta.get('preset')} study, not {preset}: set PRESET = "
                                "None to show it, or RUNS = None for the tables of " + preset)
        return cls.recorded(folder, meta, outputs, named=runs is not None)

    @classmethod
    def recorded(cls, folder: Path, meta: dict, outputs: Path, named: bool) -> "NotebookStudy":
        """The study whose tables' meta (study.json) is `meta`: its preset, steps, corpus and tokenizer,
        and the settings it changed from its preset, split into model and training overrides."""
        changed = meta.get("changed") or {}
        model_fields = {f.name for f in fields(ModelConfig)}
        try:
            return cls(meta["preset"], meta["steps"], folder, corpus=meta["corpus"], tokenizer=meta["tokenizer"],
                       model_overrides={k: v for k, v in changed.items() if k in model_fields},
                       train_overrides={k: v for k, v in changed.items() if k not in model_fields},
                       outputs=outputs, named=named, seeds=len(meta["seeds"]))
        except (KeyError, TypeError, ValueError) as error:
            raise StudyNotShown(f"cannot show {shown_path(folder)}: its study.json records a study headlab cannot "
                                f"rebuild ({type(error).__name__}: {error}); redraw it with headlab reproduce --out "
                                f"{shown_path(folder)}") from None
