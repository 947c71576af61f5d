"""A figure is saved as PNG only, unless SVG is asked for (`svg=True`, `--svg` on the command line):
every writer that draws (the report, the README's docs, a sweep's page, analyze's spectra) writes and
lists in its folder's manifest exactly those files, a redraw without SVG leaves no SVG of an earlier
drawing behind, and the committed docs folders hold none. What a figure shows is the plots' tests':
here each is a tiny one, saved for real."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

import headlab.report.analysis_output
import headlab.report.sweep_page
import headlab.report.writer
from headlab.analysis.tables import ANALYSIS, ANALYSIS_MANIFEST
from headlab.cli.main import main
from headlab.cli.parser import parse_arguments
from headlab.io import Manifest
from headlab.report.analysis_output import write_spectra_figures
from headlab.report.sweep_page import write_sweep_report
from headlab.report.writer import DOCS, DOCS_FIGURES, DOCS_MANIFEST, FIGURES, FIGURES_FOLDER, write_docs, write_report
from headlab.study.table_files import MANIFEST, SHIPPED, STUDY, SWEEP, SWEEP_MANIFEST, read_study_tables
from shared_fixtures import TINY_STUDY

ROOT = Path(__file__).resolve().parents[2]


def tiny(*args, **kwargs) -> Figure:
    figure = Figure(figsize=(1, 1))
    figure.add_subplot().plot([0, 1])
    return figure


class TinyFigures:
    """The plots package with every drawing a tiny figure; saving, palettes and file names as they are."""

    def __init__(self, plots):
        self.plots = plots

    def __getattr__(self, name):
        drawing = (name.endswith("_figure") and name != "save_figure") or name == "similarity_heatmaps"
        return tiny if drawing else getattr(self.plots, name)


@pytest.fixture(autouse=True)
def tiny_figures(monkeypatch):
    for module in (headlab.report.writer, headlab.report.sweep_page):
        monkeypatch.setattr(module, "plots", TinyFigures(module.plots))
    monkeypatch.setattr(headlab.report.analysis_output, "spectra_figure", tiny)


@pytest.fixture(scope="module")
def tables():
    return read_study_tables(SHIPPED)


def figures_written(folder: Path, manifest: str, kind: str) -> tuple[set[str], set[str]]:
    """(the figures on disk, those the manifest lists), as names relative to `folder`."""
    listed = Manifest.read(folder, manifest, kind)
    assert not listed.retired and not listed.intended
    on_disk = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.suffix in (".png", ".svg")}
    return on_disk, {name for name in listed.files if name.endswith((".png", ".svg"))}


def expected(pngs: set[str], svg: bool) -> set[str]:
    """`pngs`, and with `svg` an SVG beside each."""
    return pngs | ({name.removesuffix(".png") + ".svg" for name in pngs} if svg else set())


@pytest.mark.parametrize("svg", [False, True], ids=["default", "svg"])
def test_a_report_writes_and_lists_png_only_unless_svg_is_asked_for(tables, tmp_path, svg):
    write_report(tables, tmp_path, **({"svg": True} if svg else {}))
    on_disk, listed = figures_written(tmp_path, MANIFEST, STUDY)
    pngs = {name for name in listed if name.endswith(".png")}
    assert {f"{FIGURES_FOLDER}/{name}.png" for name in FIGURES} < pngs  # and the sections' figures
    assert on_disk == listed == expected(pngs, svg)


@pytest.mark.parametrize("svg", [False, True], ids=["default", "svg"])
def test_docs_a_sweep_page_and_the_spectra_figures_write_png_only_unless_svg_is_asked_for(tables, tmp_path, svg):
    option = {"svg": True} if svg else {}
    write_docs(tables, tmp_path / "docs", **option)
    assert figures_written(tmp_path / "docs", DOCS_MANIFEST, DOCS) == (
        (names := expected({f"{name}.png" for name in DOCS_FIGURES}, svg)), names)
    write_sweep_report(sweep_table(), tmp_path / "sweep", **option)
    assert figures_written(tmp_path / "sweep", SWEEP_MANIFEST, SWEEP) == (
        (names := expected({f"{FIGURES_FOLDER}/sweep.png"}, svg)), names)
    paths = write_spectra_figures(tables["spectra"], tmp_path / "analysis", **option)
    pngs = {path.name for path in paths}
    assert "spectra_uncentered.png" in pngs
    assert figures_written(tmp_path / "analysis", ANALYSIS_MANIFEST, ANALYSIS) == (
        (names := expected(pngs, svg)), names)


def test_report_and_docs_on_the_command_line_write_and_list_an_svg_beside_each_png_with_svg(tmp_path, capsys):
    """(Without --svg: the reproduce test below, test_report's docs test and analyze's and sweep's tests.)"""
    study = Path(shutil.copytree(SHIPPED, tmp_path / "study"))
    assert main(["report", str(study), "--svg"]) == 0
    on_disk, listed = figures_written(study, MANIFEST, STUDY)
    assert on_disk == listed == expected({name for name in listed if name.endswith(".png")}, True)
    assert main(["docs", str(study), "--out", str(tmp_path / "docs"), "--svg"]) == 0
    names = expected({f"{name}.png" for name in DOCS_FIGURES}, True)
    assert figures_written(tmp_path / "docs", DOCS_MANIFEST, DOCS) == (names, names)


def test_every_command_that_draws_takes_svg_off_by_default():
    drawing = {"report": ["DIR"], "docs": ["DIR"], "sweep": [], "reproduce": [], "analyze": ["SOURCE", "--out", "A"]}
    for command, rest in drawing.items():
        assert parse_arguments([command, *rest]).svg is False, command
        assert parse_arguments([command, *rest, "--svg"]).svg is True, command


def test_analyze_refuses_svg_without_a_figure(capsys):
    with pytest.raises(SystemExit):
        parse_arguments(["analyze", "SOURCE", "--out", "A", "--no-figure", "--svg"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_redraw_without_svg_deletes_the_svgs_an_earlier_one_wrote(tables, tmp_path):
    write_report(tables, tmp_path, svg=True)
    assert list((tmp_path / FIGURES_FOLDER).glob("*.svg"))
    write_report(tables, tmp_path)
    on_disk, listed = figures_written(tmp_path, MANIFEST, STUDY)
    assert on_disk == listed and not any(name.endswith(".svg") for name in on_disk)


def test_reproduce_with_svg_lists_both_and_a_report_without_keeps_only_an_svg_the_user_changed(tiny_study, own_cache,
                                                                                               tmp_path):
    study = shutil.copytree(tiny_study, tmp_path / "study", symlinks=True)
    assert main([*TINY_STUDY, "--out", str(study), "--svg"]) == 0  # its runs reused: tables and report redrawn
    on_disk, listed = figures_written(study, MANIFEST, STUDY)
    assert on_disk == listed == expected({name for name in listed if name.endswith(".png")}, True)
    mine = study / FIGURES_FOLDER / "loss_curves.svg"
    mine.write_text("<svg>the user's own drawing</svg>")
    assert main(["report", str(study)]) == 0
    on_disk, listed = figures_written(study, MANIFEST, STUDY)
    assert on_disk - listed == {f"{FIGURES_FOLDER}/{mine.name}"} and not any(name.endswith(".svg") for name in listed)
    assert mine.read_text() == "<svg>the user's own drawing</svg>"  # changed since headlab wrote it: never deleted


@pytest.mark.parametrize("folder", ["docs", "docs/regime"])
def test_the_committed_docs_folders_hold_pngs_only_each_listed_as_it_is(folder):
    docs = ROOT / folder
    manifest = json.loads((docs / DOCS_MANIFEST).read_text())
    assert set(manifest["files"]) == {path.name for path in docs.glob("*.png")} | {"headline.md"}
    assert not list(docs.glob("*.svg"))
    listed = Manifest.read(docs, DOCS_MANIFEST, DOCS)
    for name in listed.files:
        listed.verify(name)


def sweep_table() -> pd.DataFrame:
    """A sweep's table of two grid points and one comparison (`headlab.study.sweep.point_rows`' columns)."""
    return pd.DataFrame([{"point": f"x{length}", "length": length, "steps": 4 * length, "n_layer": 2, "role": "mqa",
                          "comparison": "MQA", "mla_rope": "included", "metric": "validation loss",
                          "unit": "nats/byte", "mean": 0.1, "half_width": 0.05, "seeds": 2, "margin": 0.02,
                          "verdict": "higher"} for length in (1, 2)])
