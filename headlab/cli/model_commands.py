"""The commands about one model, `info` and `train`, and the --plan they share with `reproduce`.

Apart from headlab.cli.commands (analysis, studies, reports) so that a `headlab train` process,
each torchrun rank among them, loads neither the analysis and report modules nor matplotlib:
its ranks start 0.6-0.9 s sooner here."""

from __future__ import annotations

import json
from pathlib import Path

from headlab.cli.arguments import CONFIG_OVERRIDES, TRAIN_OVERRIDES
from headlab.data.corpus import load_corpus
from headlab.data.tokenizers import tokenizer_vocab_size
from headlab.model.config import ModelConfig, preset
from headlab.model.gpt import describe
from headlab.study.roles import comparison_variants
from headlab.training.config import train_preset
from headlab.training.hardware import RUN_THREADS, load_note, measure_step, parse_devices, visible_devices
from headlab.training.plan import StudyPlan, format_bytes, format_plan, study_plan
from headlab.training.processes import is_main_process
from headlab.training.trainer import keep_freed_cpu_memory, prepared_corpus, repetition_note, train


# ---- info -------------------------------------------------------------------------------------------
def _read_model_config(path: str) -> ModelConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--config {path} cannot be read: {getattr(error, 'strerror', None) or error}") from None
    try:
        return ModelConfig.from_json(text)
    except (ValueError, TypeError) as error:
        raise ValueError(f"--config {path}: {error}") from None

def _overrides(args) -> dict:
    return {name: getattr(args, name) for name in CONFIG_OVERRIDES if getattr(args, name) is not None}

def _config_from_args(args, attention: str) -> ModelConfig:
    if args.config:
        return _read_model_config(args.config).replace(attention=attention, **_overrides(args))
    return preset(args.preset, attention, **_overrides(args))

def cmd_info(args) -> int:
    """One family (--attention), one config file (--config), or else the six variants `headlab
    reproduce` trains on the preset, in the dtype its runs train in."""
    if args.config or args.attention:
        attention = args.attention or _read_model_config(args.config).attention
        configs = [_config_from_args(args, attention)]
    else:
        configs = [config.replace(**_overrides(args)) for config in comparison_variants(args.preset)]
    dtype = args.dtype or ("bfloat16" if args.config else train_preset(args.preset).dtype)
    rows = [describe(config, args.context or config.seq_len, dtype, args.batch_size) for config in configs]
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=2))
        return 0
    variants = "" if args.attention else ", the variants of `headlab reproduce`"
    source = args.config or f"preset {args.preset}{variants}"
    print(f"{source}: context {rows[0]['context']}, batch {rows[0]['batch_size']}, {dtype}")
    header = f"{'variant':<22}{'params':>14}{'KV values/token/layer':>24}{'% of MHA':>10}{'KV cache':>12}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['label']:<22}{row['params']:>14,}{row['kv_values_per_token_per_layer']:>24,}"
              f"{100 * row['kv_fraction_of_mha']:>9.1f}%{format_bytes(row['kv_cache_bytes']):>12}")
    return 0

# ---- train ------------------------------------------------------------------------------------------

def _train_config_from_args(args):
    overrides = {name: getattr(args, name) for name in TRAIN_OVERRIDES if getattr(args, name) is not None}
    return train_preset(args.preset, **overrides, **({"compile": args.compile} if args.compile is not None else {}))

def _train_model_config(args, vocab_size: int) -> ModelConfig:
    if args.config:
        return _read_model_config(args.config).replace(**_overrides(args))
    return preset(args.preset, args.attention, vocab_size=max(vocab_size, 256), **_overrides(args))

def given_source_options(args) -> dict:
    """The corpus options given on the command line (--max-chars, --text-field)."""
    return {name: getattr(args, name) for name in ("max_chars", "text_field") if getattr(args, name) is not None}

def cmd_train(args) -> int:
    train_config = _train_config_from_args(args)  # checked before a corpus is tokenized
    if args.plan:
        print(plan_from_args(args, [_train_model_config(args, tokenizer_vocab_size(args.tokenizer))], train_config))
        return 0
    source_options = given_source_options(args)
    if args.encoding_errors is not None:
        source_options["encoding_errors"] = args.encoding_errors
    corpus = prepared_corpus(lambda: load_corpus(args.corpus, tokenizer=args.tokenizer, **source_options),
                             train_config.device)
    keep_freed_cpu_memory()  # a command's process is its own: CPU training steps fault far less
    model_config = _train_model_config(args, corpus.vocab_size)
    if is_main_process() and (note := repetition_note(train_config, model_config.seq_len, corpus)):
        print(note)
    run = train(model_config, train_config, corpus, out=args.out, resume=args.resume, progress=not args.no_progress)

    if is_main_process():
        print(f"{model_config.label}: {run.step} steps, final validation loss "
              f"{run.final_val_loss:.4f} nats/token" + (f", run folder {args.out}" if args.out else ""))
        if run.diverged:
            print(f"the run diverged: {run.diverged.describe()}; a study reports it instead of comparing it")
    return 0

# ---- plans ------------------------------------------------------------------------------------------

def plan_for_args(args, variants: list[ModelConfig], train_config, seeds: int = 1, check: bool = True,
                  jobs: int = 1) -> StudyPlan:
    """The plan for parsed `add_plan_arguments` options under the training's own `parallel`
    strategy and `grad_accum` (with `check`, raises PlanError if it cannot fit). Planning this
    CPU (no --plan-gpus, no GPU), the wall time comes from a measured step of every variant on
    the `RUN_THREADS` each of `jobs` runs gets; planning GPUs, from FLOPs at --plan-mfu."""
    devices = (parse_devices(args.plan_gpus, args.plan_peak_tflops, train_config.dtype) if args.plan_gpus
               else visible_devices(args.plan_peak_tflops, train_config.dtype))
    step_times, note = None, ""
    if devices.name == "cpu" and not args.plan_peak_tflops:
        note = load_note()
        step_times = {config.label: measure_step(config, train_config.replace(device="cpu"), RUN_THREADS)
                      for config in variants}
    return study_plan(variants, train_config, devices, tokens=getattr(args, "plan_tokens", None),
                      grad_accum=train_config.grad_accum, strategy=train_config.parallel, mfu=args.plan_mfu,
                      seeds=seeds, check=check, step_times=step_times, jobs=jobs, timing_note=note)

def plan_from_args(args, variants: list[ModelConfig], train_config, seeds: int = 1) -> str:
    """The formatted plan for parsed `add_plan_arguments` options (raises PlanError if it cannot fit)."""
    return format_plan(plan_for_args(args, variants, train_config, seeds))
