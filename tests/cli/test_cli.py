import argparse
import importlib.metadata
import json
import subprocess
import sys

import pytest

from headlab import GPT, preset
from headlab.cli.main import main
from headlab.cli.parser import COMMANDS, build_parser, handler_place
from headlab.model.gpt import describe
from headlab.study.roles import comparison_variants
from headlab.training.config import TRAIN_PRESETS


def _info(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headlab", "info", *args], capture_output=True, text=True)


@pytest.mark.parametrize("name,rank,fraction", [
    ("paper-128m", 46, 52.6), ("paper-1.2b", 51, 48.2), ("paper-2.5b", 55, 48.5), ("paper-6.3b", 54, 45.3)])
def test_info_reproduces_the_papers_lrkv_cache_fractions(name, rank, fraction, capsys):
    assert main(["info", "--preset", name, "--attention", "lrkv", "--kv-rank", str(rank), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert round(100 * row["kv_fraction_of_mha"], 1) == fraction
    assert row["kv_values_per_token_per_layer"] == 2 * (128 + preset(name).n_head * rank)


def test_info_table_lists_the_studys_six_variants_in_their_training_dtype(capsys):
    assert main(["info"]) == 0  # cpu-small: what `make demo` trains, in float32
    out = capsys.readouterr().out
    assert "context 64, batch 1, float32" in out.splitlines()[0]
    labels = [line[:22].strip() for line in out.splitlines()[3:]]
    assert labels == [config.label for config in comparison_variants("cpu-small")]
    assert labels[1:3] == ["LRKV (r=4)", "LRKV (r=16)"]
    assert main(["info", "--preset", "paper-128m", "--context", "2048"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out.splitlines()[0]  # the paper presets train in bf16
    assert "72.0 MiB" in out  # MHA: 2·6·128 values × 12 layers × 2048 tokens × 2 bytes (paper Table 12)


@pytest.mark.parametrize("argv", [["--help"], ["reproduce", "--help"], ["--version"], ["train", "--no-such-option"]],
                         ids=" ".join)
def test_help_version_and_usage_errors_load_no_torch(argv):
    """They answer from the parser alone (headlab.__main__): under a second quiet, not torch's seconds."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "headlab", *argv], capture_output=True,
                            text=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    # importlib.import_module's imports go unrecorded; the ones they make, the parser's options among them, do
    assert "headlab.cli.arguments" in imported and result.returncode in (0, 2), result.stderr[-2000:]
    assert not {"torch", "pandas", "numpy"} & imported


def test_reproduce_states_each_presets_default_optimizer_as_the_presets_have_it():
    (commands_action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (optimizer,) = [a for a in commands_action.choices["reproduce"]._actions if a.dest == "optimizer"]
    defaults = optimizer.help.split("(default: the preset's; ")[1].rstrip(")")
    stated = {name: chosen for part in defaults.split("; ") for chosen, names in [part.split(": ")]
              for name in names.split(", ")}
    assert stated == {name: config.optimizer for name, config in TRAIN_PRESETS.items()}


def test_every_parser_refuses_abbreviated_options():
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert set(commands.choices) == {"info", "train", "analyze", "reproduce", "sweep", "report", "docs"}
    assert not parser.allow_abbrev and not any(sub.allow_abbrev for sub in commands.choices.values())


def test_a_mistyped_flag_prints_its_subcommands_usage_and_the_flag_it_resembles(capsys, monkeypatch):
    monkeypatch.setattr(*handler_place("commands.cmd_reproduce"),
                        lambda args: pytest.fail(f"--seed was taken for --seeds: {args}"))
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--seed", "2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: headlab reproduce ")
    assert "headlab reproduce: error: unrecognized arguments: --seed (did you mean --seeds?) 2" in err


# What each subcommand requires besides its options, so that only the unknown argument is wrong.
REQUIRED = {"info": [], "train": [], "analyze": ["run", "--out", "tables"], "reproduce": [], "sweep": [],
            "report": ["study"], "docs": ["study"]}


@pytest.mark.parametrize("unknown", [["--sed", "2"], ["--no-such-option"]], ids=" ".join)  # --seed is train's
@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_every_subcommand_refuses_an_unknown_argument_with_its_usage_and_one_line(capsys, monkeypatch, command,
                                                                                   unknown):
    assert {each.name for each in COMMANDS} == set(REQUIRED)  # a new subcommand is checked here too
    for each in COMMANDS:
        monkeypatch.setattr(*handler_place(each.handler),
                            lambda args, name=each.name: pytest.fail(f"{name} ran with an unknown argument: {args}"))
    with pytest.raises(SystemExit) as exit_:
        main([command, *REQUIRED[command], *unknown])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and err.startswith(f"usage: headlab {command} ")
    assert err.strip().splitlines()[-1].startswith(f"headlab {command}: error: unrecognized arguments: {unknown[0]}")
    assert sum("error:" in line for line in err.splitlines()) == 1


def test_help_introduces_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    description = out.split("positional arguments:")[0]
    (subcommands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert exit_.value.code == 0 and set(subcommands.choices) >= {"reproduce", "sweep", "report", "docs"}
    assert [name for name in subcommands.choices if f"`headlab {name}`" not in description] == []


def test_version_prints_the_installed_distributions_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"headlab {importlib.metadata.version('headlab')}\n"


def test_reproduce_help_gives_an_example_and_where_results_land(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    out = capsys.readouterr().out
    assert "  headlab reproduce --out runs/reproduce --jobs 2" in out
    assert "DIR/report.md, DIR/figures/" in out and "DIR/runs/<variant>-seed<k>/" in out


def test_describe_counts_parameters_of_a_real_model_and_bytes_from_the_formula():
    config = preset("tiny", "mla", q_latent_dim=8)
    row = describe(config, context=10, dtype="float32", batch_size=3)
    assert row["params"] == sum(p.numel() for p in GPT(config).parameters())
    assert row["kv_cache_bytes"] == (12 + 4) * config.n_layer * 10 * 3 * 4


def test_python_m_headlab_info_rejects_bad_values_naming_the_field():
    result = _info("--preset", "paper-128m", "--attention", "lrkv", "--kv-rank", "200")
    assert result.returncode == 2
    assert "ModelConfig.kv_rank = 200" in result.stderr and "1..128" in result.stderr


def test_info_reads_a_config_file(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(preset("tiny", "gqa").to_json())
    assert main(["info", "--config", str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["attention"] == "gqa" and row["kv_values_per_token_per_layer"] == 2 * 2 * 8


def test_reproduce_optimizer_help_states_each_presets_own_default():
    """The help names, for every training preset, the optimizer the preset itself picks."""
    import re

    from headlab.training.config import TRAIN_PRESETS

    reproduce = build_parser()._subparsers._group_actions[0].choices["reproduce"]
    option = next(action for action in reproduce._actions if "--optimizer" in action.option_strings)
    stated = {}
    for optimizer, names in re.findall(r"(adamw|muon): ([a-z0-9., -]+?)(?:;|\)$)", option.help):
        stated.update(dict.fromkeys(names.split(", "), optimizer))
    assert stated == {name: config.optimizer for name, config in TRAIN_PRESETS.items()}
