"""Divergence: a run whose loss became non-finite, or ended worse than a uniform guess over its
vocabulary, has learned nothing to compare. Its manifest records it (meta "diverged"), so a
study reports the run instead of drawing conclusions from it, and never trains it again.

"Worse" means by more than `MARGIN`: an initialised model already scores a little above ln V
(measured: +0.02 nats for tiny, +0.07 cpu-small, +0.11 paper-128m), and so does a run stopped
in its warmup; diverged runs end tens of nats above it (lr = 10: 187 to 432 nats/byte)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from headlab.runs.layout import MANIFEST, run_manifest

DIVERGED = "diverged"  # the run manifest's meta key
MARGIN = 1.0  # nats/token above ln V that no freshly initialised model reaches


def uniform_loss(vocab_size: int) -> float:
    """Cross-entropy of the uniform guess over `vocab_size` tokens: ln V nats/token."""
    return math.log(vocab_size)


def is_diverged(loss: float, vocab_size: int) -> bool:
    """Whether `loss` (nats/token) is non-finite or worse than the uniform guess: above ln V + `MARGIN`."""
    return not math.isfinite(loss) or loss > uniform_loss(vocab_size) + MARGIN


@dataclass(frozen=True)
class Divergence:
    """Where a run diverged: the step, its loss there (nats/token) and `vocab_size` of its tokens."""

    step: int
    loss: float
    vocab_size: int

    def describe(self, unit: str = "nats/token") -> str:
        uniform = f"ln {self.vocab_size} = {uniform_loss(self.vocab_size):.3f}"
        if not math.isfinite(self.loss):
            return f"loss {self.loss} at step {self.step}, not a number (a uniform guess scores {uniform})"
        return (f"loss {self.loss:.3f} {unit} at step {self.step}, worse than a uniform guess ({uniform}) by more "
                f"than {MARGIN:g} nat")

    def to_dict(self) -> dict:
        # a non-finite loss as text: the manifest stays strict JSON
        return {"step": self.step, "loss": self.loss if math.isfinite(self.loss) else str(self.loss),
                "vocab_size": self.vocab_size}


def run_divergence(run_dir: str | Path) -> Divergence | None:
    """The divergence recorded in a run folder's manifest; None when it has none (or no manifest)."""
    if not (Path(run_dir) / MANIFEST).is_file():
        return None
    record = run_manifest(run_dir).meta.get(DIVERGED)
    if record is None:
        return None
    try:
        return Divergence(int(record["step"]), float(record["loss"]), int(record["vocab_size"]))
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{Path(run_dir) / MANIFEST} records a divergence it cannot state ({record!r}): "
                         "write the run again") from None
