"""headlab.study: one way to train, reuse and resume a study's runs, as typed records keyed by
role; where the notebooks find their runs and where they write."""

import os
import re
from pathlib import Path

import pytest

import headlab
from headlab.study.notebook import NotebookStudy, default_study_folder
from headlab.study.paths import project_root
from headlab.study.roles import comparison_roles
from headlab.study.study import Study, StudyRun, claim_study_folder, settings_key
from headlab.study.table_files import MANIFEST
from headlab.training.config import train_preset
from headlab.training.hardware import TIMING_STEPS

pytestmark = pytest.mark.xdist_group("study_trained")  # `trained` trains runs: made once (conftest)

STEPS = 4


LOGGED: list[str] = []  # what the `trained` study said while training


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    study = Study("tiny", STEPS, tmp_path_factory.mktemp("study"))
    return study, study.train(seeds=2, progress=False, log=LOGGED.append)


def test_training_starts_with_one_line_saying_what_and_how_long(trained, tmp_path):
    """How long is timed, unless no run has more steps left than timing a step trains (the
    `trained` study's 4): then the timing would cost more than the training."""
    study, _ = trained
    assert LOGGED[0] == (f"training 12 of 12 runs (6 tiny variants x 2 seed(s), {12 * STEPS} steps) into "
                         f"{study.folder / 'runs'}: not timed (no run has more steps left than the "
                         f"{TIMING_STEPS} that timing a step takes)")
    longer = Study("tiny", TIMING_STEPS + 1, tmp_path / "longer")
    notice = longer.training_notice()
    assert notice.startswith(f"training 6 of 6 runs (6 tiny variants x 1 seed(s), {6 * (TIMING_STEPS + 1)} steps) "
                             f"into {longer.folder / 'runs'}: about ")
    took = re.search(r": about (\d+) (s|min) here \(load average ", notice)
    assert took and " core(s)" in notice
    assert took[2] == "min" or int(took[1]) < 90  # seconds below a minute and a half (these take a few)
    assert study.training_notice(seeds=2) is None  # all finished: nothing to say, nothing to train
    assert study.steps_left(seeds=3) == {**dict.fromkeys(((s, r) for s in (0, 1) for r in study.roles), 0),
                                         **dict.fromkeys(((2, r) for r in study.roles), STEPS)}


def test_runs_are_typed_records_keyed_by_role(trained):
    study, runs = trained
    assert all(isinstance(r, StudyRun) for r in runs)
    assert [(r.role, r.seed) for r in runs] == [(role, seed) for seed in (0, 1) for role in comparison_roles("tiny")]
    families = {"mha": "mha", "lrkv-small": "lrkv", "lrkv-large": "lrkv", "mqa": "mqa", "mla": "mla", "gqa": "gqa"}
    for r in runs:
        assert r.config == study.roles[r.role] and r.config.attention == families[r.role]
        assert r.folder == study.run_folder(r.config, r.seed)
        assert r.folder == study.folder / "runs" / f"{r.config.run_name}-seed{r.seed}"
        assert r.run.step == STEPS
    small, large = study.roles["lrkv-small"].kv_rank, study.roles["lrkv-large"].kv_rank
    assert small < large


def test_finished_runs_are_reused_not_retrained(trained):
    study, runs = trained
    metrics = {r.folder: (r.folder / "metrics.jsonl").read_bytes() for r in runs}
    said = []
    again = study.train(seeds=2, progress=False, log=said.append)
    assert {r.folder: (r.folder / "metrics.jsonl").read_bytes() for r in again} == metrics
    assert not any(line.startswith("training ") for line in said)  # no notice when nothing is trained
    assert said == [f"  12 finished run(s) in {study.folder / 'runs'} reused"]  # not a "(0 s)" line per run
    for seed in (0, 1):
        assert study.finished_runs(seed) == [study.run_folder(config, seed) for config in study.variants]
    assert Study("tiny", STEPS, study.folder / "elsewhere").finished_runs() == []


def test_a_study_begun_by_training_one_variant_into_its_run_folder_is_taken_up(tmp_path):
    """Notebook 01 trains one variant into `run_folder` before `Study.train`: the runs/ that made
    is headlab's, so the study adopts it (and reuses the run) instead of refusing its own folder."""
    study = Study("tiny", STEPS, tmp_path / "study", only=("mha", "mqa"))
    mha = study.roles["mha"]
    first = headlab.train(mha, study.train_config(0), data=study.load_corpus(), out=study.run_folder(mha),
                          progress=False)
    assert not (study.folder / MANIFEST).exists()
    runs = study.train(progress=False, log=lambda line: None)
    assert (study.folder / MANIFEST).is_file() and [r.role for r in runs] == ["mha", "mqa"]
    assert runs[0].run.final_val_loss == first.final_val_loss  # reused, not trained again


@pytest.mark.parametrize("foreign", ["runs/notes.txt", "runs/mine/weights.bin", "notes.txt"])
def test_a_folder_holding_more_than_headlab_runs_is_still_refused(tmp_path, foreign):
    folder = tmp_path / "study"
    study = Study("tiny", STEPS, folder, only=("mha",))
    headlab.train(study.roles["mha"], study.train_config(0), data=study.load_corpus(),
                  out=study.run_folder(study.roles["mha"]), progress=False)
    (folder / foreign).parent.mkdir(parents=True, exist_ok=True)
    (folder / foreign).write_text("not headlab's")
    with pytest.raises(ValueError, match="holds files headlab did not write"):
        claim_study_folder(folder)
    assert not (folder / MANIFEST).exists() and (folder / foreign).read_text() == "not headlab's"


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="seeds = 0 is invalid: must be a positive integer"):
        Study("tiny", STEPS, tmp_path).train(seeds=0)
    with pytest.raises(ValueError, match="steps = -1 is invalid"):
        Study("tiny", -1, tmp_path)
    with pytest.raises(ValueError, match="preset 'huge' is unknown: allowed presets are"):
        Study("huge", None, tmp_path)


def test_project_root_is_found_from_a_subfolder(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "headlab"\n')
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert project_root() == tmp_path
    monkeypatch.delenv("HEADLAB_STUDY", raising=False)
    assert default_study_folder() == tmp_path / "runs" / "reproduce"
    monkeypatch.setenv("HEADLAB_STUDY", str(tmp_path / "mine"))
    assert default_study_folder() == tmp_path / "mine"
    other = tmp_path / "other"
    (other / "pkg").mkdir(parents=True)
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert project_root(other / "pkg") == tmp_path  # another project's pyproject.toml is passed over


@pytest.mark.parametrize("small, preset, steps", [(True, "tiny", 60), (False, "cpu-small", None)])
def test_notebook_study_modes(small, preset, steps, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "headlab"\n')
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.delenv("HEADLAB_STUDY", raising=False)
    mode = "small" if small else "full"
    chosen = NotebookStudy.choose(small)
    assert (chosen.preset, chosen.steps) == (preset, steps)
    assert chosen.outputs == tmp_path / "runs" / "notebooks" / mode
    # full mode reads the study `make demo` writes; small mode trains its own
    assert chosen.folder == (tmp_path / "runs" / "notebooks" / "small" / settings_key(preset, steps) if small
                             else tmp_path / "runs" / "reproduce")
    elsewhere = NotebookStudy.choose(small, runs="elsewhere")
    assert elsewhere.folder == Path("elsewhere") and elsewhere.outputs == chosen.outputs
    assert chosen.train_config().steps == (steps or train_preset(preset).steps)
    assert chosen.train_config(seed=1).seed == 1


def test_reproduce_trains_three_seeds_by_default(capsys):
    from headlab.cli.main import main
    from headlab.cli.parser import build_parser

    assert build_parser().parse_args(["reproduce"]).seeds == 3
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--preset", "tiny", "--seeds", "0", "--out", "unused"])
    assert exit_.value.code == 2
    assert "--seeds: 0 is invalid: must be a positive integer" in capsys.readouterr().err


def test_a_study_gives_the_same_bits_whatever_its_jobs(tmp_path, monkeypatch):
    """Every run trains on the study's own thread count, so `jobs` (runs at once) never moves a
    number: runs trained in worker processes are bit for bit those of one process (at a width where
    threads split reductions), logged a line a run after the notice, and reused once finished."""
    import torch

    alone, together = (Study("tiny", 12, tmp_path / name, model_overrides={"d_model": 128}, only=("mha", "lrkv-large"))
                       for name in ("jobs1", "jobs2"))
    with_one = alone.train(seeds=1, progress=False, log=lambda message: None, jobs=1)
    logged = []
    with_two = together.train(seeds=1, progress=False, log=logged.append, jobs=2)
    assert [r.role for r in with_two] == ["mha", "lrkv-large"]
    assert logged[0].startswith("training 2 of 2 runs") and len(logged) == 1 + len(with_two)
    assert all(r.run.step == 12 and r.folder.parent == tmp_path / "jobs2" / "runs" for r in with_two)
    for one, two in zip(with_one, with_two):
        assert one.run.final_val_loss == two.run.final_val_loss
        weights = two.run.model.state_dict()
        assert all(torch.equal(tensor, weights[name]) for name, tensor in one.run.model.state_dict().items())
    reused = together.train(seeds=1, progress=False, log=lambda message: None)  # finished: loaded, not retrained
    assert [r.run.final_val_loss for r in reused] == [r.run.final_val_loss for r in with_two]
    with pytest.raises(ValueError, match="jobs = 0 is invalid"):
        together.train(jobs=0)
    assert alone.default_jobs(seeds=1) == min(2, len(os.sched_getaffinity(0)))  # one run per core, one per run
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # a batch scheduler's one core of many
    assert alone.default_jobs(seeds=3) == 1


def test_a_study_keeps_no_trained_model_after_its_run_and_reads_each_back_from_its_folder(tmp_path, monkeypatch):
    """No model outlives its run (a study of large models would run out of device memory after a
    few): before each run and after the last, every model trained so far has been freed, with
    Python's cyclic collector switched off, so a model kept alive by a reference cycle counts as
    kept (the study must free it itself, as it must for a model an FSDP state refers back to); a
    run's model is read back from its folder when asked for, onto the device it trained on."""
    import gc
    import weakref

    import torch

    from headlab.model.gpt import GPT
    from headlab.study import study as study_module

    built, alive_at_start = [], []
    init, train = GPT.__init__, study_module.train

    def recorded_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(weakref.ref(self))

    def checked_train(*args, **kwargs):
        alive_at_start.append(sum(model() is not None for model in built))
        return train(*args, **kwargs)

    monkeypatch.setattr(GPT, "__init__", recorded_init)
    monkeypatch.setattr(study_module, "train", checked_train)
    study = Study("tiny", 2, tmp_path / "study", corpus="synthetic", only=("mha", "mqa"))
    gc.disable()
    try:
        runs = study.train(seeds=2, progress=False, log=lambda line: None)
        alive_at_end = sum(model() is not None for model in built)
    finally:
        gc.enable()
    assert alive_at_start == [0, 0, 0, 0] and alive_at_end == 0
    first, again = runs[0].run, runs[0].run
    assert first.model is not again.model and first.step == 2 and runs[0].device == "cpu"
    assert all(torch.equal(p, q) for p, q in zip(first.model.parameters(), again.model.parameters()))
    assert next(first.model.parameters()).device == torch.device("cpu")


def test_a_studys_tables_read_each_run_once_and_hold_one_model_at_a_time(tmp_path, monkeypatch):
    """Every table needs each run's model (spectra, the three measures, factors, rank bounds):
    analysing a study reads each run from its folder once, and frees it before reading the next."""
    import gc
    import weakref

    from headlab.data.corpus import load_corpus
    from headlab.study import study as study_module
    from headlab.study.tables import analyze_study

    study = Study("tiny", 2, tmp_path / "study", corpus="synthetic", only=("mha", "lrkv-small", "mla"))
    runs = study.train(seeds=1, progress=False, log=lambda line: None)
    read, alive_before = [], []
    load_run = study_module.load_run

    def counted(folder, *args, **kwargs):
        gc.collect()
        alive_before.append(sum(model() is not None for _, model in read))
        run = load_run(folder, *args, **kwargs)
        read.append((Path(folder).name, weakref.ref(run.model)))
        return run

    monkeypatch.setattr(study_module, "load_run", counted)
    tables = analyze_study(runs, load_corpus("synthetic"), "tiny")
    assert sorted(name for name, _ in read) == sorted(r.folder.name for r in runs)
    assert alive_before == [0] * len(runs)
    assert set(tables["summary"]["role"]) == {"mha", "lrkv-small", "mla"}


def test_a_study_with_a_diverged_run_names_it_and_never_trains_it_again(tmp_path, monkeypatch):
    """lr = 10 ends every run tens of times worse than a uniform guess: the study draws nothing
    from them, names each with its loss beside ln 256 in one line, and a rerun trains nothing."""
    from headlab.study import study as study_module
    from headlab.study.study import DivergedRuns

    study = Study("tiny", 4, tmp_path / "study", corpus="synthetic", only=("mha", "mla"), train_overrides={"lr": 10.0})
    said = []
    with pytest.raises(DivergedRuns) as first:
        study.train(seeds=1, progress=False, log=said.append)
    message = str(first.value)
    assert "\n" not in message and message.startswith("2 run(s) diverged, so no conclusions are drawn from them: ")
    for folder in (study.folder / "runs" / "standard-mha-seed0", study.folder / "runs" / "mla-d-c12-seed0"):
        assert re.search(rf"{folder}: loss \d+\.\d+ nats/byte at step 4, worse than a uniform guess "
                         r"\(ln 256 = 5\.545\)", message)
    assert sum("diverged: loss" in line for line in said) == 2
    assert study.steps_left() == {(0, "mha"): 0, (0, "mla"): 0}  # finished: reported, not trained again
    monkeypatch.setattr(study_module, "train", lambda *args, **kwargs: pytest.fail("a diverged run was retrained"))
    said.clear()
    with pytest.raises(DivergedRuns) as again:
        study.train(seeds=1, progress=False, log=said.append)
    assert str(again.value) == message and not any("reused" in line for line in said)


def test_runs_of_other_settings_are_refused_before_anything_is_said_reused(tmp_path):
    study = Study("tiny", 2, tmp_path / "study", corpus="synthetic", only=("mha", "mla"))
    study.train(seeds=1, progress=False, log=lambda line: None)
    changed = Study("tiny", 2, tmp_path / "study", corpus="synthetic", only=("mha", "mla"),
                    train_overrides={"lr": 0.01})
    said = []
    with pytest.raises(ValueError, match="cannot resume .*train.lr: saved 0.003, given 0.01"):
        changed.train(seeds=1, progress=False, log=said.append)
    assert said == []


@pytest.mark.parametrize("overrides,refusal", [
    ({"model_overrides": {"attention": "mla"}}, "attention = 'mla' cannot replace the preset's"),
    ({"model_overrides": {"vocab_size": 100}}, "vocab_size = 100 cannot replace the preset's"),
    ({"train_overrides": {"seed": 3}}, "seed = 3 cannot replace the preset's"),
    ({"model_overrides": {"kv_rank": 8}}, "roles lrkv-small and lrkv-large become the same model"),
    ({"train_overrides": {"device": "meta"}}, "TrainConfig.device = 'meta' is invalid"),
    ({"train_overrides": {"grad_accum": 3}}, "TrainConfig.grad_accum = 3 is invalid")])
def test_settings_a_study_cannot_take_are_refused_before_its_folder_exists(tmp_path, overrides, refusal):
    with pytest.raises(ValueError, match=re.escape(refusal)):
        Study("tiny", 2, tmp_path / "study", **overrides)
    assert not (tmp_path / "study").exists()


def test_an_imported_kernel_module_is_not_a_person_watching():
    """A test runner that executed notebooks has ipykernel loaded; only a running kernel draws bars."""
    import ipykernel.ipkernel  # noqa: F401

    from headlab.study.study import watched
    assert not watched()


def test_run_folders_are_named_from_config_fields_so_a_renamed_label_keeps_finished_runs(tmp_path, monkeypatch):
    """make demo's run folders (runs/reproduce/runs/<name>-seed<k>) keep their names, and a new
    display label changes none of them: a finished run is found by what the variant is."""
    study = Study("cpu-small", 10, tmp_path / "study")
    demo_names = ["standard-mha", "lrkv-r4", "lrkv-r16", "mqa", "mla-d-c32", "gqa-3-kv-heads"]
    assert [study.run_folder(config, 1).name for config in study.variants] == [f"{n}-seed1" for n in demo_names]
    initialised = study.roles["lrkv-small"].replace(kv_residual_init=0.5)
    assert study.run_folder(initialised, 0).name == "lrkv-r4-init-0-5-seed0"
    monkeypatch.setattr(type(initialised), "label", property(lambda config: f"renamed {config.attention}"))
    assert [study.run_folder(config, 1).name for config in study.variants] == [f"{n}-seed1" for n in demo_names]
