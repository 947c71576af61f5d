"""The figures of science/real_checkpoints.md: the real checkpoints' panels beside the seed figure, their
λ₁ and effective rank through depth, and our six methods at the paper's layout (cpu-deep) beside the
seed figure as it is drawn."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from headlab.io import atomic_write_bytes, make_folder  # noqa: E402
from headlab.report.plots.colours import ROLE_MARKERS, colour_of  # noqa: E402
from headlab.report.plots.real_checkpoints import real_checkpoint_spectra  # noqa: E402
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA  # noqa: E402
from headlab.study.seed_distance import at_seed_heads, resampled  # noqa: E402

PANELS = ("Early", "Middle", "Late")
ROLE_LABELS = {"mha": "Standard MHA", "lrkv-small": "LRKV (r=16)", "lrkv-large": "LRKV (r=64)", "mqa": "MQA",
               "mla": "MLA", "gqa": "GQA"}


def saved(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)  # a no-op for a figure pyplot does not track (the package's)
    make_folder(path.parent)
    atomic_write_bytes(path, buffer.getvalue())


def real_panels(spectra: pd.DataFrame, models: pd.DataFrame, path: Path) -> None:
    """`real_checkpoint_spectra` (the package's figure, which notebook 05 shows too), saved."""
    saved(real_checkpoint_spectra(spectra, models), path)


def real_depth(summary: pd.DataFrame, models: pd.DataFrame, path: Path) -> None:
    """λ₁ at six heads (left) and the uncentred effective rank (right) through depth, both views, with the
    random Gaussian baseline, the family's seed curve's λ₁ and Table 3 value; colour by model, line by view."""
    role = dict(zip(models["model"], models["role"]))
    rows = summary[summary["kind"] == "uncentered"]
    lines = {("weights", "trained"): ("-", 2.2), ("data-aware", "trained"): ("--", 2.0),
             ("weights", "gaussian"): (":", 1.3)}
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=1.15):
        fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.6))
        for model in models["model"]:
            colour = colour_of(role[model])
            for (view, state), (ls, width) in lines.items():
                here = rows[(rows["model"] == model) & (rows["measure"] == view) & (rows["state"] == state)]
                means = here.groupby("layer")[["lambda1", "er_pct", "n_heads"]].mean()
                depth = means.index / means.index.max()
                left.plot(depth, [at_seed_heads(v, int(h)) for v, h in zip(means["lambda1"], means["n_heads"])],
                          color=colour, ls=ls, lw=width)
                if view == "weights":
                    right.plot(depth, means["er_pct"], color=colour, ls=ls, lw=width)
            seed = [resampled(SEED_SPECTRA[role[model]][panel].eigenvalues())[0] for panel in PANELS]
            left.plot([PAPER_PANELS[p] / 11 for p in PANELS], seed, color=colour, ls="none", marker="o", mfc="none",
                      ms=9, mew=2)
            right.plot([1.0], [PAPER[role[model]].uncentered], color=colour, marker="o", mfc="none", ms=9, mew=2,
                       clip_on=False)
        left.axhline(1.0, color="0.5", lw=0.8)
        left.set(xlabel="relative depth (layer / last layer)", ylabel="λ₁ at six heads: 1 + 5(λ₁ − 1)/(H − 1)",
                 title="First eigenvalue through depth, on the seed's scale")
        right.set(xlabel="relative depth (layer / last layer)", ylabel="effective rank, % of H (uncentred)",
                  title="Weights view: effective rank through depth")
        handles = [Line2D([], [], color=colour_of(role[m]), lw=3, label=m) for m in models["model"]]
        handles += [Line2D([], [], color="0.3", ls="-", lw=2.2, label="weights view"),
                    Line2D([], [], color="0.3", ls="--", lw=2, label="data-aware view"),
                    Line2D([], [], color="0.3", ls=":", lw=1.3, label="weights view, random Gaussian weights"),
                    Line2D([], [], color="0.3", ls="none", marker="o", mfc="none", ms=9, mew=2,
                           label="the family's seed figure λ₁ (sum 6; L = 0, 6, 11 of 12) and Table 3 (right)")]
        fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=10, bbox_to_anchor=(0.5, -0.1))
        fig.tight_layout()
        saved(fig, path)


def paper_layout(spectra: dict[str, pd.DataFrame], path: Path) -> None:
    """The seed figure as its description draws it (top row), then each cpu-deep recipe's six methods at
    L = 0 / 6 / 11 (mean over seeds, min–max band), their step-0 spectra dashed and the seed's λ₁ as bars;
    every row of a column on the seed's own axis (its y-range, widened only if ours exceed it)."""
    rows = ["seed figure (paper 128M, Fig. 11, read off)", *spectra]
    tops = {"Early": 5.2, "Middle": 2.6, "Late": 4.1}
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=1.1):
        fig, axes = plt.subplots(len(rows), 3, figsize=(15, 4.2 * len(rows)), sharex=True)
        x = np.arange(1, 7)
        for col, panel in enumerate(PANELS):
            for role, label in ROLE_LABELS.items():
                colour = colour_of(role)
                axes[0, col].plot(x, SEED_SPECTRA[role][panel].eigenvalues(), color=colour,
                                  marker=ROLE_MARKERS[colour], lw=2, label=label)
            for row, (title, table) in enumerate(spectra.items(), start=1):
                ax = axes[row, col]
                for role, label in ROLE_LABELS.items():
                    colour = colour_of(role)
                    for state, ls, width in (("trained", "-", 2.0), ("init", "--", 0.9)):
                        here = table[(table["role"] == role) & (table["panel"] == panel) & (table["state"] == state)]
                        if here.empty:
                            continue
                        values = here[[f"l{i}" for i in x]]
                        ax.plot(x, values.mean(), color=colour, ls=ls, lw=width,
                                marker=ROLE_MARKERS[colour] if state == "trained" else None)
                        if state == "trained":
                            ax.fill_between(x, values.min(), values.max(), color=colour, alpha=0.12)
                    ax.plot([0.8, 1.2], [SEED_SPECTRA[role][panel].first] * 2, color=colour, lw=3)
                tops[panel] = max(tops[panel], float(table[table["panel"] == panel]["l1"].max()) * 1.05)
                ax.set_title(f"{title} · {panel} (L={PAPER_PANELS[panel]})", fontsize=11)
            axes[0, col].set_title(f"{rows[0]} · {panel} Layer (L={PAPER_PANELS[panel]})", fontsize=11)
            for ax in axes[:, col]:
                ax.set_ylim(0, tops[panel])
                ax.set_xticks(x)
            axes[-1, col].set_xlabel("Eigenvalue Index")
        for ax in axes[:, 0]:
            ax.set_ylabel("Eigenvalue")
        handles = [Line2D([], [], color=colour_of(r), marker=ROLE_MARKERS[colour_of(r)], lw=2, label=lab)
                   for r, lab in ROLE_LABELS.items()]
        handles += [Line2D([], [], color="0.3", ls="--", lw=0.9, label="ours at step 0 (random init)"),
                    Line2D([], [], color="0.3", lw=3, label="seed figure's λ₁ (bar at index 1)")]
        fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=11, bbox_to_anchor=(0.5, -0.03))
        fig.suptitle("Eigenvalue spectra of head similarity matrices (uncentred, weights view): the seed figure, and "
                     "ours at its layout\n(cpu-deep: 12 layers x 6 heads, our LRKV ranks 2 and 8 for its 16 and 64; "
                     "mean of seeds, band min–max)", fontsize=13)
        fig.tight_layout(rect=(0, 0.03, 1, 0.98))
        saved(fig, path)
