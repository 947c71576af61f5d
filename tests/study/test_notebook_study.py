"""The notebooks' study (headlab.notebook.NotebookStudy): where runs and outputs go, from any cwd."""

from dataclasses import asdict, fields
from pathlib import Path

import pytest

from headlab.study import notebook, paths, study

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_field_added_since_keys_began_changes_the_key_only_away_from_its_default():
    """ModelConfig.arch came after the shipped tables and the trained runs: at its default it leaves
    their keys as they were; any other value, or any field keyed from the start, changes them."""
    config, train = study.Study("tiny", 60, Path(".")).variants[0], study.Study("tiny", 60, Path(".")).train_config()
    model = config.to_dict()
    before_arch = {name: value for name, value in model.items() if name != "arch"}
    digest = lambda model_dict: study.settings_digest([[model_dict, asdict(train)]])
    assert digest(model) == digest(before_arch)
    assert digest(config.replace(arch="nanochat").to_dict()) != digest(model)
    assert digest({name: value for name, value in model.items() if name != "qk_norm"}) != digest(model)
    for config_class, names in study.ALWAYS_KEYED.items():
        assert set(names) <= {f.name for f in fields(config_class)}, config_class  # every name a field


def test_how_a_run_executes_never_changes_the_key():
    """Processes, device and compiling do not change what is trained (a run resumes across them), so
    a setting keeps its key under any of them; a training setting changes it."""
    config, train = study.Study("tiny", 60, Path(".")).variants[0], study.Study("tiny", 60, Path(".")).train_config()
    digest = lambda train_config: study.settings_digest([[config.to_dict(), asdict(train_config)]])
    for changed in (dict(compile="off"), dict(compile="aot_eager"), dict(device="cpu"), dict(parallel="fsdp"),
                    dict(grad_accum=2)):
        assert digest(train.replace(**changed)) == digest(train), changed
    assert digest(train.replace(weight_decay=0.0)) != digest(train)


def test_log_lines_name_folders_of_the_project_relative_to_the_working_directory(tmp_path, monkeypatch):
    """A notebook runs in notebooks/: the study's lines in its saved output name no machine's
    folders; a folder outside the project is named as it is."""
    project = tmp_path / "clone"
    (project / "notebooks").mkdir(parents=True)
    (project / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    monkeypatch.chdir(project / "notebooks")
    assert paths.shown_path(project / "runs" / "reproduce" / "runs") == "../runs/reproduce/runs"
    assert paths.shown_path(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")
    said = []
    study.Study("tiny", 2, project / "runs" / "reproduce", only=("mha",)).train(progress=False, log=said.append)
    assert any(line.startswith("training 1 of 1 runs") and "into ../runs/reproduce/runs" in line for line in said)


def test_a_folder_of_finished_tables_is_shown_as_the_study_it_holds_never_as_the_modes(tmp_path, monkeypatch):
    """A study folder named in RUNS is the study its study.json records (preset, steps, seeds), in
    either mode, never the mode's assumed cpu-small or tiny; tables kept without their runs are
    shown as written and say so; a PRESET that contradicts the folder is one line, not a fallback."""
    import shutil

    from headlab.study.table_files import SHIPPED, read_study_tables
    from headlab.study.tables import study_tables

    folder = tmp_path / "kept"
    shutil.copytree(SHIPPED, folder)  # make demo's tables (cpu-small, 3 seeds), without runs
    monkeypatch.setattr(study.Study, "train", lambda *args, **kwargs: pytest.fail("trained a study it was to show"))
    for small in (True, False):
        chosen = notebook.NotebookStudy.choose(small, runs=folder)
        assert (chosen.preset, chosen.steps, chosen.seeds, chosen.named) == ("cpu-small", 900, 3, True)
    said = []
    tables = study_tables(chosen, chosen.seeds, log=said.append, train=False, stand_in=chosen.stand_in)
    assert tables["summary"].equals(read_study_tables(SHIPPED)["summary"])
    assert said == [f"{folder} holds the tables of a cpu-small study without its runs: shown as written"]
    with pytest.raises(notebook.StudyNotShown, match="holds a cpu-small study, not tiny: set PRESET = None"):
        notebook.NotebookStudy.choose(False, runs=folder, preset="tiny")
    with pytest.raises(notebook.StudyNotShown, match="'cpu-smal'"):
        notebook.NotebookStudy.choose(False, preset="cpu-smal")  # a typo: one line naming the presets
    with pytest.raises(ValueError, match=r"holds 3 seed\(s\) of a cpu-small study, not 1 of cpu-small: nothing to"):
        study_tables(chosen, 1, log=said.append, train=False, stand_in=False)


def test_a_study_that_cannot_be_shown_is_one_line_in_a_notebook():
    """IPython prints an exception's `_render_traceback_` instead of its traceback."""
    error = notebook.StudyNotShown("runs/qk holds a cpu-small study, not tiny")
    assert error._render_traceback_() == ["StudyNotShown: runs/qk holds a cpu-small study, not tiny"]
