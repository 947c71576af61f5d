"""The command line's parser: the subcommands (the table `COMMANDS`), their options
(headlab.cli.arguments) and the common parsing. It loads neither torch nor pandas, so `headlab
--help`, `--version` and a usage error answer at once; headlab.cli.main runs what it parses."""

from __future__ import annotations

import argparse
import difflib
import importlib
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Callable

from headlab.cli.arguments import (
    add_corpus_arguments,
    add_model_arguments,
    add_plan_arguments,
    analyze_arguments,
    docs_arguments,
    info_arguments,
    reproduce_arguments,
    study_budget_arguments,
    study_folder_argument,
    svg_argument,
    sweep_arguments,
    train_arguments,
)
from headlab.cli.paths import analyze_problems, study_folder_problems
from headlab.package import installed_version

DEBUG_ENV = "HEADLAB_DEBUG"
# `headlab --help`: the commands, and how every one of them ends.
DESCRIPTION = """Command line: `headlab info`, `headlab train`, `headlab analyze`, `headlab reproduce` (the main job),
`headlab sweep` (the comparison across training lengths, depths and settings), `headlab report`
(redraw a study's report from its tables) and `headlab docs` (the README's figures).

Every error ends in one line "headlab: error: ..." and an exit status (`--debug` or
HEADLAB_DEBUG=1 shows the traceback instead):

    0    done
    1    a bug in headlab (an unexpected exception): the line says so; please report it
    2    a mistake in the input: a bad value, a file that is missing, damaged or not headlab's,
         a folder in use ("busy, retry"), a full disk
    130  interrupted (Ctrl-C); a run folder resumes from its last checkpoint
    141  the reader of its output went away (`headlab analyze ... | head -1`): it stops quietly,
         as a Unix tool ended by SIGPIPE does (what it wrote to files before is complete)"""

class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, so `--seed 2` is an error rather than `--seeds 2`; every
    parser of the CLI (subcommands included) is one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        super().error(printable(message))

REPRODUCE_EXAMPLE = """example (what `make demo` runs; the README gives its measured time):
  headlab reproduce --out runs/reproduce --jobs 2

results land in the study folder (--out):
  DIR/runs/<variant>-seed<k>/   one run folder per variant and seed (reused or resumed on a rerun)
  DIR/*.csv, DIR/study.json     every number, as tables (`headlab report DIR` redraws from them)
  DIR/report.md, DIR/figures/   the report and its figures (PNG; with --svg, SVG beside each)"""

def unknown_arguments(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """The error for arguments `parser` does not take, naming its closest option for each."""
    options = {option.lstrip("-"): option for action in parser._actions for option in action.option_strings}
    hints = []
    for arg in unknown:
        match = difflib.get_close_matches(arg.split("=")[0].lstrip("-"), options, n=1) if arg.startswith("-") else []
        hints.append(f"{arg} (did you mean {options[match[0]]}?)" if match else arg)
    return "unrecognized arguments: " + " ".join(hints)

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
    handler: str  # "module.function" under headlab.cli, its module loaded only to run it
    arguments: tuple[Callable[[argparse.ArgumentParser], None], ...]
    epilog: str | None = None
    # what is wrong with the paths the parsed arguments name (None each where nothing is), told
    # before the handler loads torch: headlab.cli.paths
    path_problems: Callable[[argparse.Namespace], list[str | None]] | None = None

COMMANDS = (
    Command("info", "parameter count and KV-cache size of a preset or config",
            "Parameter counts (no weights allocated) and decode KV-cache sizes of the six variants `headlab "
            "reproduce` trains on a preset, of one attention family (--attention), or of one ModelConfig JSON file.",
            "model_commands.cmd_info", (partial(add_model_arguments, attention_default=None), info_arguments)),
    Command("train", "train one model into a run folder (works under torchrun)",
            "Train one model. With --out, the run folder keeps config.json, metrics.jsonl and atomic checkpoints; "
            "--resume continues it exactly, after checking that the model, training and data settings match the "
            "saved run. Training settings default to the preset's.",
            "model_commands.cmd_train", (partial(add_model_arguments, attention_default="mha"),
                        partial(add_corpus_arguments, tokenizer_default="byte"),
                        train_arguments, add_plan_arguments)),
    Command("analyze", "head similarity, eigen-spectra and effective rank per layer (paper §4.3)",
            "Analyse headlab run folders and Hugging Face checkpoints: save the tidy tables, print each model's "
            "per-layer first eigenvalue (beside its random-init value for run folders) and effective rank, and draw "
            "the uncentered spectra of the early, middle and late layer (spectra_uncentered.png). Models are listed "
            "in family order (MHA, LRKV, MQA, MLA, GQA, then others as given), or in the order of --label when given.",
            "commands.cmd_analyze", (analyze_arguments,), path_problems=analyze_problems),
    Command("reproduce", "train the six comparison variants, analyse their heads, write figures and a report beside "
            "the paper's numbers",
            "The main job: train MHA, LRKV (two ranks), MQA, MLA and GQA, analyse their heads and write figures and "
            "report.md. Finished runs are reused and interrupted ones resumed.",
            "commands.cmd_reproduce", (study_budget_arguments, partial(add_corpus_arguments, tokenizer_default=None),
                            reproduce_arguments, partial(add_plan_arguments, tokens=False)),
            epilog=REPRODUCE_EXAMPLE),
    Command("sweep", "the comparison with Standard MHA across a grid of training lengths, depths and model or "
            "training settings",
            "Train the six comparison variants at every point of a grid (each point an ordinary study folder: runs "
            "are reused and resumed), then write sweep.csv, figures/sweep.png and sweep.md: the paired difference to "
            "Standard MHA ± its 95% half-width per comparison and point, and which orderings hold everywhere, change "
            "sign or shrink toward zero. Example: headlab sweep --preset cpu-small --lengths 1 4 10 --seeds 3 "
            "--jobs 2 --out runs/sweep",
            "commands.cmd_sweep", (sweep_arguments,)),
    Command("report", "redraw a study's report.md and figures from its tables",
            "Redraw report.md and every figure of a study folder (what `headlab reproduce` wrote) from its tables "
            "alone, in seconds: nothing is trained or analysed again. The tables are checked against study.json "
            "first.",
            "report_commands.cmd_report", (study_folder_argument, svg_argument), path_problems=study_folder_problems),
    Command("docs", "draw the README's figures and headline table from a study",
            "Write the flagship figure, the effective rank per layer and the loss against cache size (PNG; with "
            "--svg, SVG beside each) "
            "and headline.md (loss and effective rank, mean ± sd over seeds, paired differences to MHA ± 95% "
            "half-width) from a study folder's tables; `make docs` does it for make demo's study (how long a study "
            "took is no table's: the README states the measured time).",
            "report_commands.cmd_docs", (study_folder_argument, docs_arguments), path_problems=study_folder_problems),
)

def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (also: {DEBUG_ENV}=1)")
    parser = Parser(prog="headlab", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"headlab {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        layout = {"epilog": command.epilog, "formatter_class": argparse.RawDescriptionHelpFormatter} \
            if command.epilog else {}
        command_parser = sub.add_parser(command.name, parents=[common], help=command.help,
                                        description=command.description, **layout)
        for group in command.arguments:
            group(command_parser)
        command_parser.set_defaults(handler=command.handler, command_parser=command_parser,
                                    path_problems=command.path_problems)
    return parser


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """`argv` (default: the process's) parsed by `build_parser()`; --help, --version and a usage
    error (an unknown argument named with its closest option) end the process here."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's, says what it takes
        args.command_parser.error(unknown_arguments(args.command_parser, unknown))
    return args


def handler_place(handler: str) -> tuple[ModuleType, str]:
    """The module of a subcommand's `handler` ("module.function" under headlab.cli), loaded now
    (torch with it), and the function's name in it."""
    module, function = handler.rsplit(".", 1)
    return importlib.import_module(f"headlab.cli.{module}"), function


def path_problem(args: argparse.Namespace) -> str | None:
    """The first thing wrong with a path the parsed command `args` names (a missing file, a file
    where a folder belongs, an unreadable one), found without loading torch; None if nothing is."""
    problems = args.path_problems(args) if args.path_problems else []
    return next((problem for problem in problems if problem), None)


def printable(text: str) -> str:
    """`text` with each character that prints nothing visible (str.isprintable: control characters,
    and line breaks such as U+0085 or U+2028 that split a line) as its escape, so that a user's string
    echoed in an error leaves the message one visible line: '\\x85' for U+0085."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
