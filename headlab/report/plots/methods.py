"""The methods a figure draws: their order (by role), and the colour and marker of each (`palette`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import pandas as pd
from matplotlib.lines import Line2D

from headlab.report.plots.colours import markers, palette
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


def table_palette(table: pd.DataFrame) -> dict[str, str]:
    """`palette` of a table's models in `table_methods` order, each by its role (the role column,
    where the table has one): the colours every figure of the table's models gives them."""
    roles = table.drop_duplicates("model").set_index("model")["role"] if "role" in table else {}
    return palette({model: roles.get(model) for model in table_methods(table)})


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
    names all of them, and possibly more) or with their own (`table_palette`), a marker each
    (`markers`)."""
    order = table_methods(data)
    colors = dict(fixed) if fixed is not None else table_palette(data)
    unknown = [m for m in order if m not in colors]
    if unknown:
        raise ValueError(f"palette has no colour for {', '.join(map(repr, unknown))}: "
                         f"it names {', '.join(map(repr, colors))}")
    return Methods(order, colors, markers(colors))
