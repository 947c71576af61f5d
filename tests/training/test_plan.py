"""The training planner: FLOPs against 6·N·D, memory against hand-computed bytes, refusals."""

import os
import re

import pytest
import torch

from headlab import preset
from headlab.cli.main import main
from headlab.model.gpt import count_parameters
from headlab.study.roles import comparison_variants
from headlab.training.config import train_preset
from headlab.training.flops import model_flops_utilization, training_flops
from headlab.training.hardware import (
    Devices,
    StepTime,
    evaluations,
    gpu_peak,
    measure_peak_flops,
    measure_step,
    parse_devices,
)
from headlab.training.memory import (
    GiB,
    PlanError,
    activation_bytes,
    memory_per_device,
    optimizer_state_bytes,
    rank_shares,
)
from headlab.training.plan import format_plan, study_plan


def test_flops_are_6ND_plus_a_documented_causal_attention_term():
    config = preset("paper-128m", "mha")
    tokens = 10 ** 9
    n = count_parameters(config)["total"] - 50304 * 768  # everything but the input embedding
    attention = 6 * 12 * 6 * (128 + 128) * 2048 / 2  # 6·L·H·(d_qk + d_v)·T/2 per token
    flops = training_flops(config, tokens)
    assert flops["6ND"] == 6 * n * tokens
    assert flops["total"] == pytest.approx(6 * n * tokens + attention * tokens, rel=1e-12)
    assert 0.10 < flops["attention"] / flops["6ND"] < 0.20  # a small addition at d_model 768, T 2048
    mla = preset("paper-128m", "mla")  # queries/keys (and padded values) are d_h + d_R = 192 wide
    assert training_flops(mla, 1)["attention"] == 6 * 12 * 6 * (192 + 192) * 2048 / 2


def test_memory_per_device_matches_hand_computed_bytes_on_tiny():
    config = preset("tiny", "mha")  # 41,120 parameters: root 16,416 (wte, head, norm_f), blocks 12,352 each
    # per layer and token: norms 2·(4·32 + 4); the normed input once in fp32, once per W_Q, W_K,
    # W_V under bf16 autocast, and once for the MLP; q, output, its copy and k, v at 4 heads x 8;
    # 1/rms of q and k and the log-sum-exp per head; the MLP hidden (128) twice
    attention_values, statistics = 3 * 32 + 2 * 32, 2 * 4 + 4
    per_layer_fp32 = 2 * 132 + 4 * 32 + 4 * attention_values + 4 * statistics + 4 * 32 + 4 * 2 * 128
    head_fp32 = 4 * 32 + 4 + 4 * 32 + 256 * 16  # final norm, the head's input, V·16
    assert activation_bytes(config, 2, "float32") == 2 * 32 * (2 * per_layer_fp32 + head_fp32)
    per_layer_bf16 = 2 * 132 + 3 * 2 * 32 + 2 * attention_values + 4 * statistics + 2 * 32 + 2 * 2 * 128
    head_bf16 = 4 * 32 + 4 + 2 * 32 + 256 * 14
    assert activation_bytes(config, 2, "bfloat16") == 2 * 32 * (2 * per_layer_bf16 + head_bf16)

    ddp = memory_per_device(config, 2, 2, "ddp", "adamw", "float32")
    # gradient_as_bucket_view: the gradients are DDP's buckets, no second copy; each rank holds the
    # AdamW state of its share of the parameters (the sharded step), the busiest rank's counted
    shares = [share["state"] for share in rank_shares(config, 2, "adamw")]
    assert sum(shares) == 8 * 41120 and max(shares) - min(shares) <= 8 * 256 * 32  # balanced within the embedding
    assert (ddp.weights, ddp.gradients, ddp.optimizer, ddp.buffers) == (4 * 41120, 4 * 41120, max(shares), 0)
    assert ddp.total == 8 * 41120 + max(shares) + activation_bytes(config, 2, "float32")  # the activations > the step's
    assert memory_per_device(config, 2, 1, "ddp", "adamw", "float32").buffers == 0  # no buckets alone
    fsdp = memory_per_device(config, 2, 2, "fsdp", "adamw", "float32")
    assert (fsdp.weights, fsdp.optimizer) == (2 * 41120, 4 * 41120)
    assert fsdp.buffers == 8 * (16416 + 2 * 12352)
    # Muon keeps one momentum (4 B) per block matrix (2 x 12,288 values), AdamW's 8 B for the rest.
    assert optimizer_state_bytes(config, "muon") == 4 * 24576 + 8 * (41120 - 24576)


def test_plan_refuses_what_cannot_fit_and_its_suggestions_do_fit():
    train_config = train_preset("paper-128m")
    h100s = parse_devices("8xH100")
    big = [preset("paper-6.3b", "lrkv")]
    with pytest.raises(PlanError, match=r"LRKV \(r=54\) needs .* GiB per device with DDP on 8 x H100.*"
                                        r"would fit: FSDP with AdamW on the same 8 devices"):
        study_plan(big, train_config, h100s)
    assert study_plan(big, train_config, h100s, strategy="fsdp").fits

    t4 = parse_devices("T4")
    with pytest.raises(PlanError) as refused:
        study_plan(comparison_variants("paper-128m"), train_config, t4)
    micro, accum = map(int,
                       re.search(r"micro-batch (\d+) with gradient accumulation (\d+)", str(refused.value)).groups())
    assert micro * accum == 32
    assert study_plan(comparison_variants("paper-128m"), train_config, t4, grad_accum=accum).micro_batch == micro
    with pytest.raises(PlanError):  # the largest micro-batch that fits was suggested
        study_plan(comparison_variants("paper-128m"), train_config, t4, grad_accum=accum // 2)

    toy = Devices("toy", 1, GiB, 1e12, "stated")
    with pytest.raises(PlanError, match="would fit: nothing up to 1024 devices"):
        study_plan(big, train_config, toy)
    unchecked = study_plan(big, train_config, toy, check=False)
    assert not unchecked.fits and "does not fit" in format_plan(unchecked)


def test_plan_budget_devices_and_wall_time():
    train_config = train_preset("paper-128m", batch_size=32)
    plan = study_plan(comparison_variants("paper-128m"), train_config, parse_devices("8xH100"), tokens=10 ** 9, seeds=2)
    first = plan.variants[0]
    assert first.steps == -(-10 ** 9 // (32 * 2048)) and first.tokens >= 10 ** 9 and plan.micro_batch == 4
    # the model's FLOPs shared by 8 devices, Muon's orthogonalisation on every one of them
    assert first.wall_s == pytest.approx((first.flops["total"] / 8 + first.flops["optimizer"]) / (989.4e12 * 0.4))
    assert plan.total_flops == pytest.approx(2 * sum(v.flops["total"] for v in plan.variants))
    assert first.checkpoint_bytes == 4 * first.params + optimizer_state_bytes(preset("paper-128m"), "muon")
    with pytest.raises(PlanError, match="batch_size = 32 is not divisible by devices x grad_accum = 3 x 1"):
        study_plan(comparison_variants("paper-128m"), train_config, parse_devices("3xH100"))
    with pytest.raises(PlanError, match="devices = '8xFoo' is invalid"):
        parse_devices("8xFoo")


def test_gpu_names_match_the_most_specific_table_entry():
    assert gpu_peak("NVIDIA H100 PCIe")[1] == 756.5
    assert gpu_peak("NVIDIA H100 80GB HBM3")[1] == 989.4
    assert gpu_peak("NVIDIA L40S")[0] == "L40S" and gpu_peak("NVIDIA L4")[0] == "L4"
    assert gpu_peak("NVIDIA A100-SXM4-40GB")[2] == 40 and gpu_peak("NVIDIA A100-SXM4-80GB")[2] == 80
    assert gpu_peak("Mystery GPU") is None
    assert measure_peak_flops("cpu", size=64, seconds=0.02) > 0


def test_a_process_measures_this_cpus_peak_once_per_dtype_and_thread_count(monkeypatch):
    """Each plan states the CPU's measured matmul peak; a session planning many studies measures
    it once (a second each), again only for another dtype or thread count."""
    import torch

    from headlab.training import hardware

    measured = []
    monkeypatch.setattr(hardware, "measure_peak_flops", lambda device, dtype: measured.append(dtype) or 1e9)
    hardware.cpu_peak_flops.cache_clear()
    try:
        peaks = [hardware.visible_devices(None, dtype).peak_flops for dtype in ("float32", "float32", "bfloat16")]
        monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
        hardware.visible_devices(None, "float32")
    finally:
        hardware.cpu_peak_flops.cache_clear()
    assert peaks == [1e9] * 3 and measured == [torch.float32, torch.bfloat16, torch.float32]


def test_train_plan_prints_without_training_and_refuses_in_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--preset", "paper-128m", "--tokenizer", "bpe:8192", "--attention", "gqa", "--plan",
                 "--plan-gpus", "8xH100", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GQA (3 KV heads)" in text and "8 x H100" in text and "6·N·D" in text and not out.exists()
    assert main(["train", "--preset", "paper-6.3b", "--plan", "--plan-gpus", "H100"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("headlab: error: Standard MHA needs") and error.count("\n") == 1
    assert main(["train", "--preset", "paper-6.3b", "--plan", "--plan-gpus", "8xH100", "--parallel", "fsdp",
                 "--optimizer", "adamw", "--grad-accum", "2"]) == 0  # the plan follows the training's own settings
    text = capsys.readouterr().out
    assert "FSDP, adamw" in text and "micro-batch 2" in text


def test_a_plan_of_this_cpu_times_steps_counts_evaluations_and_every_model_held_at_once():
    variants, config = comparison_variants("tiny"), train_preset("tiny", steps=50)
    step = StepTime(seconds=0.1, spread=0.0, eval_seconds=0.03, threads=1)
    need = memory_per_device(variants[0], config.batch_size, 1, "ddp", config.optimizer, config.dtype).total
    cpu = Devices("cpu", 1, int(1.5 * need / 0.9), 1e11, "measured")  # one model fits, two do not
    plans = {jobs: study_plan(variants[:1], config, cpu, seeds=3, step_times={variants[0].label: step}, jobs=jobs,
                              check=False) for jobs in (1, 2)}
    one = plans[1].variants[0]
    assert evaluations(config, 50) == 3  # steps 20, 40 and the last
    assert one.wall_s == pytest.approx(50 * 0.1 + 3 * config.eval_batches * 0.03)
    assert plans[2].total_wall_s == pytest.approx(3 * one.wall_s / 2)
    assert one.mfu == pytest.approx(model_flops_utilization(variants[0], config.batch_size * variants[0].seq_len / 0.1,
                                                            1e11))
    assert plans[1].fits and not plans[2].fits
    assert "ms/step" in format_plan(plans[1]) and "2 models in memory" in format_plan(plans[2])
    measured = measure_step(variants[0], config, threads=1, repeats=2)
    assert measured.seconds > 0 and measured.eval_seconds > 0 and measured.threads == 1


def test_reproduce_plan_on_this_cpu_measures_each_variant_for_the_jobs_asked(capsys):
    assert main(["reproduce", "--preset", "tiny", "--plan", "--jobs", "2", "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    threads = max(1, (os.cpu_count() or 1) // 2)
    assert f"measured here on {threads} thread(s), 2 run(s) at once" in text and "load average" in text
    assert all(variant.label in text for variant in comparison_variants("tiny"))


def test_a_step_is_timed_on_the_ranks_own_device_at_its_share_of_the_batch_and_then_freed(monkeypatch):
    """Under torchrun (4 ranks, this one LOCAL_RANK 3) the timed step is one rank's: the rank's own
    device, batch_size / (world_size x grad_accum) sequences per forward, grad_accum forwards per
    step; the model is gone before the allocator's cache is emptied."""
    import gc
    import weakref

    import torch

    from headlab.model.gpt import GPT
    from headlab.training import hardware

    monkeypatch.setenv("WORLD_SIZE", "4"), monkeypatch.setenv("RANK", "3"), monkeypatch.setenv("LOCAL_RANK", "3")
    asked, batches, models, emptied = [], [], [], []

    def rank_device(requested, local_rank):
        asked.append(local_rank)
        return torch.device("cpu")

    forward = GPT.forward

    def recorded_forward(self, idx, *args, **kwargs):
        batches.append((torch.is_grad_enabled(), idx.shape[0]))
        models.append(weakref.ref(self))
        return forward(self, idx, *args, **kwargs)

    def empty_cache():
        gc.collect()
        emptied.append(all(model() is None for model in models))

    monkeypatch.setattr(hardware, "training_device", rank_device)
    monkeypatch.setattr(GPT, "forward", recorded_forward)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    config = train_preset("tiny", grad_accum=2)  # 8 sequences: 2 per rank, 1 per micro-batch
    measure_step(comparison_variants("tiny")[0], config, threads=1, repeats=2)
    assert asked == [3]
    trained = [size for grad, size in batches if grad]
    assert trained == [1] * (2 * (2 + 2))  # (2 warm-up + 2 timed steps) x 2 micro-batches
    assert [size for grad, size in batches if not grad] == [2] * 3  # evaluations: the rank's 8 / 4 rows
    assert emptied == [True]


def test_under_torchrun_only_rank_0_times_the_steps_of_the_notice(monkeypatch, tmp_path):
    from headlab.study import study as study_module

    timed = []
    monkeypatch.setattr(study_module, "measure_step", lambda *args, **kwargs: timed.append(args) or
                        StepTime(0.1, 0.0, 0.01, 1))
    study = study_module.Study("tiny", 10, tmp_path / "study")
    monkeypatch.setenv("WORLD_SIZE", "2"), monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("LOCAL_RANK", "1")
    assert study.training_notice() is None and timed == []
    monkeypatch.setenv("RANK", "0"), monkeypatch.setenv("LOCAL_RANK", "0")
    assert study.training_notice().startswith("training 6 of 6 runs") and len(timed) == 6


def test_a_rerun_times_only_the_variants_it_still_trains(monkeypatch, tmp_path):
    """Timing a variant compiles it on a GPU: a rerun that finishes one run times that one only."""
    from headlab.study import study as study_module

    timed = []
    monkeypatch.setattr(study_module, "measure_step", lambda variant, *args, **kwargs: timed.append(variant.label) or
                        StepTime(0.1, 0.0, 0.01, 1))
    study = study_module.Study("tiny", 10, tmp_path / "study")
    left = {(seed, role): 700 if (seed, role) == (1, "mqa") else 0 for seed in range(2) for role in study.roles}
    monkeypatch.setattr(study_module.Study, "steps_left", lambda self, seeds: left)
    assert study.training_notice(seeds=2).startswith("training 1 of 12 runs")
    assert timed == [study.roles["mqa"].label]


def test_every_setup_a_plan_suggests_is_one_the_command_line_can_choose_and_it_fits(capsys):
    """paper-6.3b with the preset's Muon on 8 x H100 does not fit under DDP: each suggestion names
    the options that choose it, `headlab reproduce` accepts them, and the plan under them fits."""
    from headlab.cli.parser import build_parser

    variants = [preset("paper-6.3b", "lrkv")]
    plan = study_plan(variants, train_preset("paper-6.3b"), parse_devices("8xH100"), check=False)
    assert not plan.fits and plan.suggestions
    for suggestion in plan.suggestions:
        options = re.findall(r"--[a-z-]+ [a-z0-9]+", suggestion)
        assert options, suggestion
        args = build_parser().parse_args(["reproduce", "--preset", "paper-6.3b", *" ".join(options).split()])
        chosen = {name: getattr(args, name) for name in ("optimizer", "parallel", "grad_accum") if getattr(args, name)}
        devices = int(re.search(r"(\d+) (?:devices|processes)", suggestion).group(1))
        config = train_preset("paper-6.3b", **chosen)
        assert study_plan(variants, config, parse_devices(f"{devices}xH100"), strategy=config.parallel,
                          grad_accum=config.grad_accum).fits, suggestion
    assert main(["reproduce", "--preset", "paper-6.3b", "--plan", "--plan-gpus", "8xH200", "--optimizer", "adamw",
                 "--parallel", "fsdp", "--grad-accum", "2"]) == 0
    assert "FSDP, adamw" in capsys.readouterr().out


def test_muons_orthogonalisation_is_counted_per_rank_in_the_wall_time():
    """torch.optim.Muon runs 5 Newton–Schulz iterations per matrix, 4·m²·n + 2·m³ FLOPs each
    (m <= n); DDP ranks share the matrices out, each shape's dealt round-robin, the deal going on
    from one shape to the next."""
    from headlab.training.flops import muon_flops_per_step

    config = preset("tiny", "mha")  # per block: q, k, v, out 32 x 32, MLP 128 x 32 and 32 x 128
    square, wide = 4 * 32 ** 3 + 2 * 32 ** 3, 4 * 32 ** 2 * 128 + 2 * 32 ** 3
    assert muon_flops_per_step(config) == 5 * 2 * (4 * square + 2 * wide)
    h100s = parse_devices("8xH100")
    muon = study_plan([config], train_preset("tiny", optimizer="muon"), h100s, mfu=0.5).variants[0]
    adamw = study_plan([config], train_preset("tiny"), h100s, mfu=0.5).variants[0]
    # 8 square matrices and 2 of each wide shape over 8 ranks: a square one each, the wide ones on ranks 0-3
    assert muon_flops_per_step(config, 8) == 5 * (square + wide)
    assert muon_flops_per_step(config, 2) == 5 * (4 * square + 2 * wide)
    assert muon.flops["optimizer"] == 40 * muon_flops_per_step(config, 8) and adamw.flops["optimizer"] == 0
    assert muon.wall_s == pytest.approx((muon.flops["total"] / 8 + muon.flops["optimizer"]) / (0.5 * h100s.peak_flops))
    assert adamw.wall_s == pytest.approx(adamw.flops["total"] / (8 * 0.5 * h100s.peak_flops))
    big = study_plan(comparison_variants("paper-2.5b")[:1], train_preset("paper-2.5b"), parse_devices("8xH200"))
    assert "Muon's Newton–Schulz orthogonalisation: the ranks split the matrices" in format_plan(big)


def test_an_h200_nvl_is_not_planned_at_the_sxm_h200s_peak():
    assert gpu_peak("NVIDIA H200 NVL")[:2] == ("H200 NVL", 835.5)
    assert gpu_peak("NVIDIA H200")[:2] == ("H200", 989.4)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA L40", None), ("NVIDIA GH200 480GB", None), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("Tesla T4", "T4"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"), ("h200", "H200")])
def test_gpu_names_are_matched_as_whole_words_not_substrings(name, key):
    """An L40 is not an L4, nor a GH200 an H200 (no table peak: the plan asks for one); the
    names torch reports for the listed GPUs still find their rows."""
    found = gpu_peak(name)
    assert (found and found[0]) == key


def test_a_paper_plan_says_how_its_budget_compares_with_the_papers_and_offers_it(capsys):
    assert main(["reproduce", "--preset", "paper-128m", "--plan", "--plan-gpus", "8xH200"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith("note: each run trains on 3.28 B tokens; the paper trained its paper-128m models on 100 B")
    assert "--tokens 100e9 plans the paper's budget: about 31 x the wall time" in note
    assert main(["reproduce", "--preset", "paper-128m", "--plan", "--plan-gpus", "8xH200", "--tokens", "100e9"]) == 0
    text = capsys.readouterr().out
    assert "= 100.00 G tokens" in text and "note: each run" not in text


def test_a_step_whose_unsharded_model_does_not_fit_the_gpu_is_not_timed(monkeypatch, tmp_path):
    """paper-6.3b under FSDP on 8 x 80 GB trains sharded, but timing a step builds a whole
    replica: the notice says it is not timed rather than running out of memory (CUDA stubbed)."""
    import types

    import torch

    from headlab.study import study as study_module

    monkeypatch.setenv("WORLD_SIZE", "8"), monkeypatch.setenv("RANK", "0"), monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=80 * GiB))
    monkeypatch.setattr(study_module, "measure_step",
                        lambda *args, **kwargs: pytest.fail("timed a step that cannot fit"))
    study = study_module.Study("paper-6.3b", 10, tmp_path / "study", only=("mha",),
                               train_overrides={"parallel": "fsdp", "optimizer": "adamw"})
    notice = study.training_notice()
    assert "not timed here (an unsharded step of the largest variant does not fit cuda:0" in notice
    small = study_module.Study("paper-128m", 10, tmp_path / "small", only=("mha",))
    monkeypatch.setattr(study_module, "measure_step", lambda *args, **kwargs: StepTime(0.5, 0.0, 0.1, 1))
    assert re.search(r": about \d+ (s|min) here \(load average", small.training_notice())  # 128M at 4 per rank fits


def test_fp32_training_is_planned_at_the_fp32_tf32_peak_and_runs_on_tf32(monkeypatch, capsys):
    """bf16 plans use the tensor-core bf16 peak; fp32 plans the TF32 one (CUDA-core fp32 on a
    T4, which has no TF32), on the command line too. Training on an Ampere or later GPU turns
    TF32 on for fp32 matmuls; an older GPU and the CPU are left alone."""
    from headlab.training.distributed import use_tf32_matmuls

    assert parse_devices("8xH100").peak_flops == 989.4e12
    assert parse_devices("8xH100", dtype="float32").peak_flops == 494.7e12
    assert parse_devices("T4", dtype="float32").peak_flops == 8.1e12
    fp32_plan = ["--plan", "--plan-gpus", "8xH100", "--set", "dtype=float32"]
    assert main(["reproduce", "--preset", "paper-128m", *fp32_plan]) == 0
    assert "peak 494.70 TFLOP/s table" in capsys.readouterr().out

    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(matmul, "fp32_precision", "ieee")  # and back to what it was after the test
    capability = {"value": (7, 5)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["value"])
    use_tf32_matmuls(torch.device("cpu"))
    use_tf32_matmuls(torch.device("cuda", 0))
    assert matmul.fp32_precision == "ieee"  # a T4 (sm 7.5) has no TF32
    capability["value"] = (8, 0)
    use_tf32_matmuls(torch.device("cpu"))
    assert matmul.fp32_precision == "ieee"
    use_tf32_matmuls(torch.device("cuda", 0))
    assert matmul.fp32_precision == "tf32"
