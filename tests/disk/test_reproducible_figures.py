"""Two clean runs of the same study write the same bytes: a figure saved twice (`save_figure`,
asked for SVG too) gives the same PNG and SVG, with no date in the SVG and its element ids hashed
from its content with a fixed salt, not a random one."""

from pathlib import Path

from matplotlib.figure import Figure

from headlab.io import writing
from headlab.report.plots.style import save_figure


def drawn() -> Figure:
    """A figure whose SVG has ids (clip paths, a filled band, markers, text)."""
    figure = Figure(figsize=(3, 2))
    axes = figure.subplots()
    axes.fill_between([0, 1, 2], [0, 1, 0], [1, 2, 2], alpha=0.3)
    axes.plot([0, 1, 2], [1, 0, 2], marker="o", label="a")
    axes.legend()
    axes.set_title("spectra")
    return figure


def saved(folder: Path) -> dict[str, bytes]:
    with writing(folder, "figures.json", "a figures folder", "figure writer") as manifest:
        save_figure(drawn(), manifest, "figures/spectra", svg=True)
    return {suffix: manifest.read_bytes(f"figures/spectra{suffix}") for suffix in (".png", ".svg")}


def test_a_figure_saved_in_two_runs_is_byte_identical(tmp_path):
    first, second = saved(tmp_path / "first"), saved(tmp_path / "second")
    assert first == second
    assert b"clip-path" in first[".svg"] and b"<dc:date>" not in first[".svg"]  # ids to salt, and no date
