"""Command line: `headlab info`, `headlab train`, `headlab analyze` and `headlab reproduce` (the main job)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .config import ATTENTION_FAMILIES, PRESETS, ModelConfig, comparison_variants, preset
from .model import count_parameters

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CONFIG_OVERRIDES = ("n_kv_head", "kv_rank", "kv_latent_dim", "rope_head_dim", "q_latent_dim", "seq_len")
TRAIN_OVERRIDES = ("steps", "batch_size", "optimizer", "lr", "warmup_steps", "eval_every", "checkpoint_every",
                   "log_every", "dtype", "device", "seed")


def describe(config: ModelConfig, context: int, dtype: str = "bf16", batch_size: int = 1) -> dict:
    """Parameter counts (no weights allocated) and KV-cache sizes of `config`."""
    counts = count_parameters(config)
    per_token = config.kv_cache_values_per_token()
    return {
        "label": config.label,
        "attention": config.attention,
        "params": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "attention_params_per_layer": counts["attention"] // config.n_layer,
        "kv_values_per_token_per_layer": per_token,
        "kv_fraction_of_mha": config.kv_cache_fraction_of_mha(),
        "context": context,
        "batch_size": batch_size,
        "dtype": dtype,
        "kv_cache_bytes": config.kv_cache_bytes(context, DTYPE_BYTES[dtype], batch_size),
    }


def _config_from_args(args, attention: str) -> ModelConfig:
    overrides = {name: getattr(args, name) for name in CONFIG_OVERRIDES if getattr(args, name) is not None}
    if args.config:
        return ModelConfig.from_json(Path(args.config).read_text()).replace(attention=attention, **overrides)
    return preset(args.preset, attention, **overrides)


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cmd_info(args) -> int:
    if args.config:
        base_attention = ModelConfig.from_json(Path(args.config).read_text()).attention
    else:
        base_attention = "mha"
    families = [args.attention] if args.attention else ([base_attention] if args.config else list(ATTENTION_FAMILIES))
    rows = []
    for attention in families:
        config = _config_from_args(args, attention)
        rows.append(describe(config, args.context or config.seq_len, args.dtype, args.batch_size))
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=2))
        return 0
    source = args.config or f"preset {args.preset}"
    print(f"{source}: context {rows[0]['context']}, batch {rows[0]['batch_size']}, {args.dtype}")
    header = f"{'variant':<22}{'params':>14}{'KV values/token/layer':>24}{'% of MHA':>10}{'KV cache':>12}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['label']:<22}{row['params']:>14,}{row['kv_values_per_token_per_layer']:>24,}"
              f"{100 * row['kv_fraction_of_mha']:>9.1f}%{_format_bytes(row['kv_cache_bytes']):>12}")
    return 0


def _train_config_from_args(args):
    from .train import train_preset

    overrides = {name: getattr(args, name) for name in TRAIN_OVERRIDES if getattr(args, name) is not None}
    return train_preset(args.preset, compile=args.compile, **overrides)


def cmd_train(args) -> int:
    from .data import load_corpus
    from .train import train

    source_options = {"max_chars": args.max_chars} if args.max_chars else {}
    corpus = load_corpus(args.corpus, tokenizer=args.tokenizer, **source_options)
    overrides = {name: getattr(args, name) for name in CONFIG_OVERRIDES if getattr(args, name) is not None}
    if args.config:
        model_config = ModelConfig.from_json(Path(args.config).read_text()).replace(**overrides)
    else:
        model_config = preset(args.preset, args.attention, vocab_size=max(corpus.vocab_size, 256), **overrides)
    run = train(model_config, _train_config_from_args(args), corpus, out=args.out, resume=args.resume,
                progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{model_config.label}: {run.step} steps, final validation loss "
              f"{run.final_val_loss:.4f} nats/token" + (f", run folder {args.out}" if args.out else ""))
    return 0


def cmd_reproduce(args) -> int:
    from .reproduce import reproduce

    report = reproduce(args.preset, seeds=args.seeds, out=args.out, steps=args.steps, progress=sys.stderr.isatty())
    print(f"report written: {report}")
    print(f"flagship figure: {report.parent / 'figures' / 'spectra_uncentered.png'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="parameter count and KV-cache size of a preset or config")
    info.add_argument("--preset", default="paper-128m", choices=sorted(PRESETS))
    info.add_argument("--config", help="a ModelConfig JSON file instead of a preset")
    info.add_argument("--attention", choices=ATTENTION_FAMILIES, help="one family (default: all five)")
    for name in CONFIG_OVERRIDES:
        info.add_argument("--" + name.replace("_", "-"), dest=name, type=int)
    info.add_argument("--context", type=int, help="tokens in the cache (default: seq_len)")
    info.add_argument("--batch-size", type=int, default=1)
    info.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES))
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)

    train = sub.add_parser("train", help="train one model into a run folder (works under torchrun)")
    train.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS), help="model and training preset")
    train.add_argument("--config", help="a ModelConfig JSON file instead of a preset")
    train.add_argument("--attention", default="mha", choices=ATTENTION_FAMILIES)
    for name in CONFIG_OVERRIDES:
        train.add_argument("--" + name.replace("_", "-"), dest=name, type=int)
    train.add_argument("--corpus", default="shakespeare", help="shakespeare, synthetic, hf:<dataset> or a text path")
    train.add_argument("--tokenizer", default="byte", choices=("byte", "gpt2"))
    train.add_argument("--max-chars", type=int, help="for hf:<dataset> corpora: stop streaming after this many characters")
    for name, kind in (("steps", int), ("batch_size", int), ("optimizer", str), ("lr", float), ("warmup_steps", int),
                       ("eval_every", int), ("checkpoint_every", int), ("log_every", int), ("dtype", str),
                       ("device", str), ("seed", int)):
        train.add_argument("--" + name.replace("_", "-"), dest=name, type=kind)
    train.add_argument("--compile", action="store_true", help="torch.compile the model (GPU only)")
    train.add_argument("--out", help="run folder (config.json, model.safetensors, state.pt, metrics.jsonl)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(func=cmd_train)

    reproduce = sub.add_parser("reproduce", help="train the six comparison variants, analyse their heads, "
                               "write figures and a report beside the paper's numbers")
    reproduce.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    reproduce.add_argument("--seeds", type=int, default=1)
    reproduce.add_argument("--steps", type=int, help="training steps per variant (default: the preset's)")
    reproduce.add_argument("--out", default="runs/reproduce")
    reproduce.set_defaults(func=cmd_reproduce)

    from .analysis_cli import add_analyze_command
    add_analyze_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, FileExistsError) as error:
        print(f"headlab: error: {error}", file=sys.stderr)
        return 2
