"""Analysis snapshots through training: schedule, kill-and-resume, per-step tables."""

import importlib
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import headlab.model
from headlab import TrainConfig, load_corpus, load_run, preset, train, train_preset
from headlab.analysis.similarity import analyze
from headlab.analysis.snapshots import analyze_snapshots
from headlab.cli.main import main
from headlab.runs.layout import run_manifest
from headlab.runs.snapshots import snapshot_files, snapshot_steps
from headlab.training import distributed
from ranks import on_ranks

RUN_FOLDER = importlib.import_module("headlab.runs.folder")
RUN = train_preset("tiny", steps=12, batch_size=4, eval_every=6, eval_batches=1, checkpoint_every=4, log_every=4,
                   snapshot_every=5)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("synthetic", n_chars=30_000)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ref") / "run"
    train(preset("tiny", "lrkv"), RUN, corpus, out=folder, progress=False)
    return folder


def test_schedule_is_log_spaced_early_then_every_k_steps():
    assert snapshot_steps(350, 35) == [0, 1, 2, 4, 8, 16, 32, 35, 70, 105, 140, 175, 210, 245, 280, 315]
    assert snapshot_steps(12, 5) == [0, 1, 2, 4, 5, 10]
    assert snapshot_steps(3, 8) == [0, 1, 2]
    assert snapshot_steps(100, 0) == []
    with pytest.raises(ValueError, match="snapshot_every"):
        TrainConfig(snapshot_every=-1)


def test_snapshots_hold_attention_weights_of_each_scheduled_step(reference):
    files = snapshot_files(reference)
    assert list(files) == snapshot_steps(RUN.steps, RUN.snapshot_every)
    tensors = load_file(files[0])
    assert tensors and all(".attn." in name for name in tensors)
    torch.manual_seed(RUN.seed)  # the initial draw, as train() makes it
    initial = headlab.model.GPT(preset("tiny", "lrkv"))
    for name, tensor in tensors.items():
        assert torch.equal(tensor, initial.state_dict()[name]), name
    assert not torch.equal(load_file(files[1])["blocks.0.attn.c_q.weight"], tensors["blocks.0.attn.c_q.weight"])


def test_each_setting_of_a_runs_snapshots_is_analysed_from_one_read_of_the_checkpoint(reference, monkeypatch):
    """analyze_snapshots_each gives what analyze_snapshots gives per setting, reading (and hashing)
    the run's checkpoint once for all of them: a study analyses both MLA RoPE settings."""
    snapshots, reads = importlib.import_module("headlab.analysis.snapshots"), []
    separate = [analyze_snapshots(reference, mla_rope=setting) for setting in ("included", "excluded")]

    def counted(folder, *args, **kwargs):
        reads.append(folder)
        return RUN_FOLDER.load_weights(folder, *args, **kwargs)

    monkeypatch.setattr(snapshots, "load_weights", counted)
    both = snapshots.analyze_snapshots_each(reference, [{"mla_rope": "included"}, {"mla_rope": "excluded"}])
    assert reads == [reference]
    for one, each in zip(separate, both):
        for name in ("similarity", "spectra", "summary"):
            pd.testing.assert_frame_equal(getattr(one, name), getattr(each, name))


class _Killed(Exception):
    pass


def test_a_killed_run_resumes_to_snapshots_identical_to_an_uninterrupted_run(tmp_path, corpus, reference, monkeypatch):
    """Killed right after writing the snapshot of step 5 (after the checkpoint of step 4), with a torn
    temporary left beside it: the resumed run rewrites step 5 identically and no temporary survives."""
    folder = tmp_path / "run"
    original = RUN_FOLDER.write_snapshot

    def write_then_die(run_dir, model, step, every, write=True):
        path = original(run_dir, model, step, every, write)
        if step == 5:  # a temporary as a kill mid-write leaves it: recorded (by its inode) before its bytes
            torn = path.parent / ".step-00000005.safetensors.0123abcd.tmp"
            torn.write_bytes(b"torn")
            manifest = run_manifest(run_dir)
            manifest.staging[torn.relative_to(run_dir).as_posix()] = torn.stat().st_ino
            manifest.save()
            raise _Killed
        return path

    with monkeypatch.context() as patch:
        patch.setattr(RUN_FOLDER, "write_snapshot", write_then_die)
        with pytest.raises(_Killed):
            train(preset("tiny", "lrkv"), RUN, corpus, out=folder, progress=False)
    assert list(snapshot_files(folder)) == [0, 1, 2, 4, 5]
    train(preset("tiny", "lrkv"), RUN, corpus, out=folder, resume=True, progress=False)
    resumed, uninterrupted = snapshot_files(folder), snapshot_files(reference)
    assert list(resumed) == list(uninterrupted)
    for step in resumed:  # (bytes may differ: safetensors orders its metadata header freely)
        again, once = load_file(resumed[step]), load_file(uninterrupted[step])
        assert again.keys() == once.keys() and all(torch.equal(again[k], once[k]) for k in once), step
    assert not list((folder / "snapshots").glob(".*"))


def test_analyze_snapshots_has_a_step_column_ending_at_the_final_checkpoint(reference):
    result = analyze_snapshots(reference, circuit="both")
    assert list(result.summary.columns[:2]) == ["model", "step"]
    assert sorted(result.summary["step"].unique()) == snapshot_steps(RUN.steps, RUN.snapshot_every) + [RUN.steps]
    final = result.summary[result.summary["step"] == RUN.steps].drop(columns="step").reset_index(drop=True)
    direct = analyze(reference, circuit="both").summary
    assert final.equals(direct)
    first = result.summary.query("step == 0 and kind == 'uncentered' and circuit == 'qk'")["effective_rank"]
    last = result.summary.query("step == 12 and kind == 'uncentered' and circuit == 'qk'")["effective_rank"]
    assert not first.reset_index(drop=True).equals(last.reset_index(drop=True))
    assert len(result.lrkv_cosine) and "step" in result.lrkv_cosine
    with pytest.raises(ValueError, match="measure = 'data' is invalid for snapshots"):
        analyze_snapshots(reference, measure="data")


def test_cli_analyze_snapshots_writes_per_step_tables(reference, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", str(reference), "--snapshots", "--out", str(out)]) == 0
    assert "step" in (out / "summary.csv").read_text().splitlines()[0].split(",")


def test_the_explorer_offers_the_training_step_and_the_measure_as_choices(reference):
    from headlab.analysis.similarity import concat
    from headlab.report.widgets import Explorer

    per_step = analyze_snapshots(reference)
    explorer = Explorer({name: getattr(per_step, name) for name in ("similarity", "spectra", "summary")})
    assert list(explorer.choices["step"].options) == snapshot_steps(RUN.steps, RUN.snapshot_every) + [RUN.steps]
    explorer.choices["step"].value = RUN.steps
    assert explorer.figures and "step: 12" in explorer.figures[0].get_suptitle()
    both = concat([analyze(reference), analyze(reference, measure="data", inputs=_moments(reference))])
    explorer = Explorer({n: getattr(both, n) for n in ("similarity", "spectra", "summary")})
    assert list(explorer.choices["measure"].options) == ["frobenius", "data"]


def _moments(run_dir):
    from headlab.analysis.inputs import encode_text, input_moments

    return input_moments(run_dir, encode_text(run_dir, "to be or not to be, that is the question " * 20))


def snapshot_training(parallel: str) -> TrainConfig:
    """What the single process and the two FSDP ranks train: 3 steps, a snapshot every 2."""
    return train_preset("tiny", steps=3, batch_size=4, eval_every=3, eval_batches=1, checkpoint_every=3, log_every=1,
                        snapshot_every=2, device="cpu", lr=1e-3, parallel=parallel)


def _trained_on_this_rank(out, config: TrainConfig) -> bool:
    """`train` of tiny LRKV into `out` on a forked rank, then what it registered to run at the
    interpreter's exit (which a forked rank never reaches); whether the rank then left the process
    group train() joined: gloo aborts a process whose live group meets interpreter shutdown."""
    at_exit = []
    distributed.atexit = SimpleNamespace(register=at_exit.append)  # this forked rank's own module
    torch.set_num_threads(1)
    train(preset("tiny", "lrkv"), config, load_corpus("synthetic", n_chars=30_000), out=out, progress=False)
    for function in at_exit:
        function()
    return bool(at_exit) and not dist.is_initialized()


def test_two_fsdp_processes_gather_whole_snapshots_equal_to_one_process(tmp_path):
    """Two FSDP ranks forked with torchrun's environment (`on_ranks`), nothing imported again."""
    sharded_training = snapshot_training("fsdp")
    assert on_ranks(lambda rank: _trained_on_this_rank(tmp_path / "two", sharded_training), timeout=240) == [True] * 2
    train(preset("tiny", "lrkv"), snapshot_training("ddp"), load_corpus("synthetic", n_chars=30_000),
          out=tmp_path / "one", progress=False)
    single, sharded = snapshot_files(tmp_path / "one"), snapshot_files(tmp_path / "two")
    assert list(single) == list(sharded) == [0, 1, 2]
    for step in single:
        a, b = load_file(single[step]), load_file(sharded[step])
        assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6, step


def test_a_rank_that_writes_no_snapshot_copies_no_tensor(tmp_path, monkeypatch):
    """Every rank calls write_snapshot at a snapshot step (FSDP's gathers need them all), but only
    the writing rank copies the attention tensors to the CPU: the others copy nothing."""
    from headlab.model.gpt import GPT
    from headlab.runs.snapshots import write_snapshot

    model = GPT(preset("tiny", "mha"))
    copies = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: copies.append(args) or to(self, *args,
                                                                                                       **kwargs))
    assert write_snapshot(tmp_path, model, step=0, every=100, write=False) is None
    assert copies == [] and not list(tmp_path.iterdir())


def test_an_observer_sees_the_whole_model_at_each_snapshot_step_and_changes_nothing(tmp_path, corpus, reference):
    """`train(observe=...)` is called at exactly the snapshot steps, in eval mode without autograd,
    with the weights the snapshot of that step holds; the run it observes ends with the weights and
    losses of the unobserved reference run."""
    seen = {}

    def observe(model, step):
        assert not model.training and not torch.is_grad_enabled()
        seen[step] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        model(torch.zeros(1, 4, dtype=torch.long))  # a probe's forward pass

    run = train(preset("tiny", "lrkv"), RUN, corpus, out=tmp_path / "run", progress=False, observe=observe)
    files = snapshot_files(reference)
    assert list(seen) == list(files)
    for step, path in files.items():
        for name, tensor in load_file(path).items():
            assert torch.equal(seen[step][name], tensor), (step, name)
    assert set(seen[0]) == set(run.model.state_dict())  # the whole model, not the snapshot's part
    unobserved = load_run(reference)
    for name, tensor in unobserved.model.state_dict().items():
        assert torch.equal(run.model.state_dict()[name], tensor), name
    assert [r["val_loss"] for r in run.val_losses()] == [r["val_loss"] for r in unobserved.val_losses()]
