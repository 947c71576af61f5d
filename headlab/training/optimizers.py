"""The optimizers of a training recipe: AdamW on everything, or the paper's Muon + AdamW split.

    optimizers = make_optimizers(model, train_config)   # a list; the trainer steps each

Which parameter goes where (`TrainConfig.optimizer`):
  adamw  AdamW (lr, betas 0.9/0.95) on every parameter; weight decay on every tensor of 2 or more
         dimensions, so LRKV's U_h (in u_k, u_v) and B_h (the 3-D b_k, b_v) are decayed too.
  muon   Muon (matrix_lr, momentum 0.95, Nesterov) on the blocks' 2-D weights with decoupled
         weight decay: p ← (1 − lr·wd)·p, then p ← p − lr·√max(1, m/n)·NS(momentum) for an m × n
         matrix. LRKV's stacked U = [U_1ᵀ; …; U_Hᵀ] (H·r × d) is one such matrix, orthogonalised as a
         whole, like the stacked per-head query weights. AdamW for the embedding (embedding_lr), the
         head (unembedding_lr) and the rest (lr: norms, and LRKV's 3-D B tensors), without decay.

Two options of the LRKV factors, for the question of what the recipe does to their heads:
  lrkv_factor_decay False   no weight decay on U_h or B_h, wherever the recipe would apply it (an
                            L2 penalty on both factors of U_h B_hᵀ acts on the product like a
                            nuclear-norm penalty, pulling each head toward the shared projection).
  lrkv_b_optimizer "muon"   (with optimizer "muon") B_h by Muon too, orthogonalised head by head
                            (`HeadwiseMuon`), at matrix_lr, decayed like U_h.
"""

from __future__ import annotations

import math

import torch

from headlab.model.gpt import GPT
from headlab.training.config import TrainConfig

ADAM_BETAS = (0.9, 0.95)
LRKV_FACTORS = (".u_k.weight", ".u_v.weight", ".b_k", ".b_v")
LRKV_B = (".b_k", ".b_v")
# The quintic Newton–Schulz coefficients of torch.optim.Muon (its defaults), so per-head Muon
# orthogonalises exactly as the 2-D Muon does.
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5
MUON_MOMENTUM = 0.95


def is_muon_matrix(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon (not AdamW) updates this parameter: the blocks' 2-D weights."""
    return name.startswith("blocks.") and parameter.dim() == 2


def is_lrkv_factor(name: str) -> bool:
    """Whether a parameter holds LRKV's per-head residual factors U_h or B_h."""
    return name.endswith(LRKV_FACTORS)


def orthogonalize(update: torch.Tensor, steps: int = NEWTON_SCHULZ_STEPS, eps: float = 1e-7,
                  coefficients: tuple[float, float, float] = NEWTON_SCHULZ) -> torch.Tensor:
    """Approximately U Vᵀ for each matrix G = U S Vᵀ in a batch (…, m, n), by the quintic
    Newton–Schulz iteration X ← a·X + (b·A + c·A²)·X with A = X Xᵀ, from X = G / ‖G‖_F (per matrix),
    iterated on the wide orientation in bfloat16 as torch.optim.Muon does; singular values end
    near 1 (roughly within 0.5 to 1.5), which is all Muon asks of it."""
    a, b, c = coefficients
    tall = update.size(-2) > update.size(-1)
    x = update.bfloat16().reshape(-1, *update.shape[-2:])
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # fused as torch's addmm
    return (x.mT if tall else x).reshape(update.shape).to(update.dtype)


@torch.no_grad()
def muon_step(params: list[torch.Tensor], state, lr: float, weight_decay: float, momentum: float,
              nesterov: bool = True, steps: int = NEWTON_SCHULZ_STEPS, eps: float = 1e-7,
              coefficients: tuple[float, float, float] = NEWTON_SCHULZ) -> None:
    """torch.optim.Muon's update of every parameter with a gradient, batched by shape: per matrix
    (or per trailing m × n slice of a stacked tensor), buf ← μ·buf + (1 − μ)·g,
    u = g + μ·(buf − g) (Nesterov; else buf), p ← (1 − lr·wd)·p − lr·√max(1, m/n)·NS(u). The
    parameters of one shape are stacked and orthogonalised in one batched Newton–Schulz call,
    so a step launches a few dozen kernels per shape instead of per matrix (a paper block's
    matrices come in three or four shapes). `state` is the optimizer's per-parameter state."""
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            by_shape.setdefault((p.shape, p.dtype, p.device), []).append(p)
    for (shape, _, _), same in by_shape.items():
        grads = [p.grad for p in same]
        buffers = [state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in same]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch.stack(grads).lerp_(torch.stack(buffers), momentum) if nesterov else torch.stack(buffers)
        updates = orthogonalize(updates, steps, eps, coefficients)
        torch._foreach_mul_(same, 1 - lr * weight_decay)
        torch._foreach_add_(same, updates.unbind(0), alpha=-lr * math.sqrt(max(1.0, shape[-2] / shape[-1])))


class Muon(torch.optim.Muon):
    """torch.optim.Muon (same options, state and saved form, so runs saved by it resume) with
    `muon_step`'s update batched by shape. Its learning-rate scale is the original
    √max(1, m/n) only."""

    def __init__(self, params, **options):
        super().__init__(params, **options)
        if any(group["adjust_lr_fn"] not in (None, "original") for group in self.param_groups):
            raise ValueError("headlab's Muon scales the learning rate as the original Muon only (adjust_lr_fn None)")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            muon_step(group["params"], self.state, group["lr"], group["weight_decay"], group["momentum"],
                      group["nesterov"], group["ns_steps"], group["eps"], tuple(group["ns_coefficients"]))


class HeadwiseMuon(torch.optim.Optimizer):
    """Muon for stacks of per-head matrices (H, m, n): momentum and the update as in
    torch.optim.Muon, but each head's m × n slice is orthogonalised on its own, so no head's update
    is mixed with another's (`muon_step`)."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, momentum: float = MUON_MOMENTUM):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 3:
                    raise ValueError(f"HeadwiseMuon takes (heads, m, n) tensors, not shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            muon_step(group["params"], self.state, group["lr"], group["weight_decay"], group["momentum"])


def make_optimizers(model: GPT, config: TrainConfig) -> list[torch.optim.Optimizer]:
    """The recipe's optimizers (module docstring). AdamW is torch's fused kernel (CPU and CUDA
    since torch 2.4): one pass over all parameters instead of a dozen per tensor, about 4 ms less
    per `cpu-small` step. Each group's `base_lr` is its configured rate, which the schedule scales."""
    optimizers = _build_optimizers(model, config)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["base_lr"] = group["lr"]  # present from the start, so a saved state loads into a fresh optimizer
    return optimizers


def _build_optimizers(model: GPT, config: TrainConfig) -> list[torch.optim.Optimizer]:
    named = list(model.named_parameters())
    # LRKV's factors form a group of their own only when they are treated differently, so a run
    # saved by the default recipe resumes into the same optimizer groups.
    separate = (lambda n: is_lrkv_factor(n)) if not config.lrkv_factor_decay else (lambda n: False)
    if config.optimizer == "adamw":
        groups = [{"params": [p for n, p in named if p.dim() >= 2 and not separate(n)],
                   "weight_decay": config.weight_decay},
                  {"params": [p for n, p in named if separate(n)], "weight_decay": 0.0},
                  {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0}]
        return [torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=ADAM_BETAS, fused=True)]
    factor_decay = config.weight_decay if config.lrkv_factor_decay else 0.0
    muon_groups = [{"params": [p for n, p in named if is_muon_matrix(n, p) and not separate(n)],
                    "weight_decay": config.weight_decay},
                   {"params": [p for n, p in named if is_muon_matrix(n, p) and separate(n)], "weight_decay": 0.0}]
    headwise = [p for n, p in named if n.endswith(LRKV_B)] if config.lrkv_b_optimizer == "muon" else []
    routed = {id(p) for g in muon_groups for p in g["params"]} | {id(p) for p in headwise}
    other = [p for n, p in named if id(p) not in routed and not n.startswith(("wte.", "lm_head."))]
    adam_groups = [
        {"params": list(model.wte.parameters()), "lr": config.embedding_lr, "weight_decay": 0.0},
        {"params": list(model.lm_head.parameters()), "lr": config.unembedding_lr, "weight_decay": 0.0},
        {"params": other, "lr": config.lr, "weight_decay": 0.0},
    ]
    optimizers = [Muon([g for g in muon_groups if g["params"]], lr=config.matrix_lr, weight_decay=config.weight_decay),
                  torch.optim.AdamW(adam_groups, betas=ADAM_BETAS, fused=True)]
    if headwise:
        optimizers.append(HeadwiseMuon(headwise, lr=config.matrix_lr, weight_decay=factor_decay))
    return optimizers
