"""Run folders that never lose work.

    config.json         model + training config, corpus, headlab version, git commit
    model.safetensors   weights (plain tensors; metadata: format=headlab, step)
    state.pt            optimizer states, data-generator and torch RNG state, step
    metrics.jsonl       one JSON record per log/eval line

Every write is atomic (temporary file + rename). `state.pt` is read with
`torch.load(weights_only=True)`, so nothing beyond tensors and plain containers is unpickled.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from . import __version__
from .config import ModelConfig
from .io import atomic_write, atomic_write_text
from .model import GPT

FORMAT = "headlab"


@dataclass
class Run:
    """A trained model with its configs and metrics (and its folder, if it has one)."""

    model: GPT
    model_config: ModelConfig
    train_config: object
    step: int  # optimizer steps behind `model`'s weights
    metrics: list[dict] = field(default_factory=list)  # may run past `step` if a run was cut short
    path: Path | None = None

    def val_losses(self) -> list[dict]:
        return [r for r in self.metrics if "val_loss" in r]

    @property
    def final_val_loss(self) -> float | None:
        evals = self.val_losses()
        return evals[-1]["val_loss"] if evals else None

    def metrics_frame(self):
        import pandas as pd
        return pd.DataFrame(self.metrics)


class MetricsLog:
    """Records in memory, appended line by line to `metrics.jsonl` (flushed each time)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.records: list[dict] = []

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def reset(self) -> None:
        self.records = []
        if self.path is not None:
            atomic_write_text(self.path, "")

    def truncate_after(self, step: int) -> None:
        """Keep the records up to `step` (the checkpoint a resumed run starts from)."""
        if self.path is not None and self.path.exists():
            self.records = [r for r in read_metrics(self.path) if r["step"] <= step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))


def read_metrics(path: Path) -> list[dict]:
    """Records of a metrics.jsonl; a half-written last line (a killed run) is dropped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def _git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def write_run_config(run_dir: Path, model_config: ModelConfig, train_config, corpus) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "headlab_version": __version__,
        "git_commit": _git_commit(),
        "model": model_config.to_dict(),
        "train": asdict(train_config),
        "data": {"name": corpus.name, "tokenizer": corpus.tokenizer_name, "vocab_size": corpus.vocab_size,
                 "bytes_per_token": corpus.bytes_per_token},
    }
    atomic_write_text(run_dir / "config.json", json.dumps(payload, indent=2))


def save_checkpoint(run_dir: Path, model: GPT, optimizers, generator: torch.Generator, step: int) -> None:
    """Write state.pt, then model.safetensors, each atomically; both record `step`."""
    state = {"step": step, "optimizers": [o.state_dict() for o in optimizers],
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state()}
    atomic_write(run_dir / "state.pt", lambda tmp: torch.save(state, tmp))
    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(run_dir / "model.safetensors",
                 lambda tmp: save_file(weights, str(tmp), metadata={"format": FORMAT, "step": str(step)}))


def _read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    try:
        weights = load_file(str(path))
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file (truncated or corrupt?): {error}") from error
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} was not written by headlab (metadata format={metadata.get('format')!r})")
    return weights, metadata


def _read_state(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, foreign pickle (refused by weights_only), ...
        raise ValueError(f"{path} is not a readable headlab training state (truncated, corrupt or foreign): "
                         f"{type(error).__name__}: {str(error)[:300]}") from error
    if not isinstance(state, dict) or not {"step", "optimizers", "generator"} <= set(state):
        raise ValueError(f"{path} is not a headlab training state (keys: {sorted(state) if isinstance(state, dict) else type(state).__name__})")
    return state


def _read_config(run_dir: Path) -> dict:
    path = run_dir / "config.json"
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is missing or not valid JSON: {error}") from error
    if payload.get("format") != FORMAT or "model" not in payload:
        raise ValueError(f"{path} is not a headlab run config (no format='{FORMAT}' and 'model' entry)")
    return payload


def _load_weights_into(model: GPT, path: Path) -> int:
    weights, metadata = _read_weights(path)
    expected = model.state_dict()
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"{path} does not hold weights for this model configuration")
    model.load_state_dict(weights)
    return int(metadata.get("step", 0))


def load_checkpoint(run_dir: Path, model: GPT, optimizers, generator: torch.Generator,
                    model_config: ModelConfig, train_config) -> int:
    """Restore weights, optimizer and RNG state from `run_dir`; returns the step reached."""
    payload = _read_config(run_dir)
    saved = ModelConfig.from_dict(payload["model"])
    if saved != model_config:
        raise ValueError(f"{run_dir / 'config.json'} holds a different model config than the one passed to resume")
    if payload["train"] != asdict(train_config):
        changed = sorted(k for k, v in asdict(train_config).items() if payload["train"].get(k) != v)
        raise ValueError(f"{run_dir / 'config.json'}: resuming with a changed TrainConfig ({', '.join(changed)})")
    state = _read_state(run_dir / "state.pt")
    step = _load_weights_into(model, run_dir / "model.safetensors")
    if step != state["step"]:
        raise ValueError(f"{run_dir}: model.safetensors is at step {step} but state.pt at step {state['step']}")
    if len(state["optimizers"]) != len(optimizers):
        raise ValueError(f"{run_dir / 'state.pt'} holds {len(state['optimizers'])} optimizer states, expected {len(optimizers)}")
    for optimizer, optimizer_state in zip(optimizers, state["optimizers"]):
        optimizer.load_state_dict(optimizer_state)
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return step


def load_run(path: str | Path, device: str = "cpu") -> Run:
    """The model, configs and metrics of a run folder. Refuses, naming the file, anything
    truncated, corrupt or not written by headlab."""
    from .train import TrainConfig

    run_dir = Path(path)
    payload = _read_config(run_dir)
    model_config = ModelConfig.from_dict(payload["model"])
    model = GPT(model_config)
    step = _load_weights_into(model, run_dir / "model.safetensors")
    metrics_path = run_dir / "metrics.jsonl"
    metrics = read_metrics(metrics_path) if metrics_path.exists() else []
    return Run(model=model.to(device).eval(), model_config=model_config,
               train_config=TrainConfig.from_dict(payload["train"]), step=step, metrics=metrics, path=run_dir)
