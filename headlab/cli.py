"""Command line: `headlab info`, `headlab train`, `headlab analyze`, `headlab reproduce` (the main job),
`headlab sweep` (the comparison across training lengths, depths and settings), `headlab report`
(redraw a study's report from its tables) and `headlab docs` (the README's figures).

Every error ends in one line "headlab: error: ..." and an exit status (`--debug` or
HEADLAB_DEBUG=1 shows the traceback instead):

    0    done
    1    a bug in headlab (an unexpected exception): the line says so; please report it
    2    a mistake in the input: a bad value, a file that is missing, damaged or not headlab's,
         a folder in use ("busy, retry"), a full disk
    130  interrupted (Ctrl-C); a run folder resumes from its last checkpoint"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import encode_text, input_moments
from headlab.analysis.similarity import analyze, concat
from headlab.analysis.snapshots import analyze_snapshots
from headlab.analysis.tables import load_tables, save_tables
from headlab.data.corpus import load_corpus
from headlab.data.encoding import available_cores
from headlab.data.tokenizers import tokenizer_vocab_size
from headlab.io import Manifest, make_folder
from headlab.model.config import ATTENTION_FAMILIES, PRESETS, ModelConfig, preset
from headlab.model.gpt import count_parameters
from headlab.package import installed_version
from headlab.report.plots import method_order
from headlab.report.writer import SWEEP, SWEEP_MANIFEST, write_docs, write_report, write_sweep_report
from headlab.study.roles import ROLES, comparison_variants
from headlab.study.study import Study
from headlab.study.sweep import UNSWEPT_TRAIN_FIELDS, grid, sweep_roles, sweep_table
from headlab.study.tables import read_study_tables, tabulate_study
from headlab.training.config import DTYPES, OPTIMIZERS, PARALLEL, TRAIN_PRESETS, TrainConfig, train_preset
from headlab.training.distributed import (
    FailedOnAnotherRank,
    abandon,
    in_process_group,
    is_main_process,
    launched_processes,
    leave_process_group,
)
from headlab.training.plan import add_plan_arguments, format_bytes, format_plan, plan_for_args, plan_from_args
from headlab.training.trainer import keep_freed_cpu_memory, prepared_corpus, repetition_note, train

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CONFIG_OVERRIDES = ("n_kv_head", "kv_rank", "kv_latent_dim", "rope_head_dim", "q_latent_dim", "seq_len")
CONFIG_HELP = {
    "n_kv_head": "GQA: number of K/V heads (must divide the preset's n_head)",
    "kv_rank": "LRKV: rank r of each head's K/V residual (1..head_dim)",
    "kv_latent_dim": "MLA: latent width d_c",
    "rope_head_dim": "MLA: decoupled RoPE width d_R (even)",
    "q_latent_dim": "MLA: query latent width (0: queries not compressed)",
    "seq_len": "context length in tokens",
}
TRAIN_OVERRIDES = ("steps", "batch_size", "optimizer", "lr", "warmup_steps", "eval_every", "checkpoint_every",
                   "log_every", "dtype", "device", "seed", "parallel", "grad_accum")
DEFAULT_PRESET = "cpu-small"
DEBUG_ENV = "HEADLAB_DEBUG"


# ---- argument types: each names what is allowed -------------------------------------------------

def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be a positive integer")
    return value


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
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= 0")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is invalid: must be a finite positive number")
    return value


MAX_INT = 2 ** 62  # larger counts are mistakes, and overflow the tensors' int64


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if abs(value) > MAX_INT:
        raise argparse.ArgumentTypeError(f"{text} is invalid: too large (at most {MAX_INT})")
    return value


# ---- info -------------------------------------------------------------------------------------------

def describe(config: ModelConfig, context: int, dtype: str = "bfloat16", batch_size: int = 1) -> dict:
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
    return train_preset(args.preset, compile=args.compile, **overrides)


def _train_model_config(args, vocab_size: int) -> ModelConfig:
    if args.config:
        return _read_model_config(args.config).replace(**_overrides(args))
    return preset(args.preset, args.attention, vocab_size=max(vocab_size, 256), **_overrides(args))


def _source_options(args) -> dict:
    return {name: getattr(args, name) for name in ("max_chars", "text_field") if getattr(args, name) is not None}


def cmd_train(args) -> int:
    train_config = _train_config_from_args(args)  # checked before a corpus is tokenized
    if args.plan:
        print(plan_from_args(args, [_train_model_config(args, tokenizer_vocab_size(args.tokenizer))], train_config))
        return 0
    source_options = _source_options(args)
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
    return 0


# ---- analyze ----------------------------------------------------------------------------------------

def cmd_analyze(args: argparse.Namespace) -> int:
    if args.label is not None and len(args.label) != len(args.sources):
        raise ValueError(f"--label was given {len(args.label)} times for {len(args.sources)} sources: give one "
                         "per SOURCE")
    given = args.label or [None] * len(args.sources)
    if args.snapshots:
        result = concat(analyze_snapshots(source, label, circuit=args.circuit, mla_rope=args.mla_rope,
                                          measure=args.measure) for source, label in zip(args.sources, given))
        print(f"wrote the tables of {result.summary['step'].nunique()} training steps to {result.save(args.out)}")
        return 0
    sources = [load_heads(source, label) for source, label in zip(args.sources, given)]
    labels = distinct_labels([heads.label for heads in sources], args.sources) if args.label is None else args.label
    if len(set(labels)) < len(labels):
        twice = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"--label gives {', '.join(map(repr, twice))} to several sources: give each SOURCE its own "
                         "label, or each model would overwrite another's rows")
    if (args.measure == "data") != (args.text is not None):
        raise ValueError(f"--measure {args.measure} with --text {args.text}: --measure data needs --text FILE, "
                         "and only it reads one")
    order = labels if args.label is not None else method_order(labels)  # a shell glob's order is alphabetical
    by_label = dict(zip(labels, zip(sources, args.sources)))
    result = concat(analyze(heads, label, args.circuit, mla_rope=args.mla_rope, measure=args.measure,
                            inputs=_moments(source, args.text) if args.text else None)
                    for label in order for heads, source in [by_label[label]])
    folder = result.save(args.out)
    print(format_effective_ranks(result.summary))
    print(f"wrote similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv to {folder}")
    return 0


def distinct_labels(labels: list[str], sources: list[str]) -> list[str]:
    """Each source's label; a label several sources share gets the shortest end of each one's
    path that tells them apart ('MHA [e3a/run]', 'MHA [e3b/run]'). The same source given twice
    is refused: it would be one model counted as two."""
    distinct = list(labels)
    for label in dict.fromkeys(labels):
        shared = [i for i, other in enumerate(labels) if other == label]
        if len(shared) < 2:
            continue
        paths = [Path(sources[i]).resolve().parts for i in shared]
        if len(set(paths)) < len(paths):
            raise ValueError(f"{', '.join(sources[i] for i in shared)} name the same source more than once: give "
                             "each SOURCE once")
        depth = next(d for d in range(1, max(map(len, paths)) + 1) if len({p[-d:] for p in paths}) == len(paths))
        for i, path in zip(shared, paths):
            distinct[i] = f"{label} [{'/'.join(path[-depth:])}]"
    return distinct


def _moments(source: str, text_file: Path):
    """Input moments of `source` on the first `inputs.MAX_TOKENS` tokens of `text_file`."""
    if not text_file.is_file():
        raise ValueError(f"--text {text_file}: no such file")
    try:
        text = text_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--text {text_file}: not UTF-8 (byte {error.start}): convert it to UTF-8") from None
    return input_moments(source, encode_text(source, text), text=str(text_file))


def format_effective_ranks(summary) -> str:
    """Per model and circuit, one line per layer: entropy effective rank uncentered (% of H) and
    centered (% of H, % of the H − 1 ceiling), then their means over layers."""
    blocks = []
    for (model, circuit, measure), rows in summary.groupby(["model", "circuit", "measure"], sort=False):
        n = int(rows["n_heads"].iloc[0])
        wide = rows.pivot(index="layer", columns="kind",
                          values=["effective_rank", "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling"])
        wide.loc["mean"] = wide.mean()
        lines = [f"{model} · {circuit} · {measure} · {n} heads — effective rank (% of H; centered also % of "
                 f"ceiling {n - 1})",
                 f"{'layer':>5}  {'uncentered':<16}centered"]
        for layer, row in wide.iterrows():
            unc = f"{row['effective_rank', 'uncentered']:.2f} ({row['effective_rank_pct_of_heads', 'uncentered']:.1f}%)"
            cen = (f"{row['effective_rank', 'centered']:.2f} ({row['effective_rank_pct_of_heads', 'centered']:.1f}%, "
                   f"{row['effective_rank_pct_of_ceiling', 'centered']:.1f}%)")
            lines.append(f"{layer:>5}  {unc:<16}{cen}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# ---- reproduce --------------------------------------------------------------------------------------

def study_settings(settings: list[tuple[str, list]]) -> tuple[dict, dict]:
    """`--set FIELD=VALUE` pairs of a study -> (ModelConfig overrides, TrainConfig overrides); one
    value each (a sweep takes several)."""
    model, training = {}, {}
    for name, values in settings:
        if len(values) != 1:
            raise ValueError(f"--set {name}={','.join(map(str, values))}: a study takes one value per field "
                             "(headlab sweep takes several)")
        if name in model or name in training:
            raise ValueError(f"--set {name} is given twice: give it once")
        (model if name in ModelConfig.__dataclass_fields__ else training)[name] = values[0]
    return model, training


def check_jobs(jobs: int, runs: int) -> None:
    """Refuse more runs at once than there are runs, or than cores to share among them."""
    cores = available_cores()
    if jobs > 1 and jobs > min(runs, cores):
        raise ValueError(f"--jobs {jobs} is invalid: at most {min(runs, cores)} ({runs} runs to train, {cores} "
                         "core(s) to share among them)")


def cmd_reproduce(args) -> int:
    """Train every variant (data-parallel on all ranks under torchrun), then rank 0 alone analyses
    and writes the report while the other ranks leave."""
    started = time.perf_counter()
    source_options = _source_options(args)
    model_overrides, train_overrides = study_settings(args.set or [])
    flags = {name: value for name, value in (("compile", args.compile or None), ("optimizer", args.optimizer),
                                             ("parallel", args.parallel), ("grad_accum", args.grad_accum))
             if value is not None}
    if both := sorted(set(flags) & set(train_overrides)):
        raise ValueError(f"{', '.join(both)} given both as a flag and with --set: give it once")
    study = Study(args.preset, args.steps, Path(args.out), corpus=args.corpus, tokenizer=args.tokenizer,
                  corpus_options=source_options, tokens=args.tokens, model_overrides=model_overrides,
                  train_overrides={**train_overrides, **flags}, only=tuple(args.only) if args.only else None)
    jobs = args.jobs or study.default_jobs(args.seeds)
    check_jobs(jobs, len(study.variants) * args.seeds)
    if args.plan:  # the whole table even when it does not fit: a study's cost is worth seeing either way
        plan = plan_for_args(args, study.variants, study.train_config(0), seeds=args.seeds, check=False, jobs=jobs)
        print(format_plan(plan))
        if note := paper_budget_note(args.preset, plan):
            print(note)
        if not plan.fits:
            raise ValueError("the study does not fit as planned (the table above says what would): change the "
                             "preset, batch or devices")
        return 0
    main_rank = is_main_process()
    say = print if main_rank else (lambda message: None)
    say(f"training {len(study.roles)} variants x {args.seeds} seed(s) on preset {args.preset} "
        f"into {study.folder / 'runs'}")
    runs = study.train(args.seeds, progress=main_rank and sys.stderr.isatty(), log=say, jobs=jobs)
    leave_process_group()  # every run is checkpointed: the ranks part here, and rank 0 writes the report
    if not main_rank:
        return 0
    report = write_report(tabulate_study(runs, study.load_corpus(), args.preset, study.folder, started), study.folder)
    print(f"report written: {report}")
    print(f"flagship figure: {report.parent / 'figures' / 'spectra_uncentered.png'}")
    return 0


# Training tokens per run of the paper's own study, where the paper states them (its 128M models).
PAPER_TOKENS = {"paper-128m": 100 * 10 ** 9}


def paper_budget_note(preset_name: str, plan) -> str | None:
    """What a plan's budget is next to the paper's (None where the paper's is not known or is met):
    the preset's steps are a default, not the paper's token count."""
    paper = PAPER_TOKENS.get(preset_name)
    tokens = plan.variants[0].tokens
    if paper is None or tokens >= paper:
        return None
    return (f"note: each run trains on {tokens / 1e9:.2f} B tokens; the paper trained its {preset_name} models on "
            f"{paper / 1e9:.0f} B. --tokens {paper / 1e9:.0f}e9 plans the paper's budget: about "
            f"{paper / tokens:.0f} x the wall time and FLOPs above "
            f"({_duration_text(plan.total_wall_s * paper / tokens)})")


def _duration_text(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds < 3 * 86400 else f"{seconds / 86400:.1f} days"


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


def cmd_sweep(args) -> int:
    """Train the comparison at every grid point (reusing finished runs), write sweep.csv, the
    figure and sweep.md."""
    fields = dict(args.set or [])
    points = grid(args.preset, args.lengths, args.depths, fields)
    only = tuple(args.only) if args.only else None
    print(f"sweep: {len(points)} grid point(s) x {len(sweep_roles(args.preset, only))} variants x "
          f"{args.seeds} seed(s) into {args.out}")
    make_folder(args.out)
    Manifest.claim(args.out, SWEEP_MANIFEST, SWEEP)  # a folder headlab did not write is refused before training
    check_jobs(args.jobs or 1, len(points) * len(sweep_roles(args.preset, only)) * args.seeds)
    table = sweep_table(points, args.seeds, args.out, jobs=args.jobs, only=only)
    save_tables(args.out, {"sweep": table}, SWEEP_MANIFEST, SWEEP)
    tables, _ = load_tables(args.out, SWEEP_MANIFEST, SWEEP)
    print(f"sweep written: {write_sweep_report(tables['sweep'], args.out)}")
    return 0


def cmd_report(args) -> int:
    """Redraw report.md and every figure of a study folder from its tables (no torch work)."""
    report = write_report(read_study_tables(args.folder), args.folder)
    print(f"report written: {report}")
    return 0


def cmd_docs(args) -> int:
    """The README's figures and headline table from a study's tables (no torch work)."""
    headline = write_docs(read_study_tables(args.folder), args.out)
    print(f"headline table and figures written: {headline.parent}")
    return 0


# ---- parser -----------------------------------------------------------------------------------------

def _add_model_arguments(parser: argparse.ArgumentParser, attention_default: str | None) -> None:
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="model (and training) preset (default: %(default)s)")
    parser.add_argument("--config", metavar="JSON", help="a ModelConfig JSON file instead of a preset")
    parser.add_argument("--attention", default=attention_default, choices=ATTENTION_FAMILIES,
                        help="attention family " + ("(default: the study's six variants)" if attention_default is None
                                                    else "(default: %(default)s)"))
    for name in CONFIG_OVERRIDES:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, metavar="N",
                            type=non_negative_int if name == "q_latent_dim" else positive_int,
                            help=CONFIG_HELP[name] + " (default: the preset's)")


def _add_corpus_arguments(parser: argparse.ArgumentParser, tokenizer_default: str | None) -> None:
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


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, so `--seed 2` is an error rather than `--seeds 2`; every
    parser of the CLI (subcommands included) is one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)


REPRODUCE_EXAMPLE = """example (what `make demo` runs; the README gives its measured time):
  headlab reproduce --out runs/reproduce --jobs 2

results land in the study folder (--out):
  DIR/runs/<variant>-seed<k>/   one run folder per variant and seed (reused or resumed on a rerun)
  DIR/*.csv, DIR/study.json     every number, as tables (`headlab report DIR` redraws from them)
  DIR/report.md, DIR/figures/   the report and its figures (PNG and SVG)"""


def unknown_arguments(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """The error for arguments `parser` does not take, naming its closest option for each."""
    options = {option.lstrip("-"): option for action in parser._actions for option in action.option_strings}
    hints = []
    for arg in unknown:
        match = difflib.get_close_matches(arg.split("=")[0].lstrip("-"), options, n=1) if arg.startswith("-") else []
        hints.append(f"{arg} (did you mean {options[match[0]]}?)" if match else arg)
    return "unrecognized arguments: " + " ".join(hints)


def _info_arguments(info: argparse.ArgumentParser) -> None:
    info.add_argument("--context", type=positive_int, metavar="TOKENS", help="tokens in the cache (default: seq_len)")
    info.add_argument("--batch-size", type=positive_int, default=1, metavar="N",
                      help="sequences in the cache (default: %(default)s)")
    info.add_argument("--dtype", choices=sorted(DTYPE_BYTES),
                      help="bytes per cached value (default: the preset's training dtype; bfloat16 for --config)")
    info.add_argument("--json", action="store_true", help="machine-readable output")


def _train_arguments(train: argparse.ArgumentParser) -> None:
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
            ("checkpoint_every", positive_int, "N", "checkpoint every N steps (and at the end)"),
            ("log_every", positive_int, "N", "log the training loss every N steps"),
            ("dtype", None, None, "float32, or bfloat16 autocast"),
            ("device", str, "DEVICE", "auto, cpu, cuda or cuda:<index>"),
            ("seed", non_negative_int, "N", "seed of the weights and of the data order"),
            ("parallel", None, None, "under torchrun: ddp (a full replica per process) or fsdp (parameters, "
                                     "gradients and optimizer state sharded per block; AdamW only)"),
            ("grad_accum", positive_int, "K", "micro-batches per optimizer step on each process")):
        choices = {"optimizer": OPTIMIZERS, "dtype": DTYPES, "parallel": PARALLEL}
        options = {"choices": choices[name]} if name in choices else {"type": kind, "metavar": metavar}
        train.add_argument("--" + name.replace("_", "-"), dest=name, **options,
                           help=f"{text} (default: the preset's; {DEFAULT_PRESET}: {getattr(small, name)})")
    train.add_argument("--compile", action="store_true", help="torch.compile the model (GPU only)")
    train.add_argument("--out", metavar="DIR", help="run folder (default: none, nothing is saved)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last checkpoint (or from step 0 if it has none)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")


def _analyze_arguments(analyze: argparse.ArgumentParser) -> None:
    analyze.add_argument("sources", nargs="+", metavar="SOURCE",
                         help="a headlab run folder, or a Hugging Face checkpoint folder / .safetensors file")
    analyze.add_argument("--out", required=True, type=Path, metavar="DIR",
                         help="folder for similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv")
    analyze.add_argument("--circuit", default="qk", choices=("qk", "ov", "both"),
                         help="qk: W_Q W_Kᵀ (the paper's); ov: W_V W_O; both (default: %(default)s)")
    analyze.add_argument("--measure", default="frobenius", choices=("frobenius", "data"),
                         help="inner product of head forms: frobenius (the paper's) or data (weighted by the second "
                              "moments of each layer's inputs on --text) (default: %(default)s)")
    analyze.add_argument("--text", type=Path, metavar="FILE",
                         help="UTF-8 text each SOURCE reads to measure its input moments (needed by --measure data)")
    analyze.add_argument("--label", action="append", metavar="NAME",
                         help="display name of each SOURCE, in order (default: from its config)")
    analyze.add_argument("--mla-rope", default="included", choices=("included", "excluded"),
                         help="MLA only: whether the decoupled RoPE query/key parts enter A_h ('included'), or only "
                              "the latent path W_down W_up,h as in the paper's Table 4 ('excluded') "
                              "(default: %(default)s)")
    analyze.add_argument("--snapshots", action="store_true",
                         help="headlab run folders only: analyse every training snapshot (TrainConfig.snapshot_every) "
                              "and the last checkpoint; the tables gain a step column")


def _study_budget_arguments(reproduce: argparse.ArgumentParser) -> None:
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


def _reproduce_arguments(reproduce: argparse.ArgumentParser) -> None:
    reproduce.add_argument("--out", default="runs/reproduce", metavar="DIR", help="study folder (default: %(default)s)")
    reproduce.add_argument("--compile", action="store_true", help="torch.compile every model (GPU only)")
    reproduce.add_argument("--optimizer", choices=OPTIMIZERS,
                           help="muon (Muon on block matrices + AdamW elsewhere, DDP only) or adamw (needed by "
                                "--parallel fsdp) (default: the preset's; paper-*: muon, the others: adamw)")
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
                           help=f"train these roles only (default: all six: {' '.join(ROLES)})")


def _sweep_arguments(sweep: argparse.ArgumentParser) -> None:
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


def _study_folder_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, metavar="DIR", help="a study folder, e.g. runs/reproduce")


def _docs_arguments(docs: argparse.ArgumentParser) -> None:
    docs.add_argument("--out", type=Path, default=Path("docs"), metavar="DIR",
                      help="output folder (default: %(default)s)")


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, help and description, the handler that runs it, and its
    arguments as groups added in order (its own, and those it shares with other subcommands: the
    model, corpus and plan options, a study folder). `build_parser` gives every one the same common
    parsing (--debug, no prefix matching, an unknown argument refused with the subcommand's own
    usage), so no subcommand can miss a part of it."""

    name: str
    help: str
    description: str
    handler: Callable[[argparse.Namespace], int]
    arguments: tuple[Callable[[argparse.ArgumentParser], None], ...]
    epilog: str | None = None


COMMANDS = (
    Command("info", "parameter count and KV-cache size of a preset or config",
            "Parameter counts (no weights allocated) and decode KV-cache sizes of the six variants `headlab "
            "reproduce` trains on a preset, of one attention family (--attention), or of one ModelConfig JSON file.",
            cmd_info, (partial(_add_model_arguments, attention_default=None), _info_arguments)),
    Command("train", "train one model into a run folder (works under torchrun)",
            "Train one model. With --out, the run folder keeps config.json, metrics.jsonl and atomic checkpoints; "
            "--resume continues it exactly, after checking that the model, training and data settings match the "
            "saved run. Training settings default to the preset's.",
            cmd_train, (partial(_add_model_arguments, attention_default="mha"),
                        partial(_add_corpus_arguments, tokenizer_default="byte"),
                        _train_arguments, add_plan_arguments)),
    Command("analyze", "head similarity, eigen-spectra and effective rank per layer (paper §4.3)",
            "Analyse headlab run folders and Hugging Face checkpoints: save the tidy tables and print each model's "
            "per-layer effective rank. Models are listed in family order (MHA, LRKV, MQA, MLA, GQA, then others as "
            "given), or in the order of --label when given.",
            cmd_analyze, (_analyze_arguments,)),
    Command("reproduce", "train the six comparison variants, analyse their heads, write figures and a report beside "
            "the paper's numbers",
            "The main job: train MHA, LRKV (two ranks), MQA, MLA and GQA, analyse their heads and write figures and "
            "report.md. Finished runs are reused and interrupted ones resumed.",
            cmd_reproduce, (_study_budget_arguments, partial(_add_corpus_arguments, tokenizer_default=None),
                            _reproduce_arguments, partial(add_plan_arguments, tokens=False)),
            epilog=REPRODUCE_EXAMPLE),
    Command("sweep", "the comparison with Standard MHA across a grid of training lengths, depths and model or "
            "training settings",
            "Train the six comparison variants at every point of a grid (each point an ordinary study folder: runs "
            "are reused and resumed), then write sweep.csv, figures/sweep.png and sweep.md: the paired difference to "
            "Standard MHA ± its 95% half-width per comparison and point, and which orderings hold everywhere, change "
            "sign or shrink toward zero. Example: headlab sweep --preset cpu-small --lengths 1 4 10 --seeds 3 "
            "--jobs 2 --out runs/sweep",
            cmd_sweep, (_sweep_arguments,)),
    Command("report", "redraw a study's report.md and figures from its tables",
            "Redraw report.md and every figure of a study folder (what `headlab reproduce` wrote) from its tables "
            "alone, in seconds: nothing is trained or analysed again. The tables are checked against study.json "
            "first.",
            cmd_report, (_study_folder_argument,)),
    Command("docs", "draw the README's figures and headline table from a study",
            "Write the flagship figure, the effective rank per layer and the loss against cache size (PNG and SVG) "
            "and headline.md (loss and effective rank, mean ± sd over seeds, paired differences to MHA ± 95% "
            "half-width, the study's run time) from a study folder's tables; `make docs` does it for make demo's "
            "study.",
            cmd_docs, (_study_folder_argument, _docs_arguments)),
)


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (also: {DEBUG_ENV}=1)")
    parser = Parser(prog="headlab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"headlab {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        layout = {"epilog": command.epilog, "formatter_class": argparse.RawDescriptionHelpFormatter} \
            if command.epilog else {}
        command_parser = sub.add_parser(command.name, parents=[common], help=command.help,
                                        description=command.description, **layout)
        for group in command.arguments:
            group(command_parser)
        command_parser.set_defaults(func=command.handler, command_parser=command_parser)
    return parser


def _one_line(error: BaseException) -> str:
    """The message of a user error; an OSError as 'what: which file', with the usual fix."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where} (check the path, its permissions and free disk space)"
    return str(error)


USER_ERRORS = (ValueError, RuntimeError, OSError, TypeError, OverflowError, KeyError)  # what bad input raises
EXIT_INPUT, EXIT_BUG, EXIT_INTERRUPTED = 2, 1, 130


def main(argv: list[str] | None = None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's, says what it takes
        args.command_parser.error(unknown_arguments(args.command_parser, unknown))
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return args.func(args)
    except KeyboardInterrupt as error:
        if debug and not in_process_group():
            raise
        status = _say(error, "interrupted; a run folder resumes from its last checkpoint (--resume)", EXIT_INTERRUPTED,
                      debug)
    except USER_ERRORS as error:  # bad values (also inside parsed JSON), files, folders in use, full disks
        if debug and not in_process_group():
            raise
        status = _say(error, _one_line(error), EXIT_INPUT, debug)
    except Exception as error:  # a defect: still one line, said to be a bug
        if debug and not in_process_group():
            raise
        status = _say(error, f"internal error {type(error).__name__}: {str(error)[:300]} (a bug in headlab: please "
                             "report it with the output of --debug)", EXIT_BUG, debug)
    if in_process_group():  # the other ranks may never reach the exit barrier: end now
        abandon(status)
    return status


def _say(error: BaseException, message: str, status: int, debug: bool) -> int:
    """Print `message` (or, with --debug under torchrun, the traceback) if this process reports
    `error`, and return `status`. Under torchrun rank 0 prints every error (another rank's failure
    reaches it as `FailedOnAnotherRank`); another rank prints only a failure of its own after the
    ranks parted ways, since before they joined they all fail alike, and never a Ctrl-C, which
    every rank receives."""
    rank = launched_processes().rank
    own = in_process_group() and not isinstance(error, (FailedOnAnotherRank, KeyboardInterrupt))
    if rank == 0 or own:
        if debug:
            traceback.print_exc()
        else:
            print(f"headlab: error{f' (rank {rank})' if rank else ''}: {message}", file=sys.stderr)
    return status
