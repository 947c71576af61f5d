"""One colour and one marker per method in every figure (study, sweep, benchmarks, notebooks),
fixed by what the method is, never by its place in a figure: by its role in the study
(`headlab.schema.ROLES`), or outside a study by its attention family (`headlab.schema.FAMILIES`,
which looks like the family's first role). Adding a role or family, or leaving one out of a
figure, moves no other method's colour.

The six roles take tab10's first six colours in the paper's figure order (blue, orange, green,
red, purple, brown). A method with neither (a pretrained model, a family without a colour here
yet) takes a spare colour chosen by its label's name, the next free one when another method of
the same figure holds it already (lighter ones past seven such methods).
"""

from __future__ import annotations

import zlib
from typing import Iterable, Mapping

from headlab.report.plots.style import MARKERS

ROLE_COLOURS = {"mha": "#1f77b4", "lrkv-small": "#ff7f0e", "lrkv-large": "#2ca02c", "mqa": "#d62728",
                "mla": "#9467bd", "gqa": "#8c564b"}
FAMILY_COLOURS = {"mha": ROLE_COLOURS["mha"], "lrkv": ROLE_COLOURS["lrkv-small"], "mqa": ROLE_COLOURS["mqa"],
                  "mla": ROLE_COLOURS["mla"], "gqa": ROLE_COLOURS["gqa"]}
# For methods without a role: tab10's other four and three more far from every role's colour, then
# (only once those are taken in a figure) tab20's lighter partners of the spares and of the roles.
SPARE_COLOURS = ("#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#e6ab02", "#1b9e77",
                 "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                 "#c5b0d5", "#c49c94")
# A figure whose lines are training recipes, not methods (`headlab.study.table_files.recipe_name`)
RECIPE_COLOURS = {"Muon split": "#17becf", "AdamW on W_Q, W_K": "#e6ab02", "AdamW": "#1b9e77"}
FIRST_SPARES = 7  # the distinct ones, where a method's name chooses its colour
ROLE_MARKERS = {"#1f77b4": "o", "#ff7f0e": "s", "#2ca02c": "^", "#d62728": "D", "#9467bd": "v", "#8c564b": "P"}
SPARE_MARKERS = ("X", "*", "h", "<", ">", "p", "d")  # none a role's
COLOUR_MARKERS = {**ROLE_MARKERS, **{c: SPARE_MARKERS[n % len(SPARE_MARKERS)] for n, c in enumerate(SPARE_COLOURS)}}


def colour_of(kind: str | None) -> str | None:
    """The fixed colour of a role or family (a role first: "mha" names both), None for neither."""
    return ROLE_COLOURS.get(kind) or FAMILY_COLOURS.get(kind)


def palette(methods: Mapping[str, str | None] | Iterable[str]) -> dict[str, str]:
    """A colour (hex) per method label, in the order given. `methods`: label -> its role or
    family (None, or neither: a spare colour by the label's name); or labels alone, each then
    read as a role or family name itself."""
    kinds = dict(methods) if isinstance(methods, Mapping) else {label: label for label in methods}
    colours = {label: colour_of(kind) for label, kind in kinds.items() if colour_of(kind)}
    taken = set(colours.values())
    for label in kinds:
        if label not in colours:
            start = zlib.crc32(str(label).encode()) % FIRST_SPARES
            spare = [SPARE_COLOURS[(start + step) % len(SPARE_COLOURS)] for step in range(len(SPARE_COLOURS))]
            colours[label] = next((c for c in spare if c not in taken), spare[0])
            taken.add(colours[label])
    return {label: colours[label] for label in kinds}


def markers(colours: Mapping[str, str]) -> dict[str, str]:
    """A marker per label of a palette (label -> colour): its colour's marker, so a role keeps
    its marker too. A label whose colour has none, or whose colour's marker another label holds
    (MLA's two RoPE settings share MLA's colour; spare colours share markers), takes the first
    marker no label holds (a spare one first); labels in a role's colour choose first."""
    wanted = {label: COLOUR_MARKERS.get(str(colour).lower()) for label, colour in colours.items()}
    first = sorted(wanted, key=lambda label: str(colours[label]).lower() not in ROLE_MARKERS)
    chosen: dict[str, str] = {}
    for label in first:
        marker = wanted[label]
        if marker is None or marker in chosen.values():
            candidates = list(dict.fromkeys([*SPARE_MARKERS, *MARKERS]))  # not a role's marker, if one is left
            free = [m for m in candidates if m not in chosen.values() and m not in wanted.values()]
            marker = (free or [m for m in candidates if m not in chosen.values()] or candidates)[0]
        chosen[label] = marker
    return {label: chosen[label] for label in colours}
