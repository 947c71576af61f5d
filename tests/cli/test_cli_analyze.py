"""What `headlab analyze` shows: per layer the first eigenvalue λ₁ beside its random-init value and
the effective ranks, read from the tables it wrote; the flagship's three-panel figure (the baseline
dashed, the seed figure's λ₁ marked for the paper's variants only); and the attention-map view
with its own spectrum and effective rank."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import headlab.report.analysis_output
from headlab import load_corpus, preset, train, train_preset
from headlab.analysis.attention_maps import layer_matrices
from headlab.analysis.similarity import Analysis, analyze
from headlab.analysis.snapshots import snapshot_heads
from headlab.analysis.spectrum import clipped_spectrum
from headlab.cli.main import main

RUN = train_preset("tiny", steps=3, batch_size=4, eval_every=3, eval_batches=1, checkpoint_every=3, log_every=3,
                   snapshot_every=3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs with their step-0 snapshots: the comparison variant MQA, and an MHA of 3 heads,
    which stands for none of the paper's variants."""
    corpus = load_corpus("synthetic", n_chars=20_000)
    folder = tmp_path_factory.mktemp("runs")
    train(preset("tiny", "mqa"), RUN, corpus, out=folder / "mqa", progress=False)
    train(preset("tiny", "mha", n_head=3, n_kv_head=3), RUN, corpus, out=folder / "odd", progress=False)
    return folder


@pytest.fixture
def drawn(monkeypatch):
    """The figures analyze saves, kept to be looked at."""
    figures = []
    save = headlab.report.analysis_output.save_figure

    def keep(figure, manifest, name, **options):
        figures.append((name, figure))
        return save(figure, manifest, name, **options)

    monkeypatch.setattr(headlab.report.analysis_output, "save_figure", keep)
    return figures


def printed_column(out: str, model: str, view: str, column: int) -> dict[str, float]:
    """layer -> the value in `column` (from the right: -1 the last) of the block of `model` and `view`."""
    block = out.split(f"{model} · {view} · ", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return {line.split()[0]: float(line.split()[column]) for line in block
            if line.split() and (line.split()[0].isdigit() or line.split()[0] == "mean")}


def test_analyze_prints_first_eigenvalue_beside_its_random_init_value(runs, tmp_path, capsys, drawn):
    assert main(["analyze", str(runs / "mqa"), str(runs / "odd"), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    spectra = Analysis.load(tmp_path / "a").spectra
    for folder, model in (("mqa", "MQA"), ("odd", "Standard MHA")):
        first = spectra.query(f"model == '{model}' and kind == 'uncentered' and index == 1").set_index("layer")
        printed = printed_column(out, model, "qk · frobenius", -2)
        assert printed == {**{str(layer): pytest.approx(value, abs=0.005) for layer, value
                              in first["eigenvalue"].items()}, "mean": pytest.approx(first["eigenvalue"].mean(),
                                                                                     abs=0.005)}
        at_init = analyze(snapshot_heads(runs / folder, 0)).spectra.query("kind == 'uncentered' and index == 1")
        assert [printed_column(out, model, "qk · frobenius", -1)[str(layer)] for layer in at_init["layer"]] == \
            pytest.approx(at_init["eigenvalue"].tolist(), abs=0.005)
        assert not np.allclose(first["eigenvalue"], at_init["eigenvalue"], atol=1e-6)  # trained: the weights moved


def test_analyze_draws_the_flagship_panels_with_baseline_and_the_papers_marks_for_its_variants(runs, tmp_path,
                                                                                               capsys, drawn):
    assert main(["analyze", str(runs / "mqa"), str(runs / "odd"), "--out", str(tmp_path / "a")]) == 0
    listed = json.loads((tmp_path / "a" / "analysis.json").read_text())["files"]
    assert "spectra_uncentered.png" in listed and not any(name.endswith(".svg") for name in listed)  # PNG only
    Analysis.load(tmp_path / "a")  # the figure beside the tables leaves the folder readable
    ((name, figure),) = drawn
    gids = {line.get_gid() for ax in figure.axes for line in ax.lines}
    assert name == "spectra_uncentered" and len(figure.axes) == 2  # tiny: 2 layers, early and late
    assert {"init:MQA", "init:Standard MHA", "seed:MQA"} <= gids and "seed:Standard MHA" not in gids
    assert main(["analyze", str(runs / "mqa"), "--out", str(tmp_path / "b"), "--no-figure"]) == 0
    assert not list((tmp_path / "b").glob("*.png")) and len(drawn) == 1
    capsys.readouterr()
    assert main(["analyze", str(runs / "mqa"), "--out", str(tmp_path / "c"), "--svg"]) == 0
    listed = json.loads((tmp_path / "c" / "analysis.json").read_text())["files"]
    assert {"spectra_uncentered.png", "spectra_uncentered.svg"} <= set(listed)
    assert capsys.readouterr().out.rstrip().endswith("spectra_uncentered.png (and an .svg beside each)")


def test_the_attention_map_view_gets_its_spectrum_and_effective_rank(runs, tmp_path, capsys, drawn):
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 8)
    assert main(["analyze", str(runs / "mqa"), "--attention-maps", "--text", str(text),
                 "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    result = Analysis.load(tmp_path / "a")
    pattern = result.summary[result.summary["circuit"] == "pattern"]
    assert len(pattern) == 2 * 2  # 2 layers x 2 kinds
    for model, layer, matrix in layer_matrices(result.similarity[result.similarity["circuit"] == "pattern"]):
        for kind in ("uncentered", "centered"):
            row = pattern.query(f"layer == {layer} and kind == '{kind}'").iloc[0]
            assert row["effective_rank"] == pytest.approx(clipped_spectrum(matrix, kind)[0].effective_rank)
        first = result.spectra.query(f"circuit == 'pattern' and layer == {layer} and kind == 'uncentered' "
                                     "and index == 1")["eigenvalue"].iloc[0]
        assert printed_column(out, "MQA", "pattern · jensen_shannon (attention maps)", -1)[str(layer)] == \
            pytest.approx(first, abs=0.005)
    assert [name for name, _ in drawn] == ["spectra_uncentered", "spectra_uncentered_pattern"]
    assert pd.api.types.is_float_dtype(result.spectra["eigenvalue"])


@pytest.mark.parametrize("content", ["", " \n\t\n"], ids=["empty", "blank"])
def test_a_text_file_without_text_is_named_in_one_line(runs, tmp_path, capsys, content):
    text = tmp_path / "empty.txt"
    text.write_text(content)
    assert main(["analyze", str(runs / "mqa"), "--measure", "data", "--text", str(text),
                 "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err == f"headlab: error: --text {text}: the file holds no text (the data-aware view and the attention " \
                  "maps are measured on it)\n"
    assert not (tmp_path / "a").exists()
