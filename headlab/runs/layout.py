"""The names in a run folder, its manifest, and config.json: what the run trains.

config.json holds the model and training configs, the identity of the data (tokenizer, split
sizes, content hash), headlab's version and git commit. It is written once, when a run starts at
step 0, and read only as its manifest verifies it. The training settings arrive as the trainer's
config object and are compared through that object's own `from_dict`, so this layer, below
training, never imports it.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from headlab.data.bpe import TOKENIZER_FILE
from headlab.io import Manifest, parse_json, read_regular
from headlab.model.config import ModelConfig
from headlab.package import installed_version

FORMAT = "headlab"
MANIFEST = "manifest.json"
RUN = "a headlab run"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
STARTS = "starts.jsonl"
CHECKPOINT_PREFIX = "checkpoint-"
DATA_IDENTITY = ("tokenizer", "vocab_size", "n_train_tokens", "n_val_tokens", "sha256")
# How the training is spread over processes, run and checkpointed, not what is trained: a run may
# resume under others, and starts.jsonl records each start's.
EXECUTION_FIELDS = ("parallel", "grad_accum", "snapshot_every", "compile", "device", "checkpoint_every",
                    "checkpoint_minutes")


def run_manifest(run_dir: str | Path) -> Manifest:
    return Manifest.read(Path(run_dir), MANIFEST, RUN)


def _git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def data_identity(corpus) -> dict:
    """What identifies the tokens a run trains on: corpus name, tokenizer, split sizes, content hash."""
    return {"name": corpus.name, "tokenizer": corpus.tokenizer_name, "vocab_size": corpus.vocab_size,
            "bytes_per_token": corpus.bytes_per_token, "n_train_tokens": corpus.n_train_tokens,
            "n_val_tokens": corpus.n_val_tokens, "sha256": corpus.sha256}


def write_run_config(manifest: Manifest, model_config: ModelConfig, train_config, corpus) -> None:
    """config.json (and a trained BPE's tokenizer.json) of a run starting at step 0."""
    payload = {
        "format": FORMAT,
        "headlab_version": installed_version(),
        "git_commit": _git_commit(),
        "model": model_config.recorded(),  # fields added since the previous release only where set
        "train": train_config.recorded(),
        "data": data_identity(corpus),
    }
    manifest.write_bytes(CONFIG, json.dumps(payload, indent=2).encode())
    if corpus.tokenizer_name.startswith("bpe:"):  # trained on this corpus: the run keeps its own copy
        manifest.write_bytes(TOKENIZER_FILE, read_regular(corpus.folder / TOKENIZER_FILE))


def read_config(run_dir: str | Path) -> dict:
    """A run's config.json, verified against its manifest: {"model", "train", "data", ...}."""
    path = Path(run_dir) / CONFIG
    payload = parse_json(run_manifest(run_dir).read_bytes(CONFIG), path)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "model" not in payload:
        raise ValueError(f"{path} is not a headlab run config (no format='{FORMAT}' and 'model' entry)")
    check_known_fields(payload, "model", ModelConfig, path)
    return payload


def check_known_fields(payload: dict, section: str, config_class, path: Path) -> None:
    """Refuse in one line a run whose config.json `section` names fields `config_class` does not
    have: a newer headlab wrote it, recording a setting this one cannot train or read as it was."""
    values = payload.get(section)
    unknown = sorted(set(values) - set(config_class.__dataclass_fields__)) if isinstance(values, dict) else []
    if unknown:
        written = f"headlab {payload.get('headlab_version', '(version unrecorded)')}"
        commit = payload.get("git_commit")
        raise ValueError(f"{path} records {', '.join(f'{section}.{name}' for name in unknown)}, unknown to this "
                         f"headlab ({installed_version()}): the run needs a newer headlab (it was written by {written}"
                         f"{f', commit {str(commit)[:12]}' if commit else ''}); upgrade headlab to read it")


def saved_train_config(run_dir: str | Path, payload: dict, config_class):
    """The training settings a run's config.json records, as `config_class` (the trainer's
    TrainConfig: this layer is below training), fields added since the run was saved at their
    defaults; a field this headlab does not know is refused (`check_known_fields`)."""
    check_known_fields(payload, "train", config_class, Path(run_dir) / CONFIG)
    return config_class.from_dict(payload.get("train", {}))


def _differences(section: str, saved: dict, given: dict) -> list[str]:
    missing = object()
    return [f"{section}.{k}: saved {saved.get(k, '(absent)')!r}, given {given.get(k, '(absent)')!r}"
            for k in sorted(set(saved) | set(given), key=str) if saved.get(k, missing) != given.get(k, missing)]


def resume_differences(run_dir: str | Path, model_config: ModelConfig, train_config, corpus) -> list[str]:
    """Each setting in which (model_config, train_config, corpus) differs from the run saved in
    `run_dir`, as 'section.field: saved X, given Y'. Data is compared by identity (tokenizer,
    split sizes, content hash); the saved training settings are read with `train_config`'s own
    class, so fields added since the run was saved take their defaults. The `EXECUTION_FIELDS`
    (FSDP or DDP, gradient accumulation, analysis snapshots, the checkpoint cadence) may differ."""
    payload = read_config(run_dir)
    differences = _differences("model", ModelConfig.from_dict(payload["model"]).to_dict(), model_config.to_dict())
    what = lambda config: {k: v for k, v in asdict(config).items() if k not in EXECUTION_FIELDS}
    saved_train = saved_train_config(run_dir, payload, type(train_config))
    differences += _differences("train", what(saved_train), what(train_config))
    saved_data, given_data = payload.get("data", {}), data_identity(corpus)
    differences += _differences("data", {k: saved_data[k] for k in DATA_IDENTITY if k in saved_data},
                                {k: given_data[k] for k in DATA_IDENTITY})
    return differences


def check_resumable(run_dir: str | Path, model_config: ModelConfig, train_config, corpus) -> None:
    """Refuse, naming every difference (`resume_differences`), to continue the run in `run_dir` as another."""
    differences = resume_differences(run_dir, model_config, train_config, corpus)
    if differences:
        raise ValueError(f"cannot resume {run_dir}: {len(differences)} setting(s) differ from the saved run: "
                         + "; ".join(differences) + ". Resume with the saved settings, or choose another folder")


def run_identity(run_dir: str | Path) -> str:
    """The SHA-256 of a run's config.json as its manifest lists it: what it was trained as."""
    return run_manifest(run_dir).entry(CONFIG)["sha256"]
