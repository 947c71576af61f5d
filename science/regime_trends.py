"""The regime study's trends: λ₁ of Standard MHA at L = 0 against a numeric axis, fitted log-linearly and
extended to the paper's setting with a prediction interval, and the page's figure."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from regime_axes import AXES, DEFAULT_POINT, PAPER, SEED_MHA_EARLY, Axis

from headlab.io import atomic_write_bytes, make_folder


@dataclass(frozen=True)
class Trend:
    """λ₁ = a + b·log₂(x) fitted to the MHA early-layer values of one axis's seeds."""

    axis: str
    x: str
    slope: float
    slope_se: float
    intercept: float
    residual_sd: float
    n: int
    x_mean: float
    sxx: float

    @property
    def clear(self) -> bool:
        """Whether the slope is at least twice its standard error: a trend worth extending."""
        return self.n > 3 and abs(self.slope) > 2 * self.slope_se

    def predict(self, x: float) -> tuple[float, float]:
        """The fitted value at x and the half-width of its 95% prediction interval (Student t)."""
        from scipy.special import stdtrit

        u = math.log2(x)
        se = self.residual_sd * math.sqrt(1 + 1 / self.n + (u - self.x_mean) ** 2 / self.sxx)
        return self.intercept + self.slope * u, float(stdtrit(self.n - 2, 0.975) * se)


def trend(axis: Axis, finals: pd.DataFrame) -> Trend | None:
    runs = finals[finals["point"].isin(axis.points) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    return None if axis.x is None else fitted_trend(axis.name, axis.x, runs)


def fitted_trend(name: str, x: str, runs: pd.DataFrame) -> Trend | None:
    """The log-linear fit of `runs`' λ₁ on column x (None with under four runs, three settings or x spanning
    under 2x). λ₁ ≥ 1 always (the eigenvalues of a 6 x 6 cosine matrix average 1), so a fit is read as a
    trend only, never as a value below 1."""
    runs = runs[runs[x] > 0]  # a log-scale trend has no place for a setting of 0 (no weight decay)
    if len(runs) < 4 or runs[x].nunique() < 3 or runs[x].max() < 2 * runs[x].min():
        return None  # two settings, or less than a doubling, say nothing about the shape of a trend
    u, y = np.log2(runs[x].to_numpy(dtype=float)), runs["lambda1"].to_numpy()
    sxx = float(((u - u.mean()) ** 2).sum())
    slope = float(((u - u.mean()) * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * u.mean())
    residual_sd = float(np.sqrt(((y - intercept - slope * u) ** 2).sum() / (len(y) - 2)))
    return Trend(name, x, slope, residual_sd / math.sqrt(sxx), intercept, residual_sd, len(y),
                 float(u.mean()), sxx)


def largest_move(finals: pd.DataFrame, axes: list[Axis] = AXES) -> tuple[Axis, float]:
    """The axis whose points move MHA's early-layer λ₁ (mean over seeds) the most, and by how much."""
    moves = []
    for axis in axes:
        means = [finals[(finals["point"] == f) & (finals["role"] == "MHA") & (finals["layer"] == 0)]["lambda1"].mean()
                 for f in axis.points]
        means = [m for m in means if not math.isnan(m)]
        moves.append((axis, max(means) - min(means) if len(means) > 1 else 0.0))
    return max(moves, key=lambda item: item[1])


def draw_figure(finals: pd.DataFrame, path: Path) -> str:
    """MHA's early-layer λ₁ against the numeric axis that moves it most (left) and every axis's
    points side by side (right), the seed figure's 5.0 marked; returns the sentence on the trend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = [a for a in AXES if a.x is not None]
    trends = {a.name: t for a in numeric if (t := trend(a, finals)) is not None}
    best = largest_move(finals, numeric)[0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.3]})
    mha = finals[(finals["role"] == "MHA") & (finals["layer"] == 0)]
    runs = mha[mha["point"].isin(best.points)]
    left.scatter(runs[best.x], runs["lambda1"], color="tab:blue", label="Standard MHA, one seed each", zorder=3)
    means = runs.groupby(best.x)["lambda1"].mean()
    left.plot(means.index, means.to_numpy(), color="tab:blue")
    left.axhline(SEED_MHA_EARLY, color="black", ls="--", label="seed figure (paper, 128M): 5.0")
    left.axhline(1.0, color="grey", ls=":", label="no shared direction (λ₁ = 1)")
    init = float(mha["lambda1_init"].mean())
    left.axhline(init, color="tab:green", ls="-.", lw=0.8, label=f"random initialisation: {init:.2f}")
    sentence = (f"the numeric setting that moves λ₁ most, {best.name}, has {runs[runs[best.x] > 0][best.x].nunique()} "
                "values above 0 and a log-scale trend needs three, so it is not extended to the paper's scale")
    t = trends.get(best.name)
    if t is not None and best.x in PAPER:
        grid_x = np.geomspace(runs[best.x].min(), PAPER[best.x], 60)
        fit = [t.predict(x) for x in grid_x]
        if t.clear:
            centre, half = t.predict(PAPER[best.x])
            doublings = math.log2(PAPER[best.x] / runs[best.x].max())
            left.plot(grid_x, [f[0] for f in fit], color="tab:red", ls="-.", label="log-linear fit, extended")
            left.fill_between(grid_x, [f[0] - f[1] for f in fit], [f[0] + f[1] for f in fit], color="tab:red",
                              alpha=0.15, label="95% prediction interval")
            left.axvline(PAPER[best.x], color="tab:red", lw=0.8)
            sentence = (f"{best.name}: λ₁ = {t.intercept:.2f} + {t.slope:.3f}·log₂({best.x}) (slope ± {t.slope_se:.3f} "
                        f"se, {t.n} runs); at the paper's {best.x} = {PAPER[best.x]:,.0f} it predicts "
                        f"{centre:.2f} ± {half:.2f} (95% prediction interval), a {doublings:.0f}-doubling "
                        "extrapolation")
        else:
            sentence = (f"{best.name}: slope {t.slope:.3f} ± {t.slope_se:.3f} (se) per doubling over {t.n} runs, "
                        "under twice its standard error: no trend to extend to the paper's setting")
    if runs[best.x].min() > 0:
        left.set_xscale("log", base=2)
    else:  # a setting of 0 (no weight decay) sits at 0, linear up to the smallest other setting
        left.set_xscale("symlog", base=2, linthresh=runs[runs[best.x] > 0][best.x].min())
    left.set_xlabel(best.x.replace("_", " ") + " (log scale" + (")" if runs[best.x].min() > 0 else ", 0 at 0)"))
    left.set_ylabel("first eigenvalue λ₁, uncentred, L = 0")
    left.set_title(f"The numeric setting that moves λ₁ most:\n{best.name}", fontsize=10)
    left.legend(fontsize=7, loc="center right")
    labels, values, colours = ["default (make demo's recipe)"], [mha[mha["point"] == DEFAULT_POINT]["lambda1"]], \
        ["tab:orange"]
    for axis in AXES:
        for folder, value in axis.points.items():
            point = mha[mha["point"] == folder]["lambda1"]
            if len(point) and folder != DEFAULT_POINT:
                labels.append(f"{axis.name}: {value}")
                values.append(point.to_numpy())
                colours.append("tab:blue")
    for i, (v, c) in enumerate(zip(values, colours)):
        right.scatter(v, [i] * len(v), color=c, s=14)
        right.plot([v.mean()] * 2, [i - 0.2, i + 0.2], color=c)
    right.axvline(SEED_MHA_EARLY, color="black", ls="--")
    right.axvline(1.0, color="grey", ls=":")
    right.axvline(init, color="tab:green", ls="-.", lw=0.8)
    right.set_yticks(range(len(labels)), labels, fontsize=7)
    right.invert_yaxis()
    right.text(SEED_MHA_EARLY, len(labels) - 0.55, "seed figure ", fontsize=7, ha="right")
    right.text(init, len(labels) - 0.55, " random init", fontsize=7, color="tab:green")
    right.set_xlabel("λ₁ of Standard MHA, L = 0 (dots: seeds, bar: mean)")
    right.set_title("Every point, each differing from the default in one setting")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    make_folder(path.parent)
    atomic_write_bytes(path, buffer.getvalue())
    return sentence


def trend_lines(axis: Axis, finals: pd.DataFrame) -> list[str]:
    """The log-linear trend of MHA's λ₁ at L = 0 along a numeric axis, extended to the paper's setting
    with a 95% prediction interval where the slope is clear of its noise; nothing where no trend is fitted."""
    t = trend(axis, finals)
    if t is None:
        return []
    line = (f"Trend (MHA, L = 0, every seed): λ₁ = {t.intercept:.2f} + {t.slope:.3f}·log₂({axis.x}), slope ± "
            f"{t.slope_se:.3f} (se), {t.n} runs")
    if not t.clear:
        return [line + "; the slope is under twice its standard error: no trend to extend.", ""]
    if axis.x not in PAPER:
        return [line + ".", ""]
    centre, half = t.predict(PAPER[axis.x])
    return [line + f"; at the paper's {axis.x} = {PAPER[axis.x]:,.0f} it predicts {centre:.2f} ± {half:.2f} (95% "
            "prediction interval; λ₁ cannot fall below 1).", ""]


def extended_trends(finals: pd.DataFrame) -> str:
    """A sentence on every numeric axis whose trend is clear of its noise, extended to the paper's setting."""
    clear = [(axis, t) for axis in AXES if axis.x in PAPER and (t := trend(axis, finals)) is not None and t.clear]
    if not clear:
        return ""
    said = [f"{axis.name} ({axis.x} = {PAPER[axis.x]:,.0f}): {centre:.2f} ± {half:.2f}"
            for axis, t in clear for centre, half in [t.predict(PAPER[axis.x])]]
    return (" The trends clear of their noise, extended under Muon to the paper's setting (95% prediction "
            f"intervals): {'; '.join(said)}, against the seed figure's {SEED_MHA_EARLY:.1f}.")
