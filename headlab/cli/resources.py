"""What the machine, not the input, refused: memory that ran out (while headlab's libraries load or
while a command runs) and a terminal that cannot show a character; and headlab's warnings in one
line, like its errors. Loads nothing heavy, so the
command line can use it before torch is loaded, and when torch could not be."""

from __future__ import annotations

import codecs
import errno
import io
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

# How each kind of failure to get memory reads: Python's MemoryError has no text; the others do.
MEMORY_TEXTS = ("failed to map segment", "cannot allocate memory", "can't allocate memory", "out of memory",
                "std::bad_alloc")
# Characters headlab prints that a terminal without UTF-8 (LC_ALL=C, PYTHONIOENCODING=ascii) cannot show.
PLAIN = {"·": "-", "—": "-", "–": "-", "±": "+/-", "≤": "<=", "≥": ">=", "×": "x", "λ": "lambda", "…": "...",
         "→": "->", "≈": "~", "−": "-", "₁": "1", "²": "^2", "√": "sqrt", "Σ": "Sigma", "θ": "theta"}


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says memory ran out: a MemoryError, torch's OutOfMemoryError, ENOMEM, or a
    library that could not be mapped into memory (`ulimit -v`)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    text = str(error).lower()
    return isinstance(error, (ImportError, OSError, RuntimeError)) and any(t in text for t in MEMORY_TEXTS)


def memory_message(error: BaseException, doing: str) -> str:
    detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
    return (f"memory ran out while {doing} ({detail}): free memory or raise the limit (ulimit -v), or ask for less "
            "(a smaller model, batch or text)")


def _plain(error: UnicodeEncodeError) -> tuple[str, int]:
    """A codec error handler: each character the output cannot encode as its plain spelling, or '?'."""
    return "".join(PLAIN.get(c, "?") for c in error.object[error.start:error.end]), error.end


codecs.register_error("headlab-plain", _plain)


def encodable_output() -> None:
    """Make stdout and stderr print what their encoding cannot show in plain spelling instead of
    failing (a C locale without UTF-8 mode: '·' would otherwise end a command that did its work)."""
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, io.TextIOWrapper):
            continue  # captured (a notebook, a test): whatever it holds takes any text
        try:
            "".join(PLAIN).encode(stream.encoding)
        except (UnicodeEncodeError, LookupError):
            stream.reconfigure(errors="headlab-plain")


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    if Path(filename).resolve().is_relative_to(PACKAGE):
        return f"headlab: warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)


_python_format = warnings.formatwarning


def one_line_warnings() -> None:
    """Print headlab's own warnings as one line, `headlab: warning: ...` (others as Python does)."""
    warnings.formatwarning = _one_line_warning
