"""The trainer: every family learns, runs resume exactly, bad files and NaNs are caught, DDP."""

import json
import math
import os
import sys

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel

import headlab
from headlab import (
    FAMILIES,
    TrainConfig,
    TrainingDiverged,
    load_corpus,
    load_run,
    preset,
    train,
    train_preset,
)
from headlab.cli.main import main
from headlab.model.gpt import GPT
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.divergence import MARGIN, Divergence, is_diverged, run_divergence
from headlab.runs.metrics import read_metrics
from headlab.training.optimizers import Muon, make_optimizers
from headlab.training.trainer import compiled_bucket_cap_mb
from ranks import on_ranks
from shared_fixtures import forge_manifest_entry

DISTRIBUTED_CHECKPOINT = "torch.distributed.checkpoint"

pytestmark = pytest.mark.xdist_group("train_reference")  # `single_process_run` trains runs: made once (conftest)

TINY_TRAIN = train_preset("tiny")


@pytest.fixture(scope="module")
def synthetic():
    return load_corpus("synthetic")


@pytest.mark.parametrize("attention", FAMILIES)
def test_every_family_learns_the_synthetic_corpus(attention, synthetic):
    run = train(preset("tiny", attention), TINY_TRAIN, synthetic, progress=False)
    losses = [r["train_loss"] for r in run.metrics if "train_loss" in r]
    assert losses[-1] < losses[0] - 1.5
    assert run.final_val_loss < math.log(256) - 2.0  # far below the uniform-guess loss


def test_run_folder_holds_the_documented_files_and_loads_back(tmp_path, synthetic, threads):
    run = train(preset("tiny", "lrkv"), TINY_TRAIN, synthetic, out=tmp_path / "run", progress=False)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        ".lock", "checkpoint-00000040", "config.json", "manifest.json", "metrics.jsonl", "starts.jsonl"]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint-00000040").iterdir()) == ["model.safetensors",
                                                                                            "state.pt"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["attention"] == "lrkv" and config["headlab_version"] == headlab.__version__
    assert config["train"]["steps"] == TINY_TRAIN.steps and config["data"]["name"] == "synthetic"
    generator_before = torch.get_rng_state()
    loaded = load_run(tmp_path / "run")
    assert torch.equal(torch.get_rng_state(), generator_before)  # no weight drawn that the load would replace
    assert loaded.model_config == run.model_config and loaded.train_config == TINY_TRAIN
    assert loaded.metrics == run.metrics
    tokens = torch.randint(0, 256, (2, 16))
    assert torch.equal(loaded.model(tokens)[0], run.model(tokens)[0])


class _Interrupt(Exception):
    pass


def _fail_at_step(monkeypatch, step_to_fail: int, make_nan: bool = False):
    """Make GPT.forward misbehave on its `step_to_fail`-th training call (0-based)."""
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, cache=None, loss_only=False):
        if not self.training:
            return original(self, idx, targets, cache, loss_only)
        loss = original(self, idx, targets, cache, loss_only=True)  # training asks for the loss alone
        if calls["n"] == step_to_fail:
            if not make_nan:
                raise _Interrupt
            loss = loss * float("nan")
        calls["n"] += 1
        return loss

    monkeypatch.setattr(GPT, "forward", forward)


# and nanochat's model (ModelConfig.arch) under the Muon split, whose AdamW group of other parameters it leaves empty
@pytest.mark.parametrize("config,recipe", [
    (preset("tiny", "gqa"), TINY_TRAIN),
    (preset("tiny", "mha", arch="nanochat"), TINY_TRAIN.replace(optimizer="muon"))],
    ids=["gqa-adamw", "nanochat-mha-muon"])
def test_interrupted_run_resumes_to_the_uninterrupted_loss_curve(config, recipe, tmp_path, synthetic, monkeypatch,
                                                                 threads):
    reference = train(config, recipe, synthetic, out=tmp_path / "a", progress=False)
    with monkeypatch.context() as patch:
        _fail_at_step(patch, 27)
        with pytest.raises(_Interrupt):
            train(config, recipe, synthetic, out=tmp_path / "b", progress=False)
    assert max(r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")) == 25  # logged past the checkpoint
    resumed = train(config, recipe, synthetic, out=tmp_path / "b", resume=True, progress=False)
    assert resumed.model.config.arch == config.arch
    strip = lambda records: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in records]
    assert strip(resumed.metrics) == strip(reference.metrics)  # exactly equal, every step
    assert strip(load_run(tmp_path / "b").metrics) == strip(reference.metrics)
    for name, p in reference.model.state_dict().items():
        assert torch.equal(p, resumed.model.state_dict()[name])


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, synthetic, monkeypatch):
    with monkeypatch.context() as patch:
        _fail_at_step(patch, 25, make_nan=True)
        with pytest.raises(TrainingDiverged, match="loss is nan at step 25"):
            train(preset("tiny", "mha"), TINY_TRAIN, synthetic, out=tmp_path / "run", progress=False)
    kept = load_run(tmp_path / "run")
    assert kept.step == 20  # the checkpoint before the NaN (checkpoint_every = 20)
    assert all(torch.isfinite(p).all() for p in kept.model.parameters())
    divergence = run_divergence(tmp_path / "run")  # the manifest says so: a study reports it, never retrains it
    assert divergence.step == kept.diverged.step == 25 and math.isnan(divergence.loss)
    resumed = train(preset("tiny", "mha"), TINY_TRAIN, synthetic, out=tmp_path / "run", resume=True, progress=False)
    assert resumed.diverged is None and run_divergence(tmp_path / "run") is None  # trained again: judged again


def test_a_run_ending_worse_than_a_uniform_guess_is_marked_diverged(tmp_path, synthetic):
    """Finite losses 40 x ln 256 are no result: the run says so, in memory and in its manifest,
    and a resume of the finished run keeps saying so."""
    config = TINY_TRAIN.replace(steps=4, lr=10.0)
    run = train(preset("tiny", "mha"), config, synthetic, out=tmp_path / "run", progress=False)
    assert math.isfinite(run.final_val_loss) and run.final_val_loss > math.log(256)
    assert run.diverged == Divergence(4, run.final_val_loss, 256) == run_divergence(tmp_path / "run")
    assert load_run(tmp_path / "run").diverged == run.diverged
    again = train(preset("tiny", "mha"), config, synthetic, out=tmp_path / "run", resume=True, progress=False)
    assert again.diverged == run.diverged == run_divergence(tmp_path / "run")
    healthy = train(preset("tiny", "mha"), config.replace(lr=3e-3), synthetic, out=tmp_path / "healthy",
                    progress=False)
    assert healthy.diverged is None and run_divergence(tmp_path / "healthy") is None
    assert is_diverged(math.log(256) + MARGIN + 1e-9, 256) and not is_diverged(math.log(256) + MARGIN, 256)
    assert is_diverged(math.inf, 256) and is_diverged(math.nan, 256)


def test_the_host_waits_for_the_device_only_when_it_logs_evaluates_or_saves(synthetic, monkeypatch):
    reads = []
    for name in ("item", "tolist"):  # the ways a loss reaches the host (each one a sync on a GPU)
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, original=original: reads.append(1) or original(self))
    config = TINY_TRAIN.replace(steps=40, log_every=20, eval_every=40, eval_batches=1)
    train(preset("tiny", "mha"), config, synthetic, progress=False)
    assert 0 < len(reads) <= 8  # steps 20 and 40 only: a few reads each, never one per step


def test_existing_run_is_not_overwritten(tmp_path, synthetic):
    train(preset("tiny", "mqa"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(preset("tiny", "mqa"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)


@pytest.fixture
def finished_run(tmp_path, synthetic):
    train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_reading_a_run_does_not_load_the_distributed_checkpoint_api(finished_run):
    """A process that only reads weights (an analysis, a report, a notebook) loads them into its
    plain model without torch.distributed.checkpoint, which FSDP needs and whose import cost such a
    process 1.7 s (a run read in 2.0-2.9 s against 3.9-4.3). Checked in a forked child that forgets
    the API's modules first."""
    def read(rank):
        for name in [name for name in sys.modules if name.startswith(DISTRIBUTED_CHECKPOINT)]:
            del sys.modules[name]
        load_run(finished_run)
        return sorted(name for name in sys.modules if name.startswith(DISTRIBUTED_CHECKPOINT))

    assert on_ranks(read, world_size=1) == [[]]


def test_truncated_weights_are_refused_naming_the_file(finished_run):
    checkpoint = current_checkpoint(finished_run)
    path = checkpoint.manifest.file(checkpoint.weights)
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"model\.safetensors does not match the SHA-256 recorded in .*manifest\.json"):
        load_run(finished_run)
    forge_manifest_entry(finished_run, checkpoint.weights)  # the damage is not caught by the recorded hash
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        load_run(finished_run)


def test_truncated_state_is_refused_on_resume_naming_the_file(finished_run, synthetic):
    checkpoint = current_checkpoint(finished_run)
    path = checkpoint.manifest.file(checkpoint.state)
    path.write_bytes(path.read_bytes()[:200])
    resume = lambda: train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=finished_run, resume=True,
                           progress=False)
    with pytest.raises(ValueError, match=r"state\.pt does not match the SHA-256 recorded in .*manifest\.json"):
        resume()
    forge_manifest_entry(finished_run, checkpoint.state)  # the damage is not caught by the recorded hash
    with pytest.raises(ValueError, match=r"state\.pt is not a readable headlab training state"):
        resume()


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_foreign_pickles_are_never_unpickled(finished_run, synthetic):
    checkpoint = current_checkpoint(finished_run)
    torch.save({"step": 5, "optimizers": [], "generator": Payload()}, checkpoint.manifest.file(checkpoint.state))
    forge_manifest_entry(finished_run, checkpoint.state)
    with pytest.raises(ValueError, match=r"state\.pt is not a readable headlab training state.*Unpickl"):
        train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=finished_run, resume=True,
              progress=False)


def test_foreign_safetensors_and_configs_are_refused(finished_run, tmp_path):
    from safetensors.torch import save_file
    checkpoint = current_checkpoint(finished_run)
    save_file({"x": torch.zeros(2)}, str(checkpoint.manifest.file(checkpoint.weights)))
    with pytest.raises(ValueError, match=r"model\.safetensors does not match the SHA-256"):
        load_run(finished_run)
    forge_manifest_entry(finished_run, checkpoint.weights)  # a forged hash is not the only check
    with pytest.raises(ValueError, match=r"model\.safetensors was not written by headlab"):
        load_run(finished_run)
    (finished_run / "config.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match=r"config\.json does not match the SHA-256"):
        load_run(finished_run)
    forge_manifest_entry(finished_run, "config.json")
    with pytest.raises(ValueError, match=r"config\.json is not a headlab run config"):
        load_run(finished_run)


def test_resuming_with_a_different_config_is_refused(finished_run, synthetic):
    with pytest.raises(ValueError, match="1 setting.* differ from the saved run: train.lr: saved 0.003, given 0.01"):
        train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5, lr=1e-2), synthetic, out=finished_run, resume=True,
              progress=False)


@pytest.mark.parametrize("field,value,allowed", [
    ("optimizer", "sgd", "adamw, muon"), ("dtype", "float16", "float32, bfloat16"), ("steps", 0, "positive"),
    ("lr", -1.0, "positive"), ("min_lr_ratio", 2.0, "[0, 1]"), ("parallel", "zero3", "ddp, fsdp"),
    ("grad_accum", 0, "positive")])
def test_bad_train_config_values_name_the_field(field, value, allowed):
    with pytest.raises(ValueError,
                       match=rf"TrainConfig\.{field} = .* is invalid: .*{allowed.replace('[', '.').replace(']', '.')}"):
        TrainConfig(**{field: value})


def test_impossible_parallel_settings_are_refused_naming_the_fields():
    with pytest.raises(ValueError, match=r"TrainConfig\.grad_accum = 3 is invalid: must divide batch_size = 8"):
        TrainConfig(batch_size=8, grad_accum=3)
    with pytest.raises(ValueError, match=r"TrainConfig\.parallel = 'fsdp' is invalid: Muon .* use optimizer = 'adamw'"):
        TrainConfig(parallel="fsdp", optimizer="muon")


def _recorded_learning_rates(monkeypatch) -> list[tuple[str, list[float], list[set[int]]]]:
    """Every optimizer step from now on: the optimizer's class, its groups' lr and parameter ids."""
    steps = []
    for cls in (torch.optim.AdamW, Muon):  # headlab's Muon steps by shape (its own step)
        def step(self, *args, original=cls.step, **kwargs):
            steps.append((type(self).__name__, [g["lr"] for g in self.param_groups],
                          [{id(p) for p in g["params"]} for g in self.param_groups]))
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, "step", step)
    return steps


def _schedule(step: int, config: TrainConfig) -> float:
    """Linear warmup over `warmup_steps` (step s has (s + 1)/W), then a cosine to min_lr_ratio."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / (config.steps - config.warmup_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_every_parameter_group_follows_its_configured_learning_rate_through_the_schedule(optimizer, synthetic,
                                                                                         monkeypatch):
    config = TINY_TRAIN.replace(optimizer=optimizer, steps=10, warmup_steps=3, min_lr_ratio=0.25, eval_every=10,
                                lr=1e-3, matrix_lr=2e-2, embedding_lr=3e-1, unembedding_lr=4e-3)
    steps = _recorded_learning_rates(monkeypatch)
    run = train(preset("tiny", "lrkv"), config, synthetic, progress=False)
    ids = {name: id(p) for name, p in run.model.named_parameters()}
    if optimizer == "muon":
        muon_ids = {ids[n] for n, p in run.model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
        others = set(ids.values()) - muon_ids - {ids["wte.weight"], ids["lm_head.weight"]}
        groups = {"Muon": [(config.matrix_lr, muon_ids)],
                  "AdamW": [(config.embedding_lr, {ids["wte.weight"]}),
                            (config.unembedding_lr, {ids["lm_head.weight"]}),
                            (config.lr, others)]}
        assert any(run.model.get_parameter(n).dim() == 3 for n in ids if id(run.model.get_parameter(n)) in others)
    else:
        groups = {"AdamW": [(config.lr, {i for n, i in ids.items() if run.model.get_parameter(n).dim() >= 2}),
                            (config.lr, {i for n, i in ids.items() if run.model.get_parameter(n).dim() < 2})]}
    assert len(steps) == config.steps * len(groups)
    for n, (name, lrs, params) in enumerate(steps):
        step = n // len(groups)
        assert params == [expected for _, expected in groups[name]], name
        assert lrs == pytest.approx([lr * _schedule(step, config) for lr, _ in groups[name]], rel=1e-12), (name, step)


def test_muon_split_trains_and_routes_lrkv_3d_factors_to_adamw(synthetic):
    """Muon takes exactly the blocks' 2-D weights; LRKV's 3-D B tensors, norms, the embedding and
    the head go to AdamW; every parameter is updated by exactly one optimizer; and it trains."""
    model = GPT(preset("tiny", "lrkv"))
    muon, adamw = make_optimizers(model, TINY_TRAIN.replace(optimizer="muon"))
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for group in muon.param_groups for p in group["params"]}
    in_adamw = {names[id(p)] for group in adamw.param_groups for p in group["params"]}
    assert in_muon.isdisjoint(in_adamw) and in_muon | in_adamw == set(names.values())
    assert in_muon == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    factors = {n for n in names.values() if n.endswith((".b_k", ".b_v"))}
    assert len(factors) == 2 * model.config.n_layer and factors <= in_adamw
    run = train(preset("tiny", "lrkv"), TINY_TRAIN.replace(optimizer="muon"), synthetic, progress=False)
    losses = [r["train_loss"] for r in run.metrics if "train_loss" in r]
    assert losses[-1] < losses[0] - 1.0


def test_two_process_gloo_run_with_accumulation_follows_the_single_process_curve(tmp_path, synthetic):
    args = ["train", "--preset", "tiny", "--attention", "gqa", "--corpus", "synthetic", "--steps", "12",
            "--log-every", "1", "--eval-every", "6", "--device", "cpu", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0  # in this process: nothing imported again
    double = [*args, "--grad-accum", "2", "--out", str(tmp_path / "two")]
    assert on_ranks(lambda rank: main(double), timeout=240) == [0, 0]
    one, two = load_run(tmp_path / "one").metrics, load_run(tmp_path / "two").metrics
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        key = "train_loss" if "train_loss" in a else "val_loss"
        assert abs(a[key] - b[key]) <= 1e-4 * abs(a[key]), (a, b)


def test_gradient_accumulation_takes_the_same_steps_as_one_batch(synthetic):
    config = TINY_TRAIN.replace(steps=4, lr=1e-3, eval_every=4)
    whole = train(preset("tiny", "mla"), config, synthetic, progress=False)
    accumulated = train(preset("tiny", "mla"), config.replace(grad_accum=4), synthetic, progress=False)
    weights = accumulated.model.state_dict()
    assert max((weights[k] - v).abs().max().item() for k, v in whole.model.state_dict().items()) < 1e-6
    assert max(abs(a[k] - b[k]) for a, b in zip(whole.metrics, accumulated.metrics)
               for k in ("train_loss", "val_loss") if k in a) < 1e-6


FSDP_ARGS = ["train", "--preset", "tiny", "--attention", "lrkv", "--corpus", "synthetic", "--steps", "6",
             "--lr", "1e-3", "--log-every", "1", "--eval-every", "3", "--checkpoint-every", "2", "--device", "cpu",
             "--no-progress"]


def _max_difference(a, b) -> float:
    """The largest |difference| between two runs' final weights and logged losses."""
    weights = a.model.state_dict()
    losses = [abs(x[k] - y[k]) for x, y in zip(a.metrics, b.metrics) for k in ("train_loss", "val_loss") if k in x]
    assert [r["step"] for r in a.metrics] == [r["step"] for r in b.metrics]
    return max([(weights[k] - v).abs().max().item() for k, v in b.model.state_dict().items()] + losses)


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    assert main([*FSDP_ARGS, "--out", str(folder / "run")]) == 0  # in this process: nothing imported again
    return load_run(folder / "run")


def test_two_process_fsdp_with_accumulation_equals_single_process_training(tmp_path, single_process_run):
    """Two ranks forked with torchrun's environment (`on_ranks`), as in every test here: torchrun
    itself starts tests/shared_fixtures.py's `torchrun_study`, the failure tests of test_torchrun.py and
    tools/gpu_check.py's smoke run (tests/cli/test_gpu_check.py)."""
    argv = [*FSDP_ARGS, "--parallel", "fsdp", "--grad-accum", "2", "--out", str(tmp_path / "fsdp")]
    assert on_ranks(lambda rank: main(argv), timeout=240) == [0, 0]
    assert _max_difference(load_run(tmp_path / "fsdp"), single_process_run) < 1e-5


def _compiled_rank(argv: list[str]) -> tuple[int, int, list[int]]:
    """`headlab` on one forked rank: its exit status, the graphs torch.compile made in this rank
    (none inherited from the test process: its compiles are forgotten first) and the bucket size
    (bytes) of each DistributedDataParallel wrapper the run made."""
    torch.compiler.reset()
    counters.clear()
    wrap, buckets = DistributedDataParallel.__init__, []

    def recording_wrap(self, *args, **kwargs):
        wrap(self, *args, **kwargs)
        buckets.append(self.bucket_bytes_cap)

    DistributedDataParallel.__init__ = recording_wrap  # this forked rank's own class
    status = main(argv)
    return status, counters["stats"]["unique_graphs"], buckets


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_compiled_two_process_training_follows_the_eager_single_process_run(tmp_path, single_process_run, parallel):
    """--compile aot_eager (dynamo and AOT autograd without code generation: what inductor is
    given, CPU-cheap) under DDP (the whole replica compiled, DDPOptimizer cutting its graph at
    the all-reduce buckets) and under FSDP (each block compiled): the weights and every logged
    loss within 1e-5 of the eager single-process run, as the eager two-process runs are. Under
    DDP each bucket holds a block's gradients, at least DDP's 1 MiB first bucket
    (`compiled_bucket_cap_mb`; DDPOptimizer refuses a smaller one). Two forked ranks (`on_ranks`)."""
    argv = [*FSDP_ARGS, "--parallel", parallel, "--compile", "aot_eager", "--out", str(tmp_path / "run")]
    (status, graphs, buckets), *others = on_ranks(lambda rank: _compiled_rank(argv), timeout=240)
    assert status == 0 and [other[0] for other in others] == [0]
    assert graphs >= 1  # compiled, not eager
    assert _max_difference(load_run(tmp_path / "run"), single_process_run) < 1e-5
    model = GPT(preset("tiny", "lrkv"))
    assert buckets == ([int(compiled_bucket_cap_mb(model) * 2 ** 20)] if parallel == "ddp" else [])
    block_bytes = 4 * sum(p.numel() for p in model.blocks[0].parameters())
    assert compiled_bucket_cap_mb(model) * 2 ** 20 == max(block_bytes, 2 ** 20)


def test_a_compiled_bucket_holds_one_block_of_a_large_model():
    """At paper-2.5b a block's gradients take 243 MiB: ~40 buckets (one cut of the compiled graph
    per block of its 36, and the root's), where torch's default 25 MiB would cut it ~385 times."""
    with torch.device("meta"):
        model = GPT(preset("paper-2.5b", "mha"))
    block_bytes = 4 * sum(p.numel() for p in model.blocks[0].parameters())
    assert compiled_bucket_cap_mb(model) * 2 ** 20 == block_bytes > 100 * 2 ** 20


@pytest.mark.slow
def test_eight_process_fsdp_with_empty_shards_equals_single_process_training(tmp_path, single_process_run):
    """FSDP2 splits each parameter's rows over the ranks: on 8 ranks, tiny LRKV's per-head factors
    (4 rows) leave ranks 4-7 with empty shards. They all-gather, reduce and step like the others:
    the run equals the single-process one. The 8 ranks run `headlab train` forked from this process
    with torchrun's environment (`on_ranks`): 8 torchrun processes would each import torch and
    headlab again (~5 CPU-s apiece)."""
    assert min(p.shape[0] for p in GPT(preset("tiny", "lrkv")).parameters()) < 8  # some shards are empty
    argv = [*FSDP_ARGS, "--parallel", "fsdp", "--out", str(tmp_path / "fsdp")]
    assert on_ranks(lambda rank: main(argv), world_size=8, timeout=240) == [0] * 8
    assert _max_difference(load_run(tmp_path / "fsdp"), single_process_run) < 1e-5


def _killed_at_forward(argv: list[str], exit_at: int, ranks: int | None = None) -> None:
    """`headlab ARGV` forked (nothing imported again), as `ranks` ranks with torchrun's environment
    or, without, one plain process; each ended as a kill ends it, `os._exit`, on its `exit_at`-th
    training forward (the ranks step together, so all end in the same step)."""
    def killed_at_forward(rank: int = 0) -> None:
        original, calls = GPT.forward, [0]

        def forward(self, *args, **kwargs):
            if self.training:
                calls[0] += 1
                if calls[0] == exit_at:
                    os._exit(3)
            return original(self, *args, **kwargs)
        GPT.forward = forward  # in this forked process only
        main(argv)
        os._exit(0)  # not killed: the test's assertion on the checkpoint says so

    if ranks:
        on_ranks(killed_at_forward, world_size=ranks, timeout=240, killed=True)
        return
    pid = os.fork()
    if pid == 0:
        try:
            killed_at_forward()
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


@pytest.mark.slow
def test_checkpoints_resume_across_world_sizes_to_the_uninterrupted_run(tmp_path, single_process_run):
    """Two FSDP ranks killed in step 3, one plain process (DDP settings, no accumulation) taking the
    run over and killed in step 5, both forked; then two forked FSDP ranks finish it."""
    fsdp = [*FSDP_ARGS, "--parallel", "fsdp", "--grad-accum", "2", "--out", str(tmp_path / "run")]
    _killed_at_forward(fsdp, exit_at=2 * 2 + 1, ranks=2)  # in step 3, after the step-2 checkpoint
    assert current_checkpoint(tmp_path / "run").name == "checkpoint-00000002"
    _killed_at_forward([*FSDP_ARGS, "--resume", "--out", str(tmp_path / "run")], exit_at=3)
    assert current_checkpoint(tmp_path / "run").name == "checkpoint-00000004"
    assert on_ranks(lambda rank: main([*fsdp, "--resume"]), timeout=240) == [0, 0]
    assert _max_difference(load_run(tmp_path / "run"), single_process_run) < 1e-5


def test_a_run_on_a_trained_bpe_keeps_its_tokenizer_and_analysis_reads_it(tmp_path, monkeypatch):
    import shutil

    from headlab.analysis.inputs import encode_text
    from headlab.data import sources

    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    corpus = load_corpus("synthetic", tokenizer="bpe:300")
    train(preset("tiny", "mqa", vocab_size=300), TINY_TRAIN.replace(steps=2), corpus, out=tmp_path / "run",
          progress=False)
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (corpus.folder / "tokenizer.json").read_bytes()
    text = "the run's own tokenizer reads this sentence " * 20
    expected = corpus.tokenizer.encode(text)
    shutil.rmtree(tmp_path / "cache")  # the run folder alone suffices
    windows = encode_text(tmp_path / "run", text)
    assert windows.flatten().tolist() == expected[:windows.numel()].tolist()


def test_a_batch_goes_to_the_gpu_through_contiguous_pinned_memory(monkeypatch):
    """A strided view is copied contiguous before pinning (pinning keeps strides: it would lock
    the whole span the view covers); values unchanged. CUDA stubbed: pinning and the copy to the
    device are recorded, not done."""
    from headlab.training.trainer import on_device

    pinned, moved = [], []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self.is_contiguous()) or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, non_blocking=False: moved.append(non_blocking) or self)
    batch = torch.arange(48).view(4, 12)[:, ::3]
    assert torch.equal(on_device(batch, torch.device("cuda", 0)), torch.arange(48).view(4, 12)[:, ::3].clone())
    assert pinned == [True] and moved == [True]
