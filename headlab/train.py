"""Training loop: AdamW (decay on matrices only), linear warmup then cosine decay, clipping."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import ModelConfig
from .data import random_windows
from .model import GPT


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_batches: int = 16
    seed: int = 0


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr_ratio · lr` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: GPT, config: TrainConfig) -> torch.optim.AdamW:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": config.weight_decay}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


@torch.no_grad()
def evaluate(model: GPT, tokens: np.ndarray, batch_size: int, n_batches: int, seed: int = 1234) -> float:
    """Mean cross-entropy (nats/token) over `n_batches` seeded random windows."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = [model(*random_windows(tokens, batch_size, model.config.seq_len, generator))[1].item()
              for _ in range(n_batches)]
    model.train(was_training)
    return float(np.mean(losses))


def train_model(model_config: ModelConfig, train_config: TrainConfig, train_tokens: np.ndarray,
                val_tokens: np.ndarray, progress: bool = True) -> tuple[GPT, dict]:
    """Train a fresh GPT; returns it and {'train_loss': [...], 'val_loss': float}."""
    torch.manual_seed(train_config.seed)
    model = GPT(model_config)
    optimizer = make_optimizer(model, train_config)
    generator = torch.Generator().manual_seed(train_config.seed)
    losses = []
    bar = tqdm(range(train_config.steps), desc=model_config.label, disable=not progress, leave=False)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, train_config)
        x, y = random_windows(train_tokens, train_config.batch_size, model_config.seq_len, generator)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
    val_loss = evaluate(model, val_tokens, train_config.batch_size, train_config.eval_batches)
    return model, {"train_loss": losses, "val_loss": val_loss}
