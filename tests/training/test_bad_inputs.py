"""Bad inputs get one clear line, never a silent wrong answer: a corpus rewritten in place or not
UTF-8, checkpoints whose shapes do not fit their config, non-finite weights, truncated tables,
numbers out of range, and every user mistake at the command line (one line, exit status 2).
Split from test_reliability.py, which keeps the faults that could lose a run's work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import headlab
from headlab import ModelConfig, TrainConfig, load_corpus, preset, train_preset
from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main
from headlab.model.gpt import GPT
from shared_fixtures import write_run


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))


def test_a_file_rewritten_in_place_is_tokenized_again(tmp_path, isolated_cache):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("old words " * 200)
    (folder / "b.txt").write_text("more text " * 200)
    folder_mtime = folder.stat().st_mtime_ns
    assert bytes(load_corpus(str(folder)).train[0][:9]) == b"old words"
    (folder / "a.txt").write_text("new words " * 200)  # same size, same folder entries
    os.utime(folder, ns=(folder_mtime, folder_mtime))
    assert bytes(load_corpus(str(folder)).train[0][:9]) == b"new words"


def test_invalid_utf8_is_an_error_naming_file_and_offset_unless_lossy_is_asked_for(tmp_path, isolated_cache):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café ".encode() * 100 + "naïve".encode("latin-1") + b" end" * 300)
    with pytest.raises(ValueError, match=r"latin1\.txt is not valid UTF-8: byte 0xef at byte offset 602"):
        load_corpus(str(path))
    lossy = load_corpus(str(path), encoding_errors="replace")
    assert "na\ufffdve".encode() in bytes(np.concatenate(lossy.train + lossy.val))


# ---- analysis trusts the tensors -------------------------------------------------------------------------

def _gpt2_folder(folder: Path, n_layer: int, n_head: int, layers_on_disk: int = 2, d: int = 16) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(layers_on_disk):
        tensors[f"h.{i}.attn.c_attn.weight"] = torch.randn(d, 3 * d, generator=generator)
        tensors[f"h.{i}.attn.c_proj.weight"] = torch.randn(d, d, generator=generator)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": n_layer, "n_head": n_head,
                                                    "n_embd": d}))
    return folder


def test_a_head_count_that_does_not_fit_the_weights_is_refused(tmp_path):
    torch.manual_seed(0)
    model = GPT(preset("tiny", "mha"))  # 4 heads of width 8
    with pytest.raises(ValueError, match=r"c_q\.weight has shape \(32, 32\), but the ModelConfig .*n_head=2"):
        analyze(write_run(tmp_path / "run", model, n_head=2, n_kv_head=1))
    with pytest.raises(ValueError, match="3 heads do not divide the query projection"):
        analyze(_gpt2_folder(tmp_path / "gpt2", n_layer=2, n_head=3))


@pytest.mark.parametrize("n_layer", [0, -1, 3])
def test_a_layer_count_that_does_not_fit_the_weights_is_refused(tmp_path, n_layer):
    with pytest.raises(ValueError, match="num_hidden_layers|layer count"):
        analyze(_gpt2_folder(tmp_path / "gpt2", n_layer=n_layer, n_head=2))


def test_non_finite_weights_are_named(tmp_path):
    torch.manual_seed(0)
    model = GPT(preset("tiny", "mha"))
    with torch.no_grad():
        model.blocks[1].attn.c_k.weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"tensor 'blocks\.1\.attn\.c_k\.weight' .* 1 non-finite values"):
        analyze(write_run(tmp_path / "run", model))


def test_a_truncated_analysis_table_is_refused(tmp_path):
    torch.manual_seed(0)
    folder = analyze(GPT(preset("tiny", "mha"))).save(tmp_path / "analysis")
    spectra = folder / "spectra.csv"
    lines = spectra.read_text().splitlines(keepends=True)
    spectra.write_text("".join(lines[: len(lines) // 2]))  # what a re-analysis killed mid-write left
    with pytest.raises(ValueError, match=r"spectra\.csv does not match"):
        Analysis.load(folder)
    assert [p.name for p in folder.glob(".*")] == [".lock"]  # no temporary files left behind


def test_analysing_very_many_heads_warns_about_size(monkeypatch):
    import headlab.analysis.similarity

    monkeypatch.setattr(headlab.analysis.similarity, "LARGE_SIMILARITY_ROWS", 16)
    with pytest.warns(UserWarning, match=r"2 layers of 4 heads give a similarity table of 32 rows"):
        analyze(GPT(preset("tiny", "mha")))


# ---- numbers are checked where they enter ------------------------------------------------------------

def test_10_reproduce_steps_0_is_refused_not_read_as_the_default(monkeypatch, capsys):
    import headlab.study

    calls = []
    monkeypatch.setattr(headlab.study.Study, "train", lambda *a, **k: calls.append(k))
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--preset", "tiny", "--steps", "0"])
    assert exit_.value.code == 2 and calls == []
    assert "--steps: 0 is invalid: must be a positive integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"steps = 0 is invalid"):
        headlab.study.Study("tiny", 0, Path("unused"))


def test_10_info_refuses_a_negative_context(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["info", "--context", "-5"])
    assert exit_.value.code == 2 and "--context: -5 is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("make", [
    lambda: ModelConfig(rope_base=float("nan")), lambda: ModelConfig(rope_base=float("inf")),
    lambda: TrainConfig(grad_clip=float("nan")), lambda: TrainConfig(weight_decay=float("inf")),
    lambda: TrainConfig(lr=float("nan")), lambda: TrainConfig(grad_clip=0.0), lambda: TrainConfig(seed=-1),
    lambda: TrainConfig(steps=True), lambda: TrainConfig(device="gpu0"), lambda: TrainConfig(device="meta")])
def test_10_non_finite_and_out_of_range_numbers_are_refused_at_construction(make):
    with pytest.raises(ValueError, match=r"(ModelConfig|TrainConfig)\.\w+ = .* is invalid"):
        make()



# ---- the command line: one line, exit status 2, for every user mistake ------------------------------------

def _cli_error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("headlab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_cli_user_mistakes_give_one_line_and_status_2(tmp_path, capsys, isolated_cache):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2}))
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "not a readable safetensors file" in _cli_error(capsys, "analyze", str(broken), "--out", str(tmp_path / "a"))
    sharded = _gpt2_folder(tmp_path / "sharded", 2, 2)
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"h.0.attn.c_attn.weight": "gone.safetensors"}}))
    assert "gone.safetensors is missing" in _cli_error(capsys, "analyze", str(sharded), "--out", str(tmp_path / "a"))
    one_d = tmp_path / "one-d"
    _gpt2_folder(one_d, 1, 2, layers_on_disk=1)
    save_file({"h.0.attn.c_attn.weight": torch.ones(48), "h.0.attn.c_proj.weight": torch.ones(16, 16)},
              str(one_d / "model.safetensors"))
    assert "shapes of a gpt2 layer" in _cli_error(capsys, "analyze", str(one_d), "--out", str(tmp_path / "a"))
    missing_tensor = _gpt2_folder(tmp_path / "missing-tensor", 1, 2, layers_on_disk=1)
    save_file({"h.0.attn.c_attn.weight": torch.ones(16, 48)}, str(missing_tensor / "model.safetensors"))
    assert "h.0.attn.c_proj.weight' not found" in _cli_error(capsys, "analyze", str(missing_tensor), "--out",
                                                             str(tmp_path / "a"))
    assert "No such file" in _cli_error(capsys, "info", "--config", str(tmp_path / "none.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "JSON object" in _cli_error(capsys, "info", "--config", str(tmp_path / "list.json"))
    (tmp_path / "a-file").write_text("")
    common = ["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "2", "--no-progress"]
    assert "a file is in the way" in _cli_error(capsys, *common, "--out", str(tmp_path / "a-file" / "run"))
    assert "takes no option(s) max_chars" in _cli_error(capsys, *common, "--max-chars", "100")
    if not torch.cuda.is_available():
        assert "no CUDA device" in _cli_error(capsys, *common, "--device", "cuda")
    with pytest.raises(ValueError):
        main([*common, "--max-chars", "100", "--debug"])


def test_cli_help_describes_every_command_and_flag(capsys):
    for command in ("info", "train", "analyze", "reproduce"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        flags = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
        assert flags and text.split("\n\n")[1].strip()  # a description under the usage
        body = text.split("options:")[1]
        for flag in flags:  # every flag is followed by help text on its line or the next one
            after = body.split(flag, 1)[1].split("\n  -")[0]
            assert len(after.split()) >= 2, (command, flag)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{adamw,muon}" in text and "{float32,bfloat16}" in text
    assert f"cpu-small: {train_preset('cpu-small').steps}" in text


def test_info_defaults_to_the_same_preset_as_train_and_reproduce(capsys):
    assert main(["info", "--attention", "mha", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == headlab.model.count_parameters(preset("cpu-small"))["total"]


def test_cli_analyze_lists_models_in_family_order_not_glob_order(tmp_path, capsys):
    torch.manual_seed(0)
    folders = [write_run(tmp_path / name, GPT(preset("tiny", attention)))
               for name, attention in (("a-mqa", "mqa"), ("b-gqa", "gqa"), ("c-mha", "mha"))]
    assert main(["analyze", *map(str, folders), "--out", str(tmp_path / "analysis")]) == 0
    assert Analysis.load(tmp_path / "analysis").models == ["Standard MHA", "MQA", "GQA (2 KV heads)"]
