"""The verdicts of the shipped demo study (headlab/study/shipped/cpu-small, what the README, docs/headline.md
and report.md state) survive a rerun on another machine: moved by machine noise, the same tables
give the same verdicts, since each metric's margin (headlab.study.claims.MARGINS) stands clear of it.

Machine noise as measured (issue 38): the same seeds at the same commit on another CPU moved a
final loss by 0.006 nats/byte (MHA seed 1: 1.6284 → 1.6228) and MLA's per-seed rank gaps by tenths
of a point (its uncentered gap to MHA went from −0.23 ± 0.25 to −0.19 ± 0.12 points of % of H). Each
copy here moves every run's losses by up to LOSS_NOISE and its ranks by up to RANK_NOISE, one
shift per run, metric and table (a run's trajectory moves as a whole, not layer by layer)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headlab.study.claims import (
    claims,
    halfway,
    measure_claims,
    per_seed_metrics,
    per_seed_ranks,
    per_step_metrics,
    training_claims,
)
from headlab.study.table_files import SHIPPED, StudyTables, read_study_tables

LOSS_NOISE = 0.006  # nats/byte
RANK_NOISE = 0.2  # points of % of H
COPIES = 8


def verdict_sentences(tables: StudyTables) -> list[str]:
    """Every verdict sentence the report and the headline print (the headline's are the report's
    `claims` without their settling marks), each with its numbers replaced by '#': what is left is
    the verdict and what it is about."""
    metrics = per_seed_metrics(tables["summary"], tables["training"])
    sentences = [*claims(metrics), *claims(metrics, halfway(tables["snapshot_summary"], tables["training"])),
                 *measure_claims(per_seed_ranks(tables["measures"])),
                 *training_claims(per_step_metrics(tables["snapshot_summary"]))]
    return [re.sub(r"[-+]?\d+(\.\d+)?", "#", s) for s in sentences]


def moved(tables: StudyTables, generator: np.random.Generator) -> StudyTables:
    """`tables` with each run's losses and ranks shifted by machine noise (one uniform draw per run,
    metric and table: up to LOSS_NOISE, RANK_NOISE)."""
    def shift(table: pd.DataFrame, column: str, size: float) -> pd.DataFrame:
        runs = table[["model", "seed"]].drop_duplicates()
        runs = runs.assign(offset=generator.uniform(-size, size, len(runs)))
        offsets = table[["model", "seed"]].merge(runs, on=["model", "seed"], how="left")["offset"].to_numpy()
        return table.assign(**{column: table[column] + offsets})

    changed = {"training": shift(tables["training"], "val_loss", LOSS_NOISE),
               **{name: shift(tables[name], "effective_rank_pct_of_heads", RANK_NOISE)
                  for name in ("summary", "snapshot_summary", "measures")}}
    return StudyTables({**tables.tables, **changed}, tables.meta)


@pytest.fixture(scope="module")
def shipped() -> StudyTables:
    return read_study_tables(SHIPPED)


@pytest.fixture(scope="module")
def shipped_verdicts(shipped) -> list[str]:
    """`verdict_sentences(shipped)`, worked out once for every copy it is compared with."""
    return verdict_sentences(shipped)


def test_the_shipped_verdicts_are_stated_and_unambiguous(shipped_verdicts):
    """The comparison is worth making: the shipped study states verdicts of each kind it can."""
    assert any("within ±#" in s for s in shipped_verdicts) and any(" by # ± #" in s for s in shipped_verdicts)


@pytest.mark.parametrize("copy", range(COPIES))
def test_machine_noise_moves_no_verdict_of_the_shipped_study(shipped, shipped_verdicts, copy):
    noisy = moved(shipped, np.random.default_rng(copy))
    assert not noisy["training"]["val_loss"].equals(shipped["training"]["val_loss"])
    assert verdict_sentences(noisy) == shipped_verdicts


FRESH_DEMO = Path(__file__).resolve().parents[2] / "runs" / "reproduce"  # where `make demo` writes


@pytest.mark.skipif(not (FRESH_DEMO / "study.json").is_file(),
                    reason="no make demo study in runs/reproduce: run `make demo` before `make test` to compare "
                           "its verdicts with the shipped ones")
def test_a_fresh_make_demo_states_the_shipped_verdicts(shipped_verdicts):
    """The real thing the noisy copies stand in for: the study `make demo` trained on this machine
    gives every verdict the shipped study gives (its numbers may differ within the margins)."""
    assert verdict_sentences(read_study_tables(FRESH_DEMO)) == shipped_verdicts
