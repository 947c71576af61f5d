"""Tidy tables on disk: one CSV per table, listed with its SHA-256 in the folder's manifest
(`headlab.io.Manifest`) together with each table's row count and columns, so a folder cut
short, edited, or mixed from two writers is refused on load instead of read as a whole.
`Analysis.save` and a study's tables both use it. A writer holds the folder's lock, so a
second writer is refused; a reader that meets a folder being written is told to retry."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Collection

import pandas as pd

from headlab.io import FolderLock, Manifest, being_written, make_folder, refuse_foreign

ANALYSIS_MANIFEST, ANALYSIS = "analysis.json", "an analysis folder"  # `Analysis.save`'s folder: its manifest, its kind
TEXT_COLUMNS = ("model", "role", "kind", "circuit", "measure", "mla_rope", "part", "loss_unit", "section", "metric",
                "verdict", "change", "sentence", "name", "text")


def save_tables(folder: str | Path, tables: dict[str, pd.DataFrame], manifest: str, what: str,
                meta: dict | None = None) -> Path:
    """Write each table as <name>.csv in `folder` (created if needed; refused if it holds files
    headlab did not write), then record them (and `meta`) in the manifest; tables of an earlier
    write that are not written again are removed, other files the manifest lists are kept. The
    earlier tables stay readable until every new one is written (`Manifest.write_all`).
    `what` names the folder's kind."""
    folder = Path(folder)
    refuse_foreign(folder, manifest)
    make_folder(folder)
    with FolderLock(folder, "writer of tables"):
        written = Manifest.claim(folder, manifest, what)
        written.remove_leftovers()
        earlier = written.meta.get("tables", {}) if isinstance(written.meta.get("tables"), dict) else {}
        names = {f"{name}.csv": table for name, table in tables.items()}
        written.write_all({name: lambda file, table=table: file.write(table.to_csv(index=False).encode())
                           for name, table in names.items()})
        for name in earlier:
            if name not in names and name in written.files:
                written.retire(name)
        written.meta = {"tables": {name: {"rows": len(table), "columns": list(table.columns)}
                                   for name, table in names.items()}, "meta": meta or {}}
        written.save()
        written.remove_leftovers()
    return folder


def load_tables(folder: str | Path, manifest: str, what: str, text_tables: Collection[str] = ()
                ) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables and meta of a folder written by `save_tables`, each table verified against the
    manifest; `what` names the folder's kind in errors ('an analysis folder', 'a study folder').
    The tables named in `text_tables` are read as text, every cell as written (an empty one too)."""
    folder = Path(folder)
    try:
        return _read_tables(folder, manifest, what, set(text_tables))
    except ValueError:
        if being_written(folder):
            raise RuntimeError(f"{folder} is being written by another process: retry when it has finished") from None
        raise


def _is_table_record(record) -> bool:
    """{"rows": a count, "columns": the names}, as `save_tables` records each table."""
    return (isinstance(record, dict) and type(record.get("rows")) is int and record["rows"] >= 0
            and isinstance(record.get("columns"), list) and all(isinstance(c, str) for c in record["columns"]))


def _read_tables(folder: Path, manifest: str, what: str, text_tables: set[str]
                 ) -> tuple[dict[str, pd.DataFrame], dict]:
    written = Manifest.read(folder, manifest, what)
    try:
        entries, meta = written.meta["tables"], written.meta["meta"]
    except KeyError:
        raise ValueError(f"{folder} is not {what} that was completely written ({written.path} lists no tables): "
                         "write it again") from None
    if not (isinstance(entries, dict) and isinstance(meta, dict) and all(map(_is_table_record, entries.values()))):
        raise ValueError(f"{written.path} does not record its tables as headlab writes them (each with its rows and "
                         "columns): it was edited or damaged; write the folder again")
    tables = {}
    for file, expected in entries.items():
        data, name = written.read_bytes(file), file.removesuffix(".csv")
        text = {c: str for c in expected["columns"] if c in TEXT_COLUMNS or name in text_tables}
        options = {"na_filter": False} if name in text_tables else {"keep_default_na": False, "na_values": [""]}
        tables[name] = (pd.read_csv(io.BytesIO(data), dtype=text, **options)
                        if expected["rows"] else pd.DataFrame(columns=expected["columns"]))
    return tables, meta
