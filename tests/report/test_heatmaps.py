"""The similarity heatmaps of headlab.report.plots on small synthetic tables (split from test_plots):
every label inside its axes and apart, empty cells dropped, heads numbered on the outer edges,
cell values legible on dark cells, the attention maps' measure named."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from test_plots import FIGURE_ORDER, METHODS, TAB10, synthetic_tables

from headlab.report import plots


@pytest.fixture(scope="module")
def tables():
    return synthetic_tables()


def test_similarity_heatmaps(tables):
    fig = plots.similarity_heatmaps(tables["similarity"], layer=2)
    *panels, bar = fig.axes
    assert [ax.get_title() for ax in panels] == FIGURE_ORDER
    assert [to_hex(ax.title.get_color()) for ax in panels] == TAB10
    assert fig.get_suptitle() == "Head similarity matrices, layer L=2 — 1 seed"
    for ax in panels:
        mesh = ax.collections[0]
        assert mesh.get_array().shape == (6, 6)
        assert mesh.get_clim() == (-1, 1)
    assert bar.get_ylim() == (-1, 1)
    assert bar.get_ylabel() == "cosine similarity"
    assert len(fig.axes) == len(METHODS) + 1  # one shared colour bar


def test_attention_map_heatmaps_name_their_measure(tables):
    pattern = tables["similarity"].assign(circuit="pattern")
    fig = plots.similarity_heatmaps(pattern, layer=2, circuit="pattern")
    assert fig.get_suptitle() == "Head similarity matrices, layer L=2 — behaviour view (attention maps), 1 seed"
    assert fig.axes[-1].get_ylabel() == "1 − Jensen–Shannon distance"


def test_similarity_heatmaps_grid_drops_empty_cells(tables):
    similarity = tables["similarity"]
    fig = plots.similarity_heatmaps(similarity[similarity.model != "MQA"], layer=0, annotate=False)
    assert len(fig.axes) == 5 + 1
    assert len(fig.axes[0].collections) == 1  # the cells, no values


def test_heatmap_cells_show_their_values_white_on_dark_cells(tables):
    """Each cell holds the outline of its value to two decimals (centred; "0.00", never "-0.00"),
    white where the cell's colour is dark (relative luminance at most 0.408: the unit diagonal
    among them), dark grey elsewhere."""
    from matplotlib.textpath import TextPath

    from headlab.report.plots.heatmaps import CELL_VALUES, relative_luminance

    ax = plots.similarity_heatmaps(tables["similarity"], layer=2).axes[0]
    mesh, values = ax.collections
    assert values.get_label() == CELL_VALUES
    matrix = np.asarray(mesh.get_array()).reshape(6, 6)
    i, j = np.indices(matrix.shape)
    np.testing.assert_array_equal(values.get_offsets(), np.column_stack([j.ravel() + 0.5, i.ravel() + 0.5]))
    for outline, value in zip(values.get_paths(), matrix.ravel()):
        text = f"{abs(value):.2f}" if abs(value) < 0.005 else f"{value:.2f}"
        expected = TextPath((0, 0), text, size=7).vertices
        assert outline.vertices.shape == expected.shape
        np.testing.assert_allclose(outline.vertices - outline.vertices.min(axis=0), expected - expected.min(axis=0),
                                   atol=1e-9)
        assert abs(outline.get_extents().x0 + outline.get_extents().x1) < 1e-9  # centred across
    white = (values.get_facecolors()[:, :3] == 1).all(axis=1).reshape(6, 6)
    grey = np.isclose(values.get_facecolors()[:, :3], 0.15).all(axis=1).reshape(6, 6)
    dark = relative_luminance(mesh.cmap(mesh.norm(matrix))[..., :3]) <= 0.408
    assert white.diagonal().all() and (white == dark).all() and (grey == ~dark).all() and 0 < dark.sum() < 36


def drawn_boxes(fig) -> tuple[list, list]:
    """The heatmaps' boxes and the box of every visible text of `fig` but its title, in pixels, once drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    texts = [text for text in fig.findobj(matplotlib.text.Text)
             if text.get_visible() and text.get_text() and text is not fig._suptitle]
    return [ax.get_window_extent(renderer) for ax in fig.axes[:-1]], [t.get_window_extent(renderer) for t in texts]


def with_mqa_heads(similarity: pd.DataFrame, n_heads: int) -> pd.DataFrame:
    """`similarity` with MQA's matrices cut to their first `n_heads` heads: methods that do not share their heads."""
    return similarity[(similarity.model != "MQA") | (similarity[["head_i", "head_j"]].max(axis=1) < n_heads)]


@pytest.mark.parametrize("n_methods, mqa_heads", [(1, 6), (2, 6), (5, 6), (6, 6), (6, 4)])
def test_similarity_heatmaps_fixed_layout_keeps_every_label_inside_and_apart(tables, n_methods, mqa_heads):
    """The heatmaps are placed at fixed inches, not by a layout engine: every text lies inside the
    figure (the explorer's PNG crops to the ink it finds within), no two texts overlap, and no
    heatmap overlaps another or a text outside it (the figure's title may be wider than one or two
    heatmaps: the PNG takes it in)."""
    similarity = with_mqa_heads(tables["similarity"], mqa_heads)
    fig = plots.similarity_heatmaps(similarity[similarity.model.isin(list(METHODS)[:n_methods])], layer=1)
    heatmaps, texts = drawn_boxes(fig)
    suptitle = fig._suptitle.get_window_extent()
    inside = [*heatmaps, *texts, *([suptitle] if n_methods > 2 else [])]
    assert all(box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
               for box in inside)
    texts.append(suptitle)
    assert not any(box.overlaps(other) for n, box in enumerate(texts) for other in texts[n + 1:])
    for n, box in enumerate(heatmaps):
        outside = [text for text in texts if not box.contains(*text.get_points().mean(axis=0))]  # not its cell values
        assert not any(box.overlaps(other) for other in heatmaps[n + 1:] + outside)


def test_similarity_heatmaps_number_the_heads_on_the_outer_edges_when_all_share_them(tables):
    similarity = tables["similarity"]
    numbers = lambda axis: [label.get_text() for label in axis.get_ticklabels()]  # noqa: E731
    fig = plots.similarity_heatmaps(similarity, layer=1)  # 6 methods: 2 rows of 3
    heads = [str(h) for h in range(6)]
    assert [numbers(ax.yaxis) == heads for ax in fig.axes[:-1]] == [True, False, False, True, False, False]
    assert [numbers(ax.xaxis) == heads for ax in fig.axes[:-1]] == [False] * 3 + [True] * 3
    assert all(numbers(ax.xaxis) in (heads, []) for ax in fig.axes[:-1])
    fig = plots.similarity_heatmaps(with_mqa_heads(similarity, 4), layer=1)  # every heatmap numbers its own heads
    assert all(numbers(ax.yaxis) and numbers(ax.xaxis) for ax in fig.axes[:-1])
    assert numbers(fig.axes[FIGURE_ORDER.index("MQA")].yaxis) == heads[:4]
