"""headlab.widgets.explore: every control, set programmatically, redraws the figure it should."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib

matplotlib.use("Agg")

import asyncio
import gc
import io
import threading
from types import SimpleNamespace

import ipywidgets as widgets
import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from test_plots import FIGURE_ORDER, TAB10, legend_labels, line_colours, synthetic_tables, synthetic_training

import headlab.report.widgets
from headlab.report.widgets import NO_METHOD, choice_columns, collection_paused, explore, stacked_png

THREE_PANELS = ["Early Layer (L=0)", "Middle Layer (L=2)", "Late Layer (L=3)"]
# The uncentered QK spectra of methods with a role carry the seed figure's λ₁, and the panels name its layers
SEED_PANELS = [f"{panel} · paper L={layer}" for panel, layer in zip(THREE_PANELS, (0, 6, 11))]


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
    assert fig.get_suptitle() == "Eigenvalue spectra of head similarity matrices (uncentered) — 1 seed"
    assert [ax.get_title() for ax in fig.axes] == SEED_PANELS
    assert legend_labels(fig) == [*FIGURE_ORDER, "paper 128M, Fig. 11: λ₁ (read off)"]
    assert list(explorer.children[-2:]) == [explorer.layers, explorer.status] and explorer.status.value == ""


def test_every_control_redraws(explorer):
    seen = [drawn(explorer)]

    def redrawn():
        fig = drawn(explorer)
        assert fig is not seen[-1]
        seen.append(fig)
        return fig

    explorer.kind.value = "centered"
    assert "(centered" in redrawn().get_suptitle()
    explorer.kind.value = "uncentered"
    assert "(uncentered)" in redrawn().get_suptitle()

    explorer.layers.value = (1,)
    assert [ax.get_title() for ax in redrawn().axes] == ["Layer (L=1)"]
    explorer.layers.value = (3,)
    assert [ax.get_title() for ax in redrawn().axes] == [SEED_PANELS[2]]
    explorer.layers.value = (0, 2, 3)
    assert [ax.get_title() for ax in redrawn().axes] == SEED_PANELS
    explorer.layers.value = (2,)
    assert [ax.get_title() for ax in redrawn().axes] == [SEED_PANELS[1]]

    explorer.methods["MQA"].value = False
    fig = redrawn()
    assert "MQA" not in legend_labels(fig)
    assert line_colours(fig.axes[0]) == [c for c, m in zip(TAB10, FIGURE_ORDER) if m != "MQA"]  # colours fixed

    explorer.view.value = "effective rank"
    fig = redrawn()
    assert fig.get_suptitle() == "Effective rank per layer (uncentered) — 1 seed"
    assert "layer 2" in legend_labels(fig)
    explorer.view.value = "cumulative variance"
    assert redrawn().get_suptitle().startswith("Cumulative variance")
    explorer.view.value = "heatmaps"
    fig = redrawn()
    assert fig.get_suptitle() == "Head similarity matrices, layer L=2 — 1 seed"
    assert [ax.get_title() for ax in fig.axes[:-1]] == [m for m in FIGURE_ORDER if m != "MQA"]
    explorer.view.value = "loss curves"
    assert redrawn().get_suptitle() == "Validation loss during training — 1 seed"


def test_heatmaps_for_early_middle_and_late_are_three_figures():
    explorer = explore(synthetic_tables(methods={"Standard MHA": 0.2, "MQA": 0.6}))
    explorer.view.value = "heatmaps"
    assert [fig.get_suptitle() for fig in explorer.figures] == [
        f"Head similarity matrices, layer L={layer} — 1 seed" for layer in (0, 2, 3)]
    assert [ax.get_title() for ax in explorer.figures[0].axes[:-1]] == ["Standard MHA", "MQA"]


def test_no_method_selected_draws_nothing(explorer):
    explorer.view.value = "effective rank"
    for button in explorer.methods.values():
        button.value = False
    assert explorer.figures == []
    assert explorer.figure_bundle() == {"text/plain": NO_METHOD}
    explorer.methods["GQA (3 KV heads)"].value = True
    fig = drawn(explorer)
    assert legend_labels(fig)[:3] == ["GQA (3 KV heads)", "paper 128M, Table 3: mean over layers", "layers 0, 2, 3"]
    assert line_colours(fig.axes[0]) == [TAB10[5]]  # GQA keeps its colour when drawn alone


def test_circuit_control_only_when_there_are_several(tables):
    single = explore(tables)
    assert single.circuit not in single.children
    assert "loss curves" not in single.view.options

    both = {name: pd.concat([t, t.assign(circuit="ov")], ignore_index=True) for name, t in tables.items()}
    explorer = explore(both)
    assert explorer.circuit in explorer.children
    explorer.circuit.value = "ov"
    assert drawn(explorer).get_suptitle().endswith("— OV circuit, 1 seed")


def test_explore_rejects_missing_tables_and_columns(tables):
    with pytest.raises(ValueError, match="missing summary"):
        explore({"similarity": tables["similarity"], "spectra": tables["spectra"]})
    with pytest.raises(ValueError, match="training table is missing column.*model"):
        explore(tables, training=synthetic_training().rename(columns={"model": "label"}))


def test_controls_that_do_nothing_in_a_view_are_disabled(explorer):
    def enabled():
        return {"kind": not explorer.kind.disabled, "layers": not explorer.layers.disabled,
                "circuit": not explorer.circuit.disabled}

    assert enabled() == dict.fromkeys(("kind", "layers", "circuit"), True)
    for view in ("effective rank", "cumulative variance", "spectra"):
        explorer.view.value = view
        assert all(enabled().values()), view
    explorer.view.value = "heatmaps"
    assert enabled() == {"kind": False, "layers": True, "circuit": True}
    explorer.view.value = "loss curves"
    assert not any(enabled().values())
    explorer.view.value = "spectra"
    assert all(enabled().values())


def test_method_checkboxes_show_their_state_and_colour(explorer):
    assert all(isinstance(box, widgets.Checkbox) and box.value for box in explorer.methods.values())
    methods_row = explorer.children[0]
    swatches = [row.children[0].value for row in methods_row.children[1:]]
    assert [explorer.palette[m] in swatch for m, swatch in zip(explorer.methods, swatches)] == [True] * 6


def with_choices(tables):
    """The tables with two more analysis choices, as analysis options add them: the measure of
    every model (shifted so each value draws different lines) and MLA's RoPE (MLA's rows only)."""
    out = {}
    for name, table in tables.items():
        shift = {"eigenvalue": 0.5, "value": 0.5, "effective_rank": 0.5}
        other = table.assign(**{c: table[c] + v for c, v in shift.items() if c in table.columns})
        both = pd.concat([table.assign(measure="frobenius"), other.assign(measure="data")], ignore_index=True)
        mla = both["model"].str.startswith("MLA")
        out[name] = pd.concat([both[~mla].assign(mla_rope=None), both[mla].assign(mla_rope="included"),
                               both[mla].assign(mla_rope="excluded")], ignore_index=True)
    return out


def test_every_analysis_choice_column_gets_a_control_that_filters(tables):
    rich = with_choices(tables)
    assert choice_columns(rich["summary"]) == {"measure": ["frobenius", "data"], "mla_rope": ["included", "excluded"]}
    explorer = explore(rich)
    assert set(explorer.choices) == {"circuit", "measure", "mla_rope"}
    assert [explorer.choices[c].description for c in ("circuit", "measure", "mla_rope")] == ["Circuit", "Measure",
                                                                                             "MLA RoPE"]
    assert explorer.choices["measure"] in explorer.children and explorer.choices["mla_rope"] in explorer.children
    assert explorer.circuit not in explorer.children  # one circuit: nothing to choose

    def first_line(model):
        (ax, *_) = drawn(explorer).axes
        return ax.get_lines()[FIGURE_ORDER.index(model)].get_ydata()

    fig = drawn(explorer)
    assert fig.get_suptitle().endswith("\nweights view, MLA: RoPE part included, 1 seed")
    assert len(line_colours(fig.axes[0])) == 6  # one line per method, not one per choice
    frobenius = first_line("Standard MHA")
    assert [line.get_gid() for line in fig.axes[0].get_lines() if line.get_gid()][:1] == ["seed:Standard MHA"]
    explorer.choices["measure"].value = "data"
    assert drawn(explorer).get_suptitle().endswith("\ndata-aware weights view, MLA: RoPE part included, 1 seed")
    assert first_line("Standard MHA") == pytest.approx(frobenius + 0.5)
    assert not [line for line in drawn(explorer).axes[0].get_lines() if line.get_gid()]  # the paper's are weights
    explorer.choices["mla_rope"].value = "excluded"
    assert len(line_colours(drawn(explorer).axes[0])) == 6  # models without the choice stay drawn
    explorer.view.value = "effective rank"
    assert drawn(explorer).get_suptitle().endswith("\ndata-aware weights view, MLA: latent only (RoPE part excluded), "
                                                   "1 seed")


def test_layer_menu_names_each_depth_once(tables):
    def menu(layers):
        summary = tables["summary"][tables["summary"]["layer"].isin(layers)]
        return [label for label, _ in explore({**tables, "summary": summary}).layers.options]

    assert menu([0, 1, 2, 3]) == ["early, middle and late (L=0, 2, 3)", "Early Layer (L=0)", "Layer (L=1)",
                                  "Middle Layer (L=2)", "Late Layer (L=3)"]
    assert menu([0, 1]) == ["early and late (L=0, 1)", "Early Layer (L=0)", "Late Layer (L=1)"]
    assert menu([0]) == ["Early Layer (L=0)"]


def test_displayed_explorer_is_its_controls_and_a_png_output_each_redraw_updates(explorer, monkeypatch):
    shown, updates = [], []
    monkeypatch.setattr(headlab.report.widgets, "display", lambda bundle, **options: shown.append((bundle, options)))
    monkeypatch.setattr(explorer.figure_display, "update", lambda bundle, **options: updates.append(bundle))
    explorer.kind.value = "centered"
    assert updates == []  # nothing to update before it is displayed
    explorer._ipython_display_()
    (controls, _), (figure, options) = shown
    assert "application/vnd.jupyter.widget-view+json" in controls and "image/png" not in controls
    assert options["display_id"] == explorer.figure_display.display_id  # what update() replaces
    assert figure["text/plain"] == "headlab explorer: spectra of 6 methods"
    one = figure["image/png"]
    assert one.startswith(b"\x89PNG")
    explorer.view.value = "heatmaps"  # early, middle and late: three figures, one PNG
    assert len(explorer.figures) == 3
    three = updates[-1]["image/png"]
    height = {png: matplotlib.image.imread(io.BytesIO(png)).shape[0] for png in (one, three)}
    assert height[three] > 2 * height[one] and three != one
    for box in explorer.methods.values():
        box.value = False
    assert updates[-1] == {"text/plain": NO_METHOD}


def test_the_png_stacks_the_figures_each_cropped_to_what_it_draws():
    margin = headlab.report.widgets.CROP_MARGIN
    small, wide = Figure(figsize=(4, 3), facecolor="white"), Figure(figsize=(6, 3), facecolor="white")
    small.text(0.5, 0.5, "small", fontsize=20)
    wide.text(0.1, 0.5, "a wider drawing", fontsize=20)
    one = matplotlib.image.imread(io.BytesIO(stacked_png([small])))
    ink = (one < 1).any(axis=2)
    rows, columns = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    assert (rows[0], columns[0]) == (margin, margin) and one.shape[1] < 400 / 3  # the text, not the figure
    assert (rows[-1], columns[-1]) == (one.shape[0] - 1 - margin, one.shape[1] - 1 - margin)
    two = matplotlib.image.imread(io.BytesIO(stacked_png([small, wide])))
    assert np.array_equal(two[:one.shape[0], :one.shape[1]], one) and (two[:one.shape[0], one.shape[1]:] == 1).all()
    assert two.shape[1] > one.shape[1] and (two[one.shape[0]:] < 1).any()


def test_the_png_holds_what_a_figure_draws_past_its_edges():
    narrow = Figure(figsize=(2, 1), facecolor="white")
    narrow.text(0.1, 0.5, "a title far wider than its figure", fontsize=20)
    image = matplotlib.image.imread(io.BytesIO(stacked_png([narrow])))
    assert image.shape[1] > 2 * narrow.dpi and (image[:, -headlab.report.widgets.CROP_MARGIN:] == 1).all()


def counting_draws(explorer, monkeypatch) -> list:
    """The method lists `explorer` draws figures for, from now on, one entry per draw."""
    draws, draw = [], explorer._draw
    monkeypatch.setattr(explorer, "_draw", lambda chosen: draws.append(chosen) or draw(chosen))
    return draws


def test_changes_in_a_kernel_are_coalesced_into_one_redraw_of_the_latest_state(explorer, monkeypatch):
    """In a kernel (an event loop runs the widget callbacks) clicks that come faster than a
    redraw mark the figure pending; once they settle only the final state is drawn."""
    draws = counting_draws(explorer, monkeypatch)
    before = drawn(explorer)

    async def click_quickly():
        explorer.view.value = "heatmaps"
        explorer.kind.value = "centered"
        explorer.view.value = "effective rank"
        explorer.methods["MQA"].value = False
        assert draws == [] and drawn(explorer) is before  # nothing drawn yet: the figure is pending
        assert explorer.status.value == headlab.report.widgets.PENDING and explorer.kind.disabled is False
        await settled(explorer)

    asyncio.run(click_quickly())
    assert draws == [[m for m in FIGURE_ORDER if m != "MQA"]]  # one draw, of the state the controls ended in
    fig = drawn(explorer)
    assert fig.get_suptitle() == "Effective rank per layer (centered, PCA-based) — 1 seed"
    assert "MQA" not in legend_labels(fig)
    assert explorer.status.value == "" and explorer.pending is None


def test_the_pending_line_stays_until_the_figure_of_the_controls_state_is_shown(explorer, monkeypatch):
    """A click that waits in the kernel's queue while a figure draws is handled after that figure
    is sent: the pending line must not go out between the two (the figure would lag the controls
    with no sign), nor before the figure of the last state is sent."""
    seen = []
    explorer.status.observe(lambda change: seen.append(change["new"] or "cleared"), names="value")
    monkeypatch.setattr(headlab.report.widgets, "display", lambda bundle, **options: None)
    explorer._ipython_display_()

    def update(bundle, **options):
        seen.append(("figure", explorer.shown[0]))
        if explorer.shown[0] == "spectra":  # the click that came while the spectra drew
            asyncio.get_running_loop().call_soon(setattr, explorer.view, "value", "heatmaps")

    monkeypatch.setattr(explorer.figure_display, "update", update)

    async def click():
        explorer.kind.value = "centered"
        await settled(explorer)

    asyncio.run(click())
    pending = headlab.report.widgets.PENDING
    assert seen == [pending, ("figure", "spectra"), ("figure", "heatmaps"), "cleared"]


def second_click_as_the_spectra_are_sent(explorer, monkeypatch, second_click) -> list[int]:
    """In an event loop, click "centered"; as its figure (the spectra) is sent, `second_click()` brings
    the heatmaps. Both figures must be sent, in order, and the pending line must stay until the
    last has had `DRAWN_SECONDS` (by the loop's clock). Returns the threads that sent the figures."""
    clock, events, sent_in = [], [], []
    explorer.status.observe(lambda change: events.append((clock[0](), change["new"] or "cleared")), names="value")
    monkeypatch.setattr(headlab.report.widgets, "display", lambda bundle, **options: None)
    explorer._ipython_display_()

    def update(bundle, **options):
        sent_in.append(threading.get_ident())
        events.append((clock[0](), ("figure", explorer.shown[0])))
        if explorer.shown[0] == "spectra":
            second_click()

    monkeypatch.setattr(explorer.figure_display, "update", update)

    async def click():
        clock.append(asyncio.get_running_loop().time)
        explorer.kind.value = "centered"
        await settled(explorer)

    asyncio.run(click())
    figures = [(t, event) for t, event in events if isinstance(event, tuple)]
    assert [event for _, event in figures] == [("figure", "spectra"), ("figure", "heatmaps")]
    (cleared,) = [t for t, event in events if event == "cleared"]
    assert cleared - figures[-1][0] >= 0.99 * headlab.report.widgets.DRAWN_SECONDS, events
    return sent_in


def test_a_click_soon_after_a_figure_keeps_the_line_until_its_own_figure_has_had_time_to_show(explorer, monkeypatch):
    """A click that comes while the line still shows after a figure (for `DRAWN_SECONDS`): the
    clearing that figure scheduled must not clear the line for the next figure before that one
    has had its own `DRAWN_SECONDS` on the page."""
    second_click_as_the_spectra_are_sent(explorer, monkeypatch, lambda: asyncio.get_running_loop().call_later(
        0.05, setattr, explorer.view, "value", "heatmaps"))


def test_a_change_from_another_thread_waits_for_the_redraw_and_is_drawn_on_the_explorers_loop(explorer, monkeypatch):
    """JupyterLab may hand widget messages to kernel subshells, each a thread with an event loop of its
    own: a change taken in there while the explorer draws must not draw beside it. It is drawn after,
    on the explorer's loop, and the pending line stays until that figure has had `DRAWN_SECONDS`."""
    def in_a_subshell():
        subshell = threading.Thread(target=setattr, args=(explorer.view, "value", "heatmaps"))
        subshell.start()
        subshell.join()

    assert second_click_as_the_spectra_are_sent(explorer, monkeypatch, in_a_subshell) == [threading.get_ident()] * 2


async def settled(explorer) -> None:
    """Wait (in the event loop) until the explorer has drawn the controls' state and cleared its pending line."""
    for _ in range(200):
        await asyncio.sleep(headlab.report.widgets.SETTLE_SECONDS)
        if explorer.pending is None and explorer.status.value != headlab.report.widgets.PENDING:
            return
    raise AssertionError("the explorer never settled")


def test_unticking_every_method_quickly_ends_on_no_figure(explorer, monkeypatch):
    async def untick_all():
        for box in explorer.methods.values():
            box.value = False
        await settled(explorer)

    asyncio.run(untick_all())
    assert explorer.figures == [] and explorer.figure_bundle() == {"text/plain": NO_METHOD}


def test_a_state_shown_before_is_shown_again_without_drawing(explorer, monkeypatch):
    default, bundle = drawn(explorer), explorer.figure_bundle()
    draws = counting_draws(explorer, monkeypatch)
    explorer.kind.value = "centered"  # drawn
    explorer.view.value = "heatmaps"  # drawn
    explorer.view.value = "spectra"  # centered spectra: kept from the first change
    explorer.kind.value = "uncentered"  # the default view: kept from the start
    assert len(draws) == 2 and drawn(explorer) is default and explorer.figure_bundle() is bundle


def test_only_the_last_states_are_kept(explorer, monkeypatch):
    monkeypatch.setattr(headlab.report.widgets, "KEPT_VIEWS", 2)
    default = drawn(explorer)
    draws = counting_draws(explorer, monkeypatch)
    explorer.kind.value = "centered"
    explorer.view.value = "heatmaps"  # two states since the default: it is forgotten
    explorer.view.value, explorer.kind.value = "spectra", "uncentered"
    assert len(draws) == 3 and drawn(explorer) is not default and len(explorer.drawn) == 2


def test_garbage_collection_pauses_while_a_state_is_drawn_and_comes_back_after(explorer, monkeypatch):
    collecting = []
    draw, png = explorer._draw, headlab.report.widgets.stacked_png
    monkeypatch.setattr(explorer, "_draw", lambda chosen: collecting.append(("draw", gc.isenabled())) or draw(chosen))
    monkeypatch.setattr(headlab.report.widgets, "stacked_png",
                        lambda figures: collecting.append(("png", gc.isenabled())) or png(figures))
    explorer.view.value = "effective rank"
    explorer.figure_bundle()
    assert collecting == [("draw", False), ("png", False)] and gc.isenabled()
    gc.disable()  # paused by someone else: stays so
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_redraw_that_fails_in_a_kernel_says_so_below_the_controls(explorer, monkeypatch):
    def broken(chosen):
        raise ValueError("the <summary> table is missing")

    monkeypatch.setattr(explorer, "_draw", broken)
    failures = []

    async def click():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: failures.append(context["exception"]))
        explorer.kind.value = "centered"
        await asyncio.sleep(3 * headlab.report.widgets.SETTLE_SECONDS)

    asyncio.run(click())
    assert explorer.status.value == "<b>redraw failed</b>: ValueError: the &lt;summary&gt; table is missing"
    assert [str(error) for error in failures] == ["the <summary> table is missing"]
