"""Figures of the head-similarity study: tidy tables in, `matplotlib.figure.Figure` out.

    fig = spectra_figure(analysis.spectra)                       # the flagship figure (uncentered)
    save_figure(fig, manifest, "figures/spectra")                # PNG, listed in the folder's manifest
    save_figure(fig, manifest, "figures/spectra", svg=True)      # PNG and SVG (vector, for print)

Every function is pure: it reads tables with the columns of `headlab.analysis` (see each
docstring), keeps one circuit (`"qk"` unless told), and returns a new Figure that pyplot does
not track, so nothing is shown or left open and no global style changes. The figure is a
`NotebookFigure`: in Jupyter, Colab or VS Code it displays itself once, as a PNG, whether or not
`%matplotlib inline` was run (a plain Figure made without pyplot shows only its repr text there).

Methods look the same in every figure. `method_order` puts a table's models in the order of the
paper's figures by their role column (`headlab.schema.ROLES`: Standard MHA, LRKV by ascending
rank, MQA, MLA, GQA), never by parsing a label, then any model without a role (a pretrained
model, say) in the order first seen. `palette` (module `colours`) gives each method the colour of
its role, or outside a study of its attention family, never of its place in a figure, and a
marker that goes with the colour: a figure of some methods, or a new family, moves no method's
colour. A figure takes its colours from its table's role column (`table_palette`) unless given
`palette=`: a model without a role takes a spare colour, so pass one palette of every model to
each call where two models share no role (the widgets do this).

A table with a `seed` column holding several seeds is drawn as the mean over seeds with a
min–max band (error bars in `loss_vs_cache_figure`); every title says how many seeds it shows.
A table must hold one `mla_rope` setting (see `headlab.analysis`): filter it first.

Modules: `style` (titles, sizes, saving), `colours` (the palette: colours, markers), `methods` (order), `checks`
(a figure's table checked), `panels` (layer panels, lines, legend, titles), and the figures:
`spectra`, `heatmaps`, `training`, `cache`, `sweep`, `real_checkpoints`.
"""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): `plots.spectra_figure` imports headlab.report.plots.spectra only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.report.plots.style": ("BAND", "CIRCUIT_TITLES", "HEATMAP_CMAP", "HIGHLIGHT_COLOR", "KIND_TITLES",
                                   "MARKERS", "MEASURE_TITLES", "MLA_ROPE_TITLES", "PANEL_SIZE", "REFERENCE_COLOR",
                                   "SINGLE_SIZE", "SPECTRA_TITLE", "NotebookFigure", "figure_files", "save_figure"),
    "headlab.report.plots.colours": ("palette",),
    "headlab.report.plots.methods": ("method_order", "table_methods", "table_palette"),
    "headlab.report.plots.panels": ("layer_roles", "layer_title"),
    "headlab.report.plots.real_checkpoints": ("real_checkpoint_spectra",),
    "headlab.report.plots.spectra": ("cumulative_variance_figure", "effective_rank_figure", "measures_figure",
                                     "spectra_figure"),
    "headlab.report.plots.heatmaps": ("similarity_heatmaps",),
    "headlab.report.plots.training": ("factor_norm_figure", "loss_curves_figure", "rank_through_training_figure",
                                      "views_through_training_figure"),
    "headlab.report.plots.cache": ("decode_latency_figure", "loss_vs_cache_figure"),
    "headlab.report.plots.sweep": ("sweep_figure",),
})
