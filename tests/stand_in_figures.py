"""Figures saved as stand-ins, for the tests that judge what commands do to files and folders
(tests/disk/test_treediff.py, tests/disk/test_nothing_lost.py) or what a report says: their reports
and docs redraw every figure, and drawing took 18 of the disk tests' 51 CPU-seconds. What a figure
shows is the subject of the plots' and report's other tests, and of
tests/disk/test_reproducible_figures.py, which keep real ones. The figures are still built (their
data, axes and artists): only their rasterising and encoding is left out.

A stand-in goes through everything a real figure does after it is drawn (`save_figure`: into
memory, then through the folder's manifest, atomically): only its bytes differ. They are a digest
of what the figure shows (so a redraw of the same tables gives the same bytes and other tables
other bytes, as real figures do), padded to about a real PNG's size (so a file-size limit or a
write cut short still lands on a figure)."""

from __future__ import annotations

import hashlib

from matplotlib.figure import Figure

STAND_IN_BYTES = 48 * 1024  # the report's PNGs take 30-110 KB


def shown(figure: Figure) -> str:
    """A digest of what `figure` shows: each axes' title, labels, texts and drawn data."""
    digest = hashlib.sha256()
    for axes in figure.axes:
        digest.update("|".join([axes.get_title(), axes.get_xlabel(), axes.get_ylabel(),
                                *(text.get_text() for text in axes.texts)]).encode())
        for line in axes.lines:
            digest.update(line.get_xydata().tobytes())
        for collection in axes.collections:
            digest.update(collection.get_offsets().tobytes())
            if collection.get_array() is not None:  # a heatmap's values
                digest.update(collection.get_array().tobytes())
        for image in axes.images:
            digest.update(image.get_array().tobytes())
    return digest.hexdigest()


def save_stand_in(figure: Figure, buffer, format: str | None = None, **options) -> None:
    """What `Figure.savefig(buffer, format=...)` writes in place of the drawing (headlab saves every
    figure into memory first: `save_figure`, the explorer, a notebook's PNG)."""
    header = f"headlab test stand-in for a {format} figure: {shown(figure)}\n".encode()
    buffer.write(header + b"." * (STAND_IN_BYTES - len(header)))
