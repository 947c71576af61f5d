"""Where a notebook's study lives, from any working directory: make demo's study folder under the
project root (`headlab.study.paths`), and the study of a notebook's SMALL switch with the folder
its outputs go to."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from headlab.study.paths import project_root
from headlab.study.study import Study, settings_key


def default_study_folder() -> Path:
    """Where `make demo` leaves its study: $HEADLAB_STUDY if set, else <project root>/runs/reproduce."""
    return Path(os.environ.get("HEADLAB_STUDY") or project_root() / "runs" / "reproduce")


@dataclass(frozen=True)
class NotebookStudy(Study):
    """The study a notebook reads. Small mode (CI's smoke test): the tiny preset for 60 steps,
    runs under <project root>/runs/notebooks/small/<settings key>. Full mode: the cpu-small study of `make demo`
    (`default_study_folder`), so a finished demo is reused rather than trained again.

    `outputs` is where a notebook writes what it makes (figures, tables): always
    <project root>/runs/notebooks/<small|full>, never another study's folder."""

    outputs: Path | None = None  # None: <project root>/runs/notebooks/custom

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "outputs", Path(self.outputs or project_root() / "runs" / "notebooks" / "custom"))

    @classmethod
    def choose(cls, small: bool, runs: str | Path | None = None) -> "NotebookStudy":
        """The study of a notebook's `SMALL` switch; `runs` overrides the folder the runs live in."""
        preset, steps = ("tiny", 60) if small else ("cpu-small", None)
        outputs = project_root() / "runs" / "notebooks" / ("small" if small else "full")
        folder = Path(runs) if runs else outputs / settings_key(preset, steps) if small else default_study_folder()
        return cls(preset, steps, folder, outputs=outputs)
