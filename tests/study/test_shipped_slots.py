"""What ships inside the package besides make demo's tables (headlab/study/shipped/): every folder
there reads back verified, the regime study's probe table is its page's table, an analysis of one
model (a pretrained checkpoint's, later) ships the same way, and a study is set beside the shipped
studies that differ from it in their recipe alone."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from headlab.analysis.similarity import analyze
from headlab.model.config import preset
from headlab.model.gpt import GPT
from headlab.study.table_files import (
    SHIPPED,
    SHIPPED_ROOT,
    read_shipped,
    read_study_tables,
    recipe_name,
    recipes_beside,
    shipped_folder,
    shipped_names,
    write_study_tables,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import ship_tables

PAGE = ROOT / "science" / "regime_study.md"


def test_every_shipped_folder_reads_back_and_unknown_names_are_one_line():
    assert {"cpu-small", ship_tables.THROUGH_TRAINING} <= set(shipped_names())
    for name in shipped_names():
        assert read_shipped(name).tables  # each table verified against its manifest
    with pytest.raises(ValueError, match="no tables named 'cpu-large' ship with headlab: choose one of cpu-small"):
        shipped_folder("cpu-large")


def test_the_shipped_probe_table_is_the_regime_pages(tmp_path):
    """Re-shipped from the page, the table is the one in the package: a page redrawn with other
    numbers fails here until the table is shipped again (scripts/ship_tables.py --through-training)."""
    fresh = ship_tables.ship_through_training(PAGE, tmp_path)["through_training"]
    assert fresh.equals(read_shipped(ship_tables.THROUGH_TRAINING)["through_training"])
    assert set(fresh["recipe"]) == {"Muon split", "AdamW on W_Q, W_K"} and (fresh["step"] == 0).sum() == 2
    start = fresh[fresh["step"] == 0]  # the same seeds draw the same initial weights under either recipe
    assert start["weights_lambda1"].nunique() == 1 and start["data_aware_lambda1"].nunique() == 1
    broken = tmp_path / "page.md"
    broken.write_text(PAGE.read_text().replace(ship_tables.THROUGH_HEADING, "Both views"))
    with pytest.raises(ValueError, match="has no line starting"):
        ship_tables.ship_through_training(broken, tmp_path)


def test_an_analysis_of_one_model_ships_under_its_name(tmp_path):
    analysis = analyze(GPT(preset("tiny").replace(n_layer=1)), label="a checkpoint")
    analysis.save(tmp_path / "analysis")
    shipped = ship_tables.ship_analysis(tmp_path / "analysis", "a-checkpoint", tmp_path / "shipped")
    assert shipped.summary.equals(analysis.summary)
    assert shipped_names(tmp_path / "shipped") == ["a-checkpoint"]
    assert read_shipped("a-checkpoint", tmp_path / "shipped")["spectra"].equals(analysis.spectra)
    with pytest.raises(ValueError, match="--name '../out' is invalid"):
        ship_tables.ship_analysis(tmp_path / "analysis", "../out", tmp_path / "shipped")


def test_recipes_beside_a_study_are_the_shipped_studies_of_its_shape_under_another_recipe(tmp_path):
    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED, root / "cpu-small")
    demo = read_study_tables(SHIPPED)
    assert recipes_beside(demo, root) == []  # itself: the same recipe
    other = {**demo.meta, "train": {**demo.meta["train"], "muon_qk": False}}
    assert recipe_name(other) == "AdamW on W_Q, W_K"
    beside = recipes_beside(type(demo)(demo.tables, other), root)
    assert [recipe_name(study.meta) for study in beside] == ["Muon split"]
    assert recipes_beside(type(demo)(demo.tables, {**other, "steps": 450}), root) == []  # another shape
    assert SHIPPED.parent == SHIPPED_ROOT


def test_recipes_beside_a_study_read_no_table_of_a_shipped_study_of_another_shape(tmp_path):
    """A shipped study is chosen by its study.json's meta: one of another shape is never read, so its
    tables cost a notebook nothing (here they would not even verify), while a chosen one's are."""
    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED, root / "cpu-small")
    demo = read_study_tables(SHIPPED)
    write_study_tables(type(demo)(demo.tables, {**demo.meta, "steps": 450}), root / "cpu-small-450")
    with (root / "cpu-small-450" / "summary.csv").open("a") as table:
        table.write("damaged\n")
    other = type(demo)(demo.tables, {**demo.meta, "train": {**demo.meta["train"], "muon_qk": False}})
    assert [recipe_name(study.meta) for study in recipes_beside(other, root)] == ["Muon split"]
    with (root / "cpu-small" / "summary.csv").open("a") as table:
        table.write("damaged\n")
    with pytest.raises(ValueError):
        recipes_beside(other, root)
