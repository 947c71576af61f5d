"""What the analysis and study subcommands do: their handlers, given the parsed arguments, and the
helpers only they use (`info` and `train`: headlab.cli.model_commands; `report` and `docs`:
headlab.cli.report_commands)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from headlab.analysis.attention_maps import attention_analysis
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import encode_text, input_moments, load_forward_model
from headlab.analysis.similarity import Analysis, analyze, concat
from headlab.analysis.snapshots import analyze_snapshots, snapshot_heads
from headlab.analysis.zero_forms import zero_form_note
from headlab.cli.model_commands import given_source_options, plan_for_args
from headlab.cli.paths import SHAKESPEARE_TEXT
from headlab.data.encoding import available_cores
from headlab.data.sources import shakespeare_held_out
from headlab.model.config import ModelConfig
from headlab.report.analysis_output import layer_table, write_spectra_figures
from headlab.report.sweep_page import write_sweep_report
from headlab.report.writer import write_report
from headlab.runs.checkpoints import has_checkpoint
from headlab.runs.layout import read_config
from headlab.schema import ALL_MEASURES, MEASURES
from headlab.study.roles import compared_roles, role_of
from headlab.study.study import Study
from headlab.study.sweep import claim_sweep_folder, grid, save_sweep, sweep_roles, sweep_table
from headlab.study.tables import tabulate_study
from headlab.training.distributed import leave_process_group
from headlab.training.plan import format_plan
from headlab.training.processes import is_main_process

# ---- analyze ----------------------------------------------------------------------------------------

def cmd_analyze(args: argparse.Namespace) -> int:
    if args.label is not None and len(args.label) != len(args.sources):
        raise ValueError(f"--label was given {len(args.label)} times for {len(args.sources)} sources: give one "
                         "per SOURCE")
    given = args.label or [None] * len(args.sources)
    if args.snapshots:
        if args.attention_maps or args.text:
            raise ValueError("--snapshots reads weights only: leave out --attention-maps and --text")
        result = concat(analyze_snapshots(source, label, circuit=args.circuit, mla_rope=args.mla_rope,
                                          measure=args.measure) for source, label in zip(args.sources, given))
        print(f"wrote the tables of {result.summary['step'].nunique()} training steps to {result.save(args.out)}")
        print_zero_forms(result.similarity)
        return 0
    sources = [load_heads(source, label) for source, label in zip(args.sources, given)]
    labels = distinct_labels([heads.label for heads in sources], args.sources) if args.label is None else args.label
    if len(set(labels)) < len(labels):
        twice = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"--label gives {', '.join(map(repr, twice))} to several sources: give each SOURCE its own "
                         "label, or each model would overwrite another's rows")
    measures = MEASURES if args.measure == ALL_MEASURES else (args.measure,)
    if ("data" in measures or args.attention_maps) != (args.text is not None):
        raise ValueError(f"--measure {args.measure}{' --attention-maps' * args.attention_maps} with --text "
                         f"{args.text}: --measure data (or {ALL_MEASURES}) needs --text FILE, so does "
                         "--attention-maps, and only they read one")
    text = _read_text(args.text) if args.text else None
    by_label = dict(zip(labels, zip(sources, args.sources)))
    # a shell glob's order is alphabetical: without --label, headlab models go in figure order (by config)
    order = labels if args.label is not None else sorted(labels, key=lambda label: by_label[label][0].figure_order)

    # each model's analysis under each measure asked for, then its behaviour view (circuit "pattern",
    # with its spectra): one model in memory at a time, read once and its text encoded once for both
    weight_views, behaviour_views = [], []
    for label in order:
        heads, source = by_label[label]
        loaded = load_forward_model(source) if text is not None else None
        windows = encode_text(source, text) if text is not None else None
        moments = input_moments(loaded, windows, text=str(args.text)) if "data" in measures else None
        weight_views += [analyze(heads, label, args.circuit, mla_rope=args.mla_rope, measure=measure,
                                 inputs=moments if measure == "data" else None) for measure in measures]
        if args.attention_maps:
            behaviour_views.append(attention_analysis(loaded, windows[:MAP_WINDOWS], label))
        del loaded
    result = concat([*weight_views, *behaviour_views])
    init = random_init(by_label, order, args)
    folder = result.save(args.out)
    print(layer_table(result.summary, result.spectra, None if init is None else init.spectra))
    print_zero_forms(result.similarity)
    print(f"wrote similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv to {folder}")
    if not args.no_figure:
        roles = {label: run_role(source) for label, (_, source) in by_label.items()}
        spectra = result.spectra.assign(role=result.spectra["model"].map(roles))
        figures = write_spectra_figures(spectra, folder, None if init is None else init.spectra, svg=args.svg)
        print(f"figure{'s' * (len(figures) > 1)}: {', '.join(str(path) for path in figures)}"
              + (" (and an .svg beside each)" if args.svg else ""))
    return 0

def run_role(source) -> str | None:
    """The comparison role of a headlab run folder's model (`role_of`); None for any other source."""
    return role_of(ModelConfig.from_dict(read_config(source)["model"])) if has_checkpoint(source) else None

def random_init(by_label: dict, order: list[str], args) -> Analysis | None:
    """The weights view of each headlab run SOURCE at its step-0 snapshot (its random
    initialisation), for the baseline beside every number; None when no source has one."""
    heads = [(label, snapshot_heads(source, 0, label)) for label in order for _, source in [by_label[label]]
             if has_checkpoint(source)]
    analyses = [analyze(at_init, label, args.circuit, mla_rope=args.mla_rope) for label, at_init in heads
                if at_init is not None]
    return concat(analyses) if analyses else None

def print_zero_forms(similarity) -> None:
    """The line naming dead heads and layers without a circuit, if an analysis has any."""
    note = zero_form_note(similarity)
    if note:
        print(note)

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

# windows whose attention maps --attention-maps compares: the maps are B·H·T² numbers per layer
MAP_WINDOWS = 8

def _read_text(text_file: Path) -> str:
    """The text of --text (the first `inputs.MAX_TOKENS` tokens of it are read); the name
    `shakespeare`, where no such file exists, is the held-out tenth of the Shakespeare corpus."""
    if str(text_file) == SHAKESPEARE_TEXT and not text_file.exists():
        return shakespeare_held_out()
    if not text_file.is_file():
        raise ValueError(f"--text {text_file}: no such file")
    try:
        text = text_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--text {text_file}: not UTF-8 (byte {error.start}): convert it to UTF-8") from None
    if not text.strip():
        raise ValueError(f"--text {text_file}: the file holds no text (the data-aware view and the attention maps "
                         "are measured on it)")
    return text

# ---- reproduce --------------------------------------------------------------------------------------

def settings_by_field(settings: list[tuple[str, list]]) -> dict[str, list]:
    """`--set FIELD=V1,V2` pairs -> {field: values}, a field given twice refused (the last would win)."""
    by_field = {}
    for name, values in settings:
        if name in by_field:
            raise ValueError(f"--set {name} is given twice: give it once")
        by_field[name] = values
    return by_field

def study_settings(settings: list[tuple[str, list]]) -> tuple[dict, dict]:
    """`--set FIELD=VALUE` pairs of a study -> (ModelConfig overrides, TrainConfig overrides); one
    value each (a sweep takes several)."""
    model, training = {}, {}
    for name, values in settings_by_field(settings).items():
        if len(values) != 1:
            raise ValueError(f"--set {name}={','.join(map(str, values))}: a study takes one value per field "
                             "(headlab sweep takes several)")
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
    source_options = given_source_options(args)
    model_overrides, train_overrides = study_settings(args.set or [])
    flags = {name: value for name, value in (("compile", args.compile), ("optimizer", args.optimizer),
                                             ("parallel", args.parallel), ("grad_accum", args.grad_accum))
             if value is not None}
    if both := sorted(set(flags) & set(train_overrides)):
        raise ValueError(f"{', '.join(both)} given both as a flag and with --set: give it once")
    study = Study(args.preset, args.steps, Path(args.out), corpus=args.corpus, tokenizer=args.tokenizer,
                  corpus_options=source_options, tokens=args.tokens, model_overrides=model_overrides,
                  train_overrides={**train_overrides, **flags},
                  only=compared_roles(tuple(args.only) if args.only else None))
    # planned GPUs train as on a GPU, one run at a time (each run has the devices), whatever cores plan them
    jobs = args.jobs or (1 if args.plan and args.plan_gpus else study.default_jobs(args.seeds))
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
    report = write_report(tabulate_study(runs, study.load_corpus(), args.preset, study.folder, started), study.folder,
                          svg=args.svg)
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

def cmd_sweep(args) -> int:
    """Train the comparison at every grid point (reusing finished runs), write sweep.csv, the
    figure and sweep.md."""
    only = tuple(args.only) if args.only else None
    points = grid(args.preset, args.lengths, args.depths, settings_by_field(args.set or []), only)
    check_jobs(args.jobs or 1, len(points) * len(sweep_roles(args.preset, only)) * args.seeds)
    print(f"sweep: {len(points)} grid point(s) x {len(sweep_roles(args.preset, only))} variants x "
          f"{args.seeds} seed(s) into {args.out}")
    claim_sweep_folder(args.out)
    table = save_sweep(args.out, sweep_table(points, args.seeds, args.out, jobs=args.jobs, only=only))
    print(f"sweep written: {write_sweep_report(table, args.out, svg=args.svg)}")
    return 0
