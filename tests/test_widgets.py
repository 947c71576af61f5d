"""headlab.widgets.explore: every control, set programmatically, redraws the figure it should."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from types import SimpleNamespace  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from test_plots import (FIGURE_ORDER, TAB10, legend_labels, line_colours, synthetic_tables,  # noqa: E402
                        synthetic_training)

from headlab.widgets import NO_METHOD, explore  # noqa: E402

THREE_PANELS = ["Early Layer (L=0)", "Middle Layer (L=2)", "Late Layer (L=3)"]


@pytest.fixture(scope="module")
def tables():
    return synthetic_tables()


@pytest.fixture
def explorer(tables):
    return explore(SimpleNamespace(**tables), training=synthetic_training())


def drawn(explorer):
    """The one figure drawn last, after checking that exactly one was."""
    (fig,) = explorer.figures
    return fig


def test_draws_the_flagship_figure_on_creation(explorer):
    fig = drawn(explorer)
    assert fig.get_suptitle().startswith("Eigenvalue spectra of head similarity matrices (centred")
    assert [ax.get_title() for ax in fig.axes] == THREE_PANELS
    assert legend_labels(fig) == FIGURE_ORDER
    assert explorer.children[-1] is explorer.output


def test_every_control_redraws(explorer):
    seen = [drawn(explorer)]

    def redrawn():
        fig = drawn(explorer)
        assert all(fig is not old for old in seen)
        seen.append(fig)
        return fig

    explorer.kind.value = "uncentered"
    assert "(uncentred)" in redrawn().get_suptitle()

    explorer.layers.value = (1,)
    assert [ax.get_title() for ax in redrawn().axes] == ["Layer (L=1)"]
    explorer.layer_buttons["Late"].click()
    assert explorer.layers.value == (3,)
    assert [ax.get_title() for ax in redrawn().axes] == ["Late Layer (L=3)"]
    explorer.layer_buttons["Early"].click()
    assert [ax.get_title() for ax in redrawn().axes] == ["Early Layer (L=0)"]
    explorer.layer_buttons["Middle"].click()
    assert [ax.get_title() for ax in redrawn().axes] == ["Middle Layer (L=2)"]

    explorer.methods["MQA"].value = False
    fig = redrawn()
    assert "MQA" not in legend_labels(fig)
    assert line_colours(fig.axes[0]) == [c for c, m in zip(TAB10, FIGURE_ORDER) if m != "MQA"]  # colours fixed

    explorer.view.value = "effective rank"
    fig = redrawn()
    assert fig.get_suptitle() == "Effective rank per layer (uncentred)"
    assert "layer 2" in legend_labels(fig)
    explorer.view.value = "cumulative variance"
    assert redrawn().get_suptitle().startswith("Cumulative variance")
    explorer.view.value = "heatmaps"
    fig = redrawn()
    assert fig.get_suptitle() == "Head similarity matrices, layer L=2"
    assert [ax.get_title() for ax in fig.axes[:-1]] == [m for m in FIGURE_ORDER if m != "MQA"]
    explorer.view.value = "loss curves"
    assert redrawn().get_suptitle() == "Validation loss during training"


def test_heatmaps_for_early_middle_and_late_are_three_figures():
    explorer = explore(synthetic_tables(methods={"Standard MHA": 0.2, "MQA": 0.6}))
    explorer.view.value = "heatmaps"
    assert [fig.get_suptitle() for fig in explorer.figures] == [
        f"Head similarity matrices, layer L={layer}" for layer in (0, 2, 3)]
    assert [ax.get_title() for ax in explorer.figures[0].axes[:-1]] == ["Standard MHA", "MQA"]


def test_no_method_selected_draws_nothing(explorer, capsys):
    explorer.view.value = "effective rank"
    for button in explorer.methods.values():
        button.value = False
    assert explorer.figures == []
    assert NO_METHOD in capsys.readouterr().out
    explorer.methods["GQA (3 KV heads)"].value = True
    fig = drawn(explorer)
    assert legend_labels(fig)[:2] == ["GQA (3 KV heads)", "layers 0, 2, 3"]
    assert line_colours(fig.axes[0]) == [TAB10[5]]  # GQA keeps its colour when drawn alone


def test_circuit_control_only_when_there_are_several(tables):
    single = explore(tables)
    assert single.circuit not in single.children
    assert "loss curves" not in single.view.options

    both = {name: pd.concat([t, t.assign(circuit="ov")], ignore_index=True) for name, t in tables.items()}
    explorer = explore(both)
    assert explorer.circuit in explorer.children
    explorer.circuit.value = "ov"
    assert drawn(explorer).get_suptitle().endswith("— OV circuit")


def test_explore_rejects_missing_tables_and_columns(tables):
    with pytest.raises(ValueError, match="missing summary"):
        explore({"similarity": tables["similarity"], "spectra": tables["spectra"]})
    with pytest.raises(ValueError, match="training table is missing column.*model"):
        explore(tables, training=synthetic_training().rename(columns={"model": "label"}))
