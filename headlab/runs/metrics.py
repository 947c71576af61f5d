"""metrics.jsonl: one JSON record per log or evaluation line, appended as training goes.

The manifest hashes the file up to the current checkpoint; lines after it are a cut-short run's,
read back but dropped when the run resumes from that checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from headlab.io import append_line, mismatch, parse_json, read_regular
from headlab.runs.layout import METRICS, run_manifest


class MetricsLog:
    """Records in memory, appended line by line to `metrics.jsonl` (flushed each time) and hashed
    as they are written, so a checkpoint records the file's SHA-256 up to its step. With
    `write=False` (the ranks other than 0) the file is only read: on resume, every rank holds
    the same records."""

    def __init__(self, path: Path | None, write: bool = True):
        self.path = path
        self.write = write
        self.records: list[dict] = []
        self.digest, self.size = hashlib.sha256(), 0

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.path is not None and self.write:
            line = (json.dumps(record) + "\n").encode()
            append_line(self.path, line)
            self.digest.update(line)
            self.size += len(line)

    @property
    def entry(self) -> dict:
        return {"bytes": self.size, "sha256": self.digest.hexdigest()}

    def reset(self) -> None:
        self.records, self.digest, self.size = [], hashlib.sha256(), 0
        if self.path is not None and self.write:
            run_manifest(self.path.parent).replace_log(self.path.name, b"")

    def truncate_after(self, step: int) -> None:
        """Keep the records up to `step`, the current checkpoint's: the part of the file its
        manifest hashed (what a cut-short run wrote after it is dropped)."""
        if self.path is not None:
            data, verified = _metrics_bytes(self.path)
            if self.write:
                run_manifest(self.path.parent).replace_log(self.path.name, data[:verified])
            self.records = [r for r in _parse_metrics(self.path, data[:verified]) if r["step"] <= step]
            self.digest, self.size = hashlib.sha256(data[:verified]), verified


def _metrics_bytes(path: Path) -> tuple[bytes, int]:
    """A run's metrics.jsonl and the length of its start that the manifest hashed (checked)."""
    manifest = run_manifest(path.parent)
    entry = manifest.files.get(METRICS, {"bytes": 0, "sha256": hashlib.sha256().hexdigest()})
    try:
        data = read_regular(path)
    except FileNotFoundError:
        data = b""
    if hashlib.sha256(data[:entry["bytes"]]).hexdigest() != entry["sha256"]:
        raise mismatch(path, manifest.path)
    return data, entry["bytes"]


def read_metrics(path: Path) -> list[dict]:
    """Records of a run's metrics.jsonl: the part its manifest hashed is verified, then what a
    cut-short run appended after its last checkpoint. A half-written last line (a killed run) is
    dropped; any other line that is not a JSON record with an integer `step` is an error naming
    file and line."""
    return _parse_metrics(Path(path), _metrics_bytes(Path(path))[0])


def _parse_metrics(path: Path, data: bytes) -> list[dict]:
    lines = data.decode("utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = parse_json(line, f"{path} line {number}")
        except ValueError as error:
            if number == len(lines):
                break
            raise ValueError(f"{error}: the metrics are corrupt; repair or delete that line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path} line {number} is not a metrics record (a JSON object with an integer "
                             "'step'): repair or delete that line")
        records.append(record)
    return records
