"""`headlab reproduce` end to end on the tiny preset with two seeds: every artefact is written,
the report quotes this run's own numbers, and a second call reuses the finished runs."""

import re
from pathlib import Path

import pandas as pd
import pytest

from headlab.config import comparison_variants
from headlab.reproduce import FIGURES, NotebookStudy, reproduce, slug
from headlab.train import train_preset

STEPS = 12


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce")
    log = []
    report = reproduce("tiny", seeds=2, out=out, steps=STEPS, progress=False, log=log.append)
    return out, report, log


def _report_row(report_text: str, section: str, label: str) -> list[str]:
    body = report_text.split(section, 1)[1].split("\n## ", 1)[0]
    row = next(line for line in body.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_every_artefact_is_written(study):
    out, report, _ = study
    assert report == out / "report.md"
    for name in FIGURES:
        for suffix in ("png", "svg"):
            assert (out / "figures" / f"{name}.{suffix}").stat().st_size > 1000, (name, suffix)
    for name in ("spectra", "summary", "similarity", "training"):
        assert (out / f"{name}.csv").exists(), name
    text = report.read_text()
    for name in FIGURES:
        assert f"figures/{name}.png" in text


def test_tables_hold_both_seeds_of_all_six_variants(study):
    out, _, _ = study
    labels = {config.label for config in comparison_variants("tiny")}
    spectra = pd.read_csv(out / "spectra.csv")
    training = pd.read_csv(out / "training.csv")
    assert set(spectra["seed"]) == {0, 1}
    assert set(spectra["model"]) == labels
    finals = training.groupby(["model", "seed"])["step"].max()
    assert len(finals) == 12 and (finals == STEPS).all()
    # Two seeds are two different trainings, not one run counted twice.
    last = training[training["step"] == STEPS].pivot(index="model", columns="seed", values="val_loss")
    assert (last[0] != last[1]).all()


def test_report_quotes_this_runs_numbers(study):
    out, report, _ = study
    text = report.read_text()
    training = pd.read_csv(out / "training.csv")
    summary = pd.read_csv(out / "summary.csv")
    final = training[training["step"] == STEPS].groupby("model")["val_loss"].mean()
    ranks = (summary[summary["circuit"] == "qk"]
             .groupby(["model", "kind"])["effective_rank_pct_of_heads"].mean())
    for config in comparison_variants("tiny"):
        label = config.label
        loss_row = _report_row(text, "## Validation loss", label)
        assert float(loss_row[1]) == pytest.approx(final[label], abs=6e-4)
        assert loss_row[3] == "2"  # seeds
        rank_row = _report_row(text, "## Effective rank", label)
        assert float(rank_row[1]) == pytest.approx(ranks[(label, "uncentered")], abs=0.051)
        assert float(rank_row[2]) == pytest.approx(ranks[(label, "centered")], abs=0.051)
        cache_row = _report_row(text, "## KV cache", label)
        assert int(cache_row[1]) == config.kv_cache_values_per_token()
    assert re.search(r"2 seed\(s\)", text)


def test_a_second_call_reuses_the_finished_runs(study):
    out, report, _ = study
    metrics = {path: path.read_bytes() for path in (out / "runs").glob("*/metrics.jsonl")}
    assert len(metrics) == 12
    assert {path.parent.name for path in metrics} == {
        f"{slug(config.label)}-seed{seed}" for config in comparison_variants("tiny") for seed in (0, 1)}
    spectra_before = (out / "spectra.csv").read_text()
    reproduce("tiny", seeds=2, out=out, steps=STEPS, progress=False, log=lambda message: None)
    assert {path: path.read_bytes() for path in metrics} == metrics
    assert (out / "spectra.csv").read_text() == spectra_before


def test_bad_seed_count_is_refused():
    with pytest.raises(ValueError, match="seeds = 0 is invalid"):
        reproduce("tiny", seeds=0, out="unused")


def test_notebook_study_finds_the_runs_where_they_were_trained(study):
    out, _, _ = study
    found = NotebookStudy("tiny", STEPS, out)
    for seed in (0, 1):
        assert found.finished_runs(seed) == [found.run_folder(config, seed) for config in found.variants]
        assert all((folder / "metrics.jsonl").exists() for folder in found.finished_runs(seed))
    assert NotebookStudy("tiny", STEPS, out / "elsewhere").finished_runs() == []
    assert found.train_config(seed=1).steps == STEPS and found.train_config(seed=1).seed == 1


@pytest.mark.parametrize("small, preset, steps, folder", [(True, "tiny", 60, "runs/notebooks/small"),
                                                          (False, "cpu-small", None, "runs/notebooks/full")])
def test_notebook_study_modes(small, preset, steps, folder):
    chosen = NotebookStudy.choose(small)
    assert (chosen.preset, chosen.steps, chosen.folder) == (preset, steps, Path(folder))
    assert NotebookStudy.choose(small, runs="elsewhere").folder == Path("elsewhere")
    assert chosen.train_config().steps == (steps or train_preset(preset).steps)
