"""The notebooks' study (headlab.notebook.NotebookStudy): where runs and outputs go, from any cwd."""

from pathlib import Path

from headlab.study import notebook, study

ROOT = Path(__file__).resolve().parent.parent


def test_full_mode_reads_make_demos_study_and_writes_beside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a notebook's cwd is notebooks/; anywhere else works the same
    full = notebook.NotebookStudy.choose(False)
    assert (full.preset, full.steps, full.folder) == ("cpu-small", None, ROOT / "runs" / "reproduce")
    assert full.outputs == ROOT / "runs" / "notebooks" / "full"
    assert full.run_folder(full.variants[0]).parent == ROOT / "runs" / "reproduce" / "runs"
    chosen = notebook.NotebookStudy.choose(False, runs=tmp_path / "elsewhere")
    assert chosen.folder == tmp_path / "elsewhere" and chosen.outputs == full.outputs


def test_small_mode_folder_is_keyed_by_every_setting_of_its_runs(monkeypatch):
    small = notebook.NotebookStudy.choose(True)
    assert (small.preset, small.steps) == ("tiny", 60)
    assert small.folder.parent == ROOT / "runs" / "notebooks" / "small" and len(small.folder.name) == 8
    assert small.outputs == ROOT / "runs" / "notebooks" / "small"
    assert not small.folder.is_relative_to(small.outputs / "analysis")
    assert study.settings_key("tiny", 60) == small.folder.name  # stable
    assert study.settings_key("tiny", 61) != small.folder.name  # a training setting
    config = small.variants[0]
    monkeypatch.setattr(study, "comparison_roles", lambda preset: {"mha": config.replace(d_model=config.d_model * 2)})
    assert study.settings_key("tiny", 60) != small.folder.name  # a model setting
