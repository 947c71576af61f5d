"""The methods a figure draws: their order (by role), a colour and a marker for each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from headlab.report.plots.style import MARKERS
from headlab.schema import role_order


def method_order(models: Iterable[str], roles: Iterable[str] | None = None) -> list[str]:
    """The distinct `models` (a table's model column) in figure order: by their `roles` (the
    table's role column, when it has one) in the order of `headlab.schema.ROLES`, then any model
    without a comparison role (a pretrained model, say) in the order first seen. Without roles,
    the order first seen: a table lists its models in the order they were analysed."""
    models = list(models)
    return role_order(roles, models) if roles is not None else list(dict.fromkeys(models))


def table_methods(table: pd.DataFrame) -> list[str]:
    """`method_order` of a table's model column, by its role column where it has one."""
    return method_order(table["model"], table["role"] if "role" in table else None)


def palette(labels: Iterable[str]) -> dict[str, str]:
    """A colour (hex) per distinct label, in the order given (a `method_order`): tab10 in its own
    order (blue, orange, green, red, purple, brown, ... as in the paper's figures), evenly spaced
    hues past ten."""
    order = list(dict.fromkeys(labels))
    colours = sns.color_palette("tab10" if len(order) <= 10 else "husl", len(order)).as_hex()
    return dict(zip(order, colours))


@dataclass(frozen=True)
class Methods:
    """The methods a figure draws (`order`) and how every method looks."""

    order: list[str]
    colors: dict[str, str]
    markers: dict[str, str]

    def handles(self) -> list[Line2D]:
        """Legend entries, one per drawn method, in order."""
        return [Line2D([], [], color=self.colors[m], marker=self.markers[m], markersize=6, linewidth=1.8, label=m)
                for m in self.order]


def methods_of(data: pd.DataFrame, fixed: Mapping[str, str] | None) -> Methods:
    """The methods of `data` in family order, drawn with the colours of `fixed` (a `palette` that
    names all of them, and possibly more) or of a palette of just these methods."""
    order = table_methods(data)
    colors = dict(fixed) if fixed is not None else palette(order)
    unknown = [m for m in order if m not in colors]
    if unknown:
        raise ValueError(f"palette has no colour for {', '.join(map(repr, unknown))}: "
                         f"it names {', '.join(map(repr, colors))}")
    markers = {m: MARKERS[n % len(MARKERS)] for n, m in enumerate(colors)}
    return Methods(order, colors, markers)
