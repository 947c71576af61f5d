"""Studies' tables shipped inside the package (headlab/study/shipped/<preset>/): what
scripts/ship_tables.py copies there (tables, never runs, with the settings and commits
behind them), when `study_tables` reads them (nothing of the study on disk, the same settings),
and a non-editable install outside the repository (as on Colab) showing notebook 03 from them
without training. The study shipped here is the notebooks' small-mode one (tiny, 60 steps, one
seed); the installed notebook shows make demo's, which headlab ships."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from headlab.study import tables as tables_module
from headlab.study.notebook import NotebookStudy
from headlab.study.study import Study, settings_key
from headlab.study.table_files import read_study_tables, shipped_names
from headlab.study.tables import shipped_tables, study_tables, tabulate_study
from notebook_runs import full_mode_beside_a_begun_demo

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import ship_tables

pytestmark = pytest.mark.xdist_group("shipped_tables_study")  # `finished` trains runs: made once (conftest)

SMALL = NotebookStudy.choose(True)  # the notebooks' small-mode study: tiny, 60 steps


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Study:
    """A finished study of the notebooks' small-mode settings (one seed), as make demo leaves one."""
    study = Study(SMALL.preset, SMALL.steps, tmp_path_factory.mktemp("demo") / "study")
    runs = study.train(seeds=1, progress=False, log=lambda line: None)
    tabulate_study(runs, study.load_corpus(), study.preset, study.folder)
    return study


@pytest.fixture(scope="module")
def shipped(finished, tmp_path_factory) -> Path:
    """`finished`'s tables shipped into a package's folder of shipped tables, under its preset."""
    folder = tmp_path_factory.mktemp("package") / "shipped" / SMALL.preset
    ship_tables.ship(finished.folder, folder)
    return folder


def test_ship_copies_the_tables_not_the_runs_and_says_what_made_them(finished, shipped):
    source, tables = read_study_tables(finished.folder), read_study_tables(shipped)
    assert {p.name for p in shipped.iterdir()} == {f"{name}.csv" for name in source.tables} | {"study.json", ".lock"}
    assert all(tables[name].equals(table) for name, table in source.tables.items())  # no runs, report or figures
    provenance = tables.meta["shipped"]
    commits = {json.loads((run / "config.json").read_text())["git_commit"]
               for run in (finished.folder / "runs").iterdir()}
    assert provenance["settings_key"] == settings_key(SMALL.preset, SMALL.steps) == SMALL.folder.name
    assert set(provenance["commits"]) == commits and all(commit[:12] in provenance["note"] for commit in commits)
    assert sum(p.stat().st_size for p in shipped.iterdir()) < ship_tables.LIMIT_BYTES


def test_ship_refuses_runs_trained_with_other_settings_than_the_checkouts(finished, tmp_path, monkeypatch):
    monkeypatch.setattr(ship_tables, "settings_key", lambda preset, steps: "0123abcd")  # this checkout's, changed
    with pytest.raises(ValueError, match="trained with other settings than this checkout's tiny"):
        ship_tables.ship(finished.folder, tmp_path / "demo_tables")
    assert not (tmp_path / "demo_tables").exists()


def test_shipped_tables_are_read_only_where_nothing_of_the_study_is_on_disk(finished, shipped, tmp_path, monkeypatch):
    monkeypatch.setattr(tables_module, "SHIPPED_ROOT", shipped.parent)
    monkeypatch.setattr(Study, "train",
                        lambda *args, **kwargs: pytest.fail("trained instead of reading shipped tables"))
    said = []
    fresh = Study(SMALL.preset, SMALL.steps, tmp_path / "fresh")
    tables = study_tables(fresh, 1, log=said.append)
    assert tables["summary"].equals(read_study_tables(finished.folder)["summary"])
    assert said == [f"no study in {fresh.folder}: showing instead the tiny tables shipped with headlab "
                    f"({tables.meta['shipped']['note']}); nothing is trained"]
    assert not fresh.folder.exists()  # reading wrote nothing
    for other in (Study(SMALL.preset, SMALL.steps + 1, tmp_path), Study("cpu-small", SMALL.steps, tmp_path),
                  Study(SMALL.preset, SMALL.steps, tmp_path, only=("mha", "mqa")),
                  Study(SMALL.preset, SMALL.steps, tmp_path, train_overrides={"lr": 1e-3})):
        assert shipped_tables(other, 1) is None  # other settings: the shipped tables are not theirs
    assert shipped_tables(fresh, 2) is None  # more seeds than were shipped
    with monkeypatch.context() as changed:
        changed.setattr(tables_module, "settings_key", lambda preset, steps: "0123abcd")  # the preset changed since
        assert shipped_tables(fresh, 1) is None
    begun = Study(SMALL.preset, SMALL.steps, tmp_path / "begun")
    (begun.folder / "runs").mkdir(parents=True)  # a study of one's own under way: it is trained, not replaced
    with pytest.raises(pytest.fail.Exception, match="trained instead"):
        study_tables(begun, 1, log=said.append)


def test_study_tables_that_may_not_train_read_the_shipped_ones_beside_a_study_under_way(finished, shipped, tmp_path,
                                                                                         monkeypatch):
    """Notebooks 02 and 03 in full mode (train=False) show results and never train: beside a study
    of one's own under way (runs, no tables yet) they read the shipped tables and say why; with
    none shipped for the settings they stop with what to run."""
    monkeypatch.setattr(tables_module, "SHIPPED_ROOT", shipped.parent)
    monkeypatch.setattr(Study, "train", lambda *args, **kwargs: pytest.fail("trained although train=False"))
    begun = Study(SMALL.preset, SMALL.steps, tmp_path / "begun")
    (begun.folder / "runs").mkdir(parents=True)
    said = []
    tables = study_tables(begun, 1, log=said.append, train=False)
    assert tables["summary"].equals(read_study_tables(finished.folder)["summary"])
    assert said == [f"the study in {begun.folder} is not finished (no tables yet): showing instead the tiny tables "
                    f"shipped with headlab ({tables.meta['shipped']['note']}); nothing is trained"]
    assert [p.name for p in begun.folder.iterdir()] == ["runs"]  # reading wrote nothing
    with pytest.raises(ValueError, match="train them first .notebook 01 with SMALL = False, or headlab reproduce"):
        study_tables(begun, 2, log=said.append, train=False)  # two seeds: none shipped
    with pytest.raises(ValueError, match=r"^the study in .* is not finished \(no tables yet\): nothing to show"):
        study_tables(begun, 1, log=said.append, train=False, stand_in=False)  # a folder the user named


@pytest.mark.parametrize("damage", ["edited", "deleted", "no manifest"])
def test_damaged_shipped_tables_name_the_damaged_installation(tmp_path, monkeypatch, damage):
    """Tables the package shipped that no longer read as shipped are a damaged install, not
    "none shipped": the error says so and how to mend it, whatever the study asks for."""
    import shutil

    from headlab.study.table_files import SHIPPED

    package = tmp_path / "shipped" / SMALL.preset
    shutil.copytree(SHIPPED, package)
    summary = package / "summary.csv"
    {"edited": lambda: summary.write_text(summary.read_text() + "0"), "deleted": summary.unlink,
     "no manifest": (package / "study.json").unlink}[damage]()
    monkeypatch.setattr(tables_module, "SHIPPED_ROOT", package.parent)
    fresh = Study(SMALL.preset, SMALL.steps, tmp_path / "fresh")
    with pytest.raises(ValueError, match=r"^the tiny tables shipped with headlab are damaged, so is this "
                                         r"installation of headlab \(.*\): reinstall headlab"):
        study_tables(fresh, 1, log=lambda line: None, train=False)
    assert not fresh.folder.exists()


@pytest.mark.slow
def test_notebook_03_installed_outside_the_repository_shows_the_shipped_tables_untrained(tmp_path, monkeypatch):
    """pip installs a copy of the source tree as a plain, non-editable package; notebook 03 then runs
    in full mode (make demo's study, as a Colab user chooses it) from a folder outside any checkout,
    on that package, beside a make demo under way (its runs/ begun, no tables yet): it shows the
    cpu-small tables the package holds, with the other recipe shipped beside them in its explorer,
    and trains nothing and writes nothing into the study. (Full mode in a fresh clone: notebook 02
    in tests/notebooks/test_notebooks_fresh.py.)"""
    source = tmp_path / "source"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True)
    shipped = source / "headlab" / "study" / "shipped"
    for name in shipped_names(shipped):  # package data: every shipped table and manifest
        assert {p.name for p in (site / "headlab" / "study" / "shipped" / name).iterdir()} == \
            {p.name for p in (shipped / name).iterdir()} - {".lock"}, name

    elsewhere = tmp_path / "colab"
    elsewhere.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))  # the kernel imports the installed copy, not this checkout
    monkeypatch.delenv("HEADLAB_STUDY", raising=False)
    notebook = nbformat.read(ROOT / "notebooks" / "03_compare_layers.ipynb", as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("import headlab\nprint(headlab.__file__)"))
    nbformat.write(notebook, elsewhere / "03_compare_layers.ipynb")
    text = full_mode_beside_a_begun_demo(elsewhere, elsewhere / "03_compare_layers.ipynb")
    assert f"{site / 'headlab' / '__init__.py'}\n" in text
    assert "recipes in the explorer: Muon split, AdamW on W_Q, W_K" in text


@pytest.mark.parametrize("edit", ["none", "recipe", "added"])
def test_rekey_records_todays_key_only_for_tables_trained_with_todays_recipe(tmp_path, monkeypatch, edit):
    """`ship_tables.py --rekey NAME` moves the shipped tables to today's settings key when the key's rule
    changed (fields added, how runs execute left out), and refuses tables whose recorded recipe is not
    today's, or that lack a field today's preset holds away from its default (the model's shape is held
    by read_study_tables)."""
    from headlab.study.table_files import SHIPPED, StudyTables, write_study_tables

    tables = read_study_tables(SHIPPED)
    meta = {**tables.meta, "shipped": {**tables.meta["shipped"], "settings_key": "00000000"}}
    if edit == "recipe":
        meta["train"] = {**meta["train"], "matrix_lr": meta["train"]["matrix_lr"] * 2}
    if edit == "added":  # the tables predate muon_qk; today's preset as if it left W_Q, W_K to AdamW
        assert "muon_qk" not in meta["train"]
        preset_config = Study.train_config
        monkeypatch.setattr(Study, "train_config",
                            lambda self, seed=0: preset_config(self, seed).replace(muon_qk=False))
    write_study_tables(StudyTables(tables.tables, meta), tmp_path / "shipped")
    if edit != "none":
        with pytest.raises(ValueError, match="trained with other settings"):
            ship_tables.rekey(tmp_path / "shipped")
        return
    rekeyed = ship_tables.rekey(tmp_path / "shipped")
    assert rekeyed.meta["shipped"]["settings_key"] == settings_key(meta["preset"], int(meta["steps"]))
