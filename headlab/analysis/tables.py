"""Tidy tables on disk: one CSV per table and a manifest written last, naming every table with its
row count, columns and SHA-256, so a folder cut short (or edited, or mixed from two writers) is
refused on load instead of read as a whole. `Analysis.save` and a study's tables both use it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from headlab.io import atomic_write_bytes, atomic_write_text

TEXT_COLUMNS = ("model", "role", "kind", "circuit", "measure", "mla_rope", "part", "loss_unit")


def save_tables(folder: str | Path, tables: dict[str, pd.DataFrame], manifest: str, meta: dict | None = None) -> Path:
    """Write each table as <name>.csv in `folder` (created if needed), each file atomically, then
    the manifest (with `meta` under "meta") last; an older manifest is removed first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / manifest).unlink(missing_ok=True)
    entries = {}
    for name, table in tables.items():
        data = table.to_csv(index=False).encode()
        atomic_write_bytes(folder / f"{name}.csv", data)
        entries[f"{name}.csv"] = {"rows": len(table), "columns": list(table.columns),
                                  "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write_text(folder / manifest, json.dumps({"tables": entries, "meta": meta or {}}, indent=2))
    return folder


def load_tables(folder: str | Path, manifest: str, what: str) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables and meta of a folder written by `save_tables`, each table checked against the
    manifest; `what` names the folder's kind in errors ('an analysis folder', 'a study folder')."""
    folder = Path(folder)
    try:
        written = json.loads((folder / manifest).read_text(encoding="utf-8"))
        entries, meta = written["tables"], written["meta"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{folder} is not {what} that was completely written ({manifest} is missing or "
                         f"unreadable: {error}); write it again") from None
    tables = {}
    for file, expected in entries.items():
        path = folder / file
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != expected["sha256"]:
            raise ValueError(f"{path} does not match {folder / manifest} (changed, truncated or from another "
                             "writer): write the folder again")
        text = {c: str for c in expected["columns"] if c in TEXT_COLUMNS}
        tables[file.removesuffix(".csv")] = (pd.read_csv(path, dtype=text, keep_default_na=False, na_values=[""])
                                             if expected["rows"] else pd.DataFrame(columns=expected["columns"]))
    return tables, meta
