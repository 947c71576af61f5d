"""Checkpoints on a time interval (TrainConfig.checkpoint_minutes): taken on the first logging step
at which the interval has passed on rank 0's clock, by every rank alike, with the clock injected
(each training step takes 20 s of it)."""

import json

import pytest

from headlab import preset
from headlab.runs import folder as folder_module
from headlab.runs.layout import STARTS
from headlab.training import trainer as trainer_module
from headlab.training.config import TRAIN_PRESETS, train_preset
from headlab.training.trainer import train
from ranks import on_ranks

STEP_SECONDS = 20


def _checkpoint_steps(monkeypatch, out, clock_runs: bool = True, checkpoint_every: int = 100, **config) -> list[int]:
    """The steps checkpointed by a tiny run on a clock that advances STEP_SECONDS per training step
    (or stands still), checkpoint_every beyond the run's 10 steps (or 0: none by step count)."""
    now, saved = [0.0], []
    monkeypatch.setattr(folder_module, "clock", lambda: now[0])
    set_learning_rates = trainer_module._set_learning_rates  # called once at the start of every step

    def timed_step(optimizers, factor):
        now[0] += STEP_SECONDS if clock_runs else 0
        set_learning_rates(optimizers, factor)

    monkeypatch.setattr(trainer_module, "_set_learning_rates", timed_step)
    checkpoint = folder_module.RunFolder.checkpoint
    monkeypatch.setattr(folder_module.RunFolder, "checkpoint",
                        lambda self, *args: (saved.append(args[-1]), checkpoint(self, *args)))
    train(preset("tiny", "mha"), train_preset("tiny", steps=10, eval_every=10, checkpoint_every=checkpoint_every,
                                              device="cpu", **config), "synthetic", out=out, progress=False)
    return saved


@pytest.mark.parametrize("minutes, log_every, every, expected", [
    (1, 1, 100, [3, 6, 9, 10]),  # 60 s after the start and after each checkpoint; then the last step
    (1, 2, 100, [4, 8, 10]),  # looked at on logging steps only: at 40 s not yet, at 80 s
    (0, 1, 100, [10]),  # off: the last step only (checkpoint_every is beyond the run)
    (1, 1, 0, [3, 6, 9, 10]),  # no cadence by step count: on time and at the end only
    (1, 1, 4, [3, 4, 7, 8, 10]),  # both: every 4 steps, and 60 s after whichever came last
])
def test_a_checkpoint_is_taken_once_the_interval_has_passed(tmp_path, monkeypatch, minutes, log_every, every, expected):
    assert _checkpoint_steps(monkeypatch, tmp_path / "run", checkpoint_minutes=minutes, log_every=log_every,
                             checkpoint_every=every) == expected


def test_the_paper_presets_checkpoint_on_time_not_every_thousand_steps():
    """An 8 x H200 128M step takes ~20 ms: 1,000 steps are 20 s, and a checkpoint every 20 s costs
    8-15 % of the run. The paper presets checkpoint by the clock alone (and at the end)."""
    for name in ("paper-128m", "paper-1.2b", "paper-2.5b", "paper-6.3b"):
        config = TRAIN_PRESETS[name]
        assert config.checkpoint_every == 0 and config.checkpoint_minutes >= 10, name


def test_neither_cadence_is_refused_in_one_line():
    with pytest.raises(ValueError, match="checkpoint_every = 0 .* checkpoint_minutes"):
        train_preset("tiny", checkpoint_every=0, checkpoint_minutes=0)


def test_a_run_resumes_under_another_checkpoint_cadence_and_records_it(tmp_path):
    """The cadence changes when checkpoints are taken, never what is trained: a resume may change it."""
    config = train_preset("tiny", steps=4, eval_every=2, checkpoint_every=2, device="cpu")
    train(preset("tiny", "mha"), config, "synthetic", out=tmp_path / "run", progress=False)
    train(preset("tiny", "mha"), config.replace(checkpoint_every=0, checkpoint_minutes=30), "synthetic",
          out=tmp_path / "run", resume=True, progress=False)
    starts = [json.loads(line) for line in (tmp_path / "run" / STARTS).read_text().splitlines()]
    assert starts[1]["changed"] == {"checkpoint_every": [2, 0], "checkpoint_minutes": [0.0, 30]}


def test_every_rank_checkpoints_when_rank_0s_clock_says(tmp_path, monkeypatch):
    """Rank 1's clock stands still: alone it would never checkpoint on time, and a checkpoint that
    only rank 0 entered would leave the ranks in different collectives. Both follow rank 0."""

    def work(rank: int) -> list[int]:
        return _checkpoint_steps(monkeypatch, tmp_path / "run", clock_runs=rank == 0, checkpoint_minutes=1,
                                 log_every=1)

    assert on_ranks(work, timeout=60) == [[3, 6, 9, 10]] * 2
