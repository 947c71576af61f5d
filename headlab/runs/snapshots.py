"""Analysis snapshots: the attention weights of a run as it trains, written on a schedule.

    TrainConfig(snapshot_every=35)          # off by default (0)
    snapshot_steps(350, 35)                 # [0, 1, 2, 4, 8, 16, 32, 35, 70, ..., 315]

A snapshot is the step-`s` state (the weights after s optimizer updates, s = 0 the initial
draw) of every `blocks.<i>.attn.*` tensor: exactly what `headlab.analysis.heads` reads for a headlab
model (Q/K/V/O, LRKV's shared and low-rank parts, MLA's latent weights and latent-norm gains;
the blocks' pre-norm gains are not part of A_h, see `headlab.analysis.heads`). Never optimizer state.
Layout: <run>/snapshots/step-XXXXXXXX.safetensors (metadata: format=headlab, step), each
written atomically and listed with its SHA-256 in the run's manifest (`headlab.io`), so a kill
leaves a whole snapshot or none, and a snapshot is verified when read. After a resume
from step c, the steps from c on are written again; on CPU training is bit-reproducible, so a
snapshot rewritten this way is identical to the one a kill interrupted. The last step's weights
are the run's final checkpoint, which `analyze_snapshots` reads as the last step.

Snapshots hold attention weights only, so their analysis is the weight-space (Frobenius) one:
the data-aware measure and attention maps need the whole model at that step.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save as serialize_safetensors

from headlab.runs.layout import run_manifest

FOLDER = "snapshots"
FORMAT = "headlab"
NAME = re.compile(rf"^{FOLDER}/step-(\d{{8}})\.safetensors$")


def snapshot_steps(steps: int, every: int) -> list[int]:
    """The steps s < `steps` that get a snapshot: 0 and the powers of two below `every`
    (early training moves fastest), then every multiple of `every`. Empty when `every` is 0.
    The final weights (s = steps) are the run's last checkpoint."""
    return [step for step in range(steps) if is_snapshot_step(step, every)]


def study_snapshot_every(steps: int) -> int:
    """The interval a study uses: ten evenly spaced snapshots (plus the early log-spaced ones)."""
    return max(1, steps // 10)


def is_snapshot_step(step: int, every: int) -> bool:
    """Whether `snapshot_steps(·, every)` contains `step` (for any run longer than `step`)."""
    return every > 0 and (step % every == 0 or (step & (step - 1) == 0 and step < every))


def snapshot_name(step: int) -> str:
    return f"{FOLDER}/step-{step:08d}.safetensors"


def attention_tensors(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """CPU copies of the model's `blocks.<i>.attn.*` tensors: what the head analysis reads. FSDP
    shards (DTensors) are gathered whole, a collective every rank must join; a rank that does
    not `keep` them (it writes nothing) joins the gathers and copies nothing: {}."""
    def whole(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    tensors = {}
    for name, tensor in model.state_dict().items():
        if re.match(r"blocks\.\d+\.attn\.", name):
            gathered = whole(tensor.detach())
            if keep:
                tensors[name] = gathered.to("cpu", copy=True).contiguous()
    return tensors


def write_snapshot(run_dir: Path, model: torch.nn.Module, step: int, every: int, write: bool = True) -> Path | None:
    """Write the snapshot of `step` if the schedule of `every` has one there (the training loop's
    one call, before the update of `step`, on every rank; only the rank with `write` writes);
    returns its path, or None when none is due or written."""
    if not is_snapshot_step(step, every):
        return None
    tensors = attention_tensors(model, keep=write)
    if not write:
        return None
    manifest = run_manifest(run_dir)
    data = serialize_safetensors(tensors, metadata={"format": FORMAT, "step": str(step)})
    manifest.write(snapshot_name(step), lambda file: file.write(data))
    manifest.save()
    return manifest.file(snapshot_name(step))


def snapshot_files(run_dir: str | Path) -> dict[int, Path]:
    """Step -> snapshot file of a run folder, in step order, each verified against the manifest."""
    manifest = run_manifest(run_dir)
    found = {int(m.group(1)): manifest.verify(name) for name in manifest.files if (m := NAME.match(name))}
    return dict(sorted(found.items()))
