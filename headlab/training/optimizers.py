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

One option of the split, for the question of what Muon does to the QK forms A_h = W^Q_h W^K_hᵀ:
  muon_qk False             the matrices that only form queries or keys (`is_qk_matrix`) by AdamW at
                            lr with weight decay, as under the AdamW recipe; Muon keeps V, O, the
                            MLP and MLA's joint key/value latents (wkv_a, wkv_b), which feed values too.

Two options of the LRKV factors, for the question of what the recipe does to their heads:
  lrkv_factor_decay False   no weight decay on U_h or B_h, wherever the recipe would apply it (an
                            L2 penalty on both factors of U_h B_hᵀ acts on the product like a
                            nuclear-norm penalty, pulling each head toward the shared projection).
  lrkv_b_optimizer "muon"   (with optimizer "muon") B_h by Muon too, orthogonalised head by head
                            (`HeadwiseMuon`), at matrix_lr, decayed like U_h.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headlab.model.gpt import GPT, meta_model
from headlab.training.config import TrainConfig

ADAM_BETAS = (0.9, 0.95)
LRKV_FACTORS = (".u_k.weight", ".u_v.weight", ".b_k", ".b_v")
LRKV_B = (".b_k", ".b_v")
# the 2-D matrices that only form queries or keys: MHA/GQA/MQA and LRKV queries and keys (LRKV's
# shared key and U^K), MLA's queries (one matrix or the two of its query latent)
QK_MATRICES = (".attn.c_q.weight", ".attn.c_k.weight", ".attn.k_shared.weight", ".attn.u_k.weight",
               ".attn.wq.weight", ".attn.wq_a.weight", ".attn.wq_b.weight")
# The quintic Newton–Schulz coefficients of torch.optim.Muon (its defaults), so per-head Muon
# orthogonalises exactly as the 2-D Muon does.
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5
MUON_MOMENTUM = 0.95


def is_muon_matrix(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon (not AdamW) updates this parameter: the blocks' 2-D weights."""
    return name.startswith("blocks.") and parameter.dim() == 2


def is_qk_matrix(name: str) -> bool:
    """Whether a parameter is a matrix that only forms queries or keys (`QK_MATRICES`)."""
    return name.endswith(QK_MATRICES)


def is_lrkv_factor(name: str) -> bool:
    """Whether a parameter holds LRKV's per-head residual factors U_h or B_h."""
    return name.endswith(LRKV_FACTORS)


def orthogonalize(update: torch.Tensor, steps: int = NEWTON_SCHULZ_STEPS, eps: float = 1e-7,
                  coefficients: tuple[float, float, float] = NEWTON_SCHULZ) -> torch.Tensor:
    """Approximately U Vᵀ for each matrix G = U S Vᵀ in a batch (…, m, n), by the quintic
    Newton–Schulz iteration X ← a·X + (b·A + c·A²)·X with A = X Xᵀ, from X = G / ‖G‖_F (per matrix),
    iterated on the wide orientation in bfloat16 as torch.optim.Muon does; singular values end
    near 1 (roughly within 0.5 to 1.5), which is all Muon asks of it. In update's dtype."""
    return _orthogonalized([update.to(torch.bfloat16, copy=True)], update.dtype, steps, eps, coefficients)


def _orthogonalized(handed: list[torch.Tensor], dtype: torch.dtype, steps: int, eps: float,
                    coefficients: tuple[float, float, float]) -> torch.Tensor:
    """`orthogonalize` of the one bfloat16 tensor in `handed`, which it takes out and then
    overwrites: handed in a list, not as an argument, because whatever keeps a frame's arguments
    (a tracer, a frame evaluator) would keep the input alive beside the iteration. Its peak is then
    the input's 2 B per parameter plus, for square matrices, the Gram matrix, its square and the
    next iterate: 8 B, which is what the memory model plans."""
    a, b, c = coefficients
    x = handed.pop()
    shape, tall = x.shape, x.size(-2) > x.size(-1)
    x = x.reshape(-1, *shape[-2:])
    if tall:
        x = x.mT
    x.div_(x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # fused as torch's addmm
        del gram
    return (x.mT if tall else x).reshape(shape).to(dtype)


@torch.no_grad()
def muon_step(params: list[torch.Tensor], state, lr: float, weight_decay: float, momentum: float,
              nesterov: bool = True, steps: int = NEWTON_SCHULZ_STEPS, eps: float = 1e-7,
              coefficients: tuple[float, float, float] = NEWTON_SCHULZ) -> None:
    """torch.optim.Muon's update of every parameter with a gradient, batched by shape: per matrix
    (or per trailing m × n slice of a stacked tensor), buf ← μ·buf + (1 − μ)·g,
    u = g + μ·(buf − g) (Nesterov; else buf), p ← (1 − lr·wd)·p − lr·√max(1, m/n)·NS(u). The
    parameters of one shape are stacked and orthogonalised in one batched Newton–Schulz call,
    so a step launches a few dozen kernels per shape instead of per matrix (a paper block's
    matrices come in three or four shapes), one shape after the other: the temporaries of one
    shape's stack (8 B per parameter at their peak, `headlab.training.memory`) are gone before the
    next. `state` is the optimizer's per-parameter state. A sharded step
    (`headlab.training.sharding`) hides the gradients of the matrices other ranks step."""
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            by_shape.setdefault((p.shape, p.dtype, p.device), []).append(p)
    for (shape, _, _), same in by_shape.items():
        grads = [p.grad for p in same]
        for p in same:
            if "momentum_buffer" not in state[p]:  # made once, not a zero tensor per matrix and step
                state[p]["momentum_buffer"] = torch.zeros_like(p)
        buffers = [state[p]["momentum_buffer"] for p in same]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        # the fp32 stacks live only inside this expression, never in a local, so they are gone
        # before the iteration starts (`_orthogonalized`)
        handed = [(torch.stack(grads).lerp_(torch.stack(buffers), momentum) if nesterov
                   else torch.stack(buffers)).bfloat16()]
        update = _orthogonalized(handed, same[0].dtype, steps, eps, coefficients)
        torch._foreach_mul_(same, 1 - lr * weight_decay)
        torch._foreach_add_(same, update.unbind(0), alpha=-lr * math.sqrt(max(1.0, shape[-2] / shape[-1])))
        del update  # before the next shape's stacks


class Muon(torch.optim.Muon):
    """torch.optim.Muon (same options, state and saved form, so runs saved by it resume) with
    `muon_step`'s update batched by shape. Its learning-rate scale is the original √max(1, m/n) only."""

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
    per `cpu-small` step. Each group's `base_lr` is its configured rate, which the schedule scales.
    Under DDP the ranks share the step out (`headlab.training.sharding`)."""
    optimizers = _build_optimizers(model, config)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["base_lr"] = group["lr"]  # present from the start, so a saved state loads into a fresh optimizer
    return optimizers


@dataclass(frozen=True)
class ParamGroup:
    """One group of parameters in the recipe's plan: which optimizer trains them, at which learning
    rate and weight decay, and the TrainConfig fields those come from (None: no decay)."""

    optimizer: str  # ADAMW, MUON or HEADWISE_MUON
    names: tuple[str, ...]
    lr_setting: str
    lr: float
    decay_setting: str | None
    weight_decay: float


ADAMW, MUON, HEADWISE_MUON = "AdamW", "Muon", "per-head Muon"


def optimizer_plan(named: list[tuple[str, torch.Tensor]], config: TrainConfig) -> list[list[ParamGroup]]:
    """Which optimizer trains which parameter (module docstring): per optimizer, its groups in the
    order of its saved state, so a run saved by the same recipe resumes into the same groups. The one
    place the recipe is decided: `_build_optimizers` makes the optimizers from it, and
    `optimizer_table` shows it."""
    def group(optimizer, chosen, lr_setting, decay_setting):
        return ParamGroup(optimizer, tuple(n for n, _ in chosen), lr_setting, getattr(config, lr_setting),
                          decay_setting, getattr(config, decay_setting) if decay_setting else 0.0)

    # LRKV's factors form a group of their own only when they are treated differently, so a run
    # saved by the default recipe resumes into the same optimizer groups.
    separate = (lambda n: is_lrkv_factor(n)) if not config.lrkv_factor_decay else (lambda n: False)
    if config.optimizer == "adamw":
        groups = [group(ADAMW, [(n, p) for n, p in named if p.dim() >= 2 and not separate(n)], "lr", "weight_decay"),
                  group(ADAMW, [(n, p) for n, p in named if separate(n)], "lr", None),
                  group(ADAMW, [(n, p) for n, p in named if p.dim() < 2], "lr", None)]
        return [[g for g in groups if g.names]]
    factor_decay = "weight_decay" if config.lrkv_factor_decay else None
    by_adamw = (lambda n: is_qk_matrix(n)) if not config.muon_qk else (lambda n: False)
    muon = [(n, p) for n, p in named if is_muon_matrix(n, p) and not by_adamw(n)]
    muon_groups = [group(MUON, [(n, p) for n, p in muon if not separate(n)], "matrix_lr", "weight_decay"),
                   group(MUON, [(n, p) for n, p in muon if separate(n)], "matrix_lr", None)]
    qk = [(n, p) for n, p in named if is_muon_matrix(n, p) and by_adamw(n)]
    headwise = [(n, p) for n, p in named if n.endswith(LRKV_B)] if config.lrkv_b_optimizer == "muon" else []
    routed = {n for g in muon_groups for n in g.names} | {n for n, _ in headwise} | {n for n, _ in qk}
    other = [(n, p) for n, p in named if n not in routed and not n.startswith(("wte.", "lm_head."))]
    adam_groups = [
        group(ADAMW, [(n, p) for n, p in named if n.startswith("wte.")], "embedding_lr", None),
        group(ADAMW, [(n, p) for n, p in named if n.startswith("lm_head.")], "unembedding_lr", None),
        group(ADAMW, other, "lr", None),
        group(ADAMW, [(n, p) for n, p in qk if not separate(n)], "lr", "weight_decay"),
        group(ADAMW, [(n, p) for n, p in qk if separate(n)], "lr", None),
    ]
    # the QK groups only when filled, so a run saved by the default recipe resumes
    plan = [[g for g in muon_groups if g.names], adam_groups[:3] + [g for g in adam_groups[3:] if g.names]]
    return plan + ([[group(HEADWISE_MUON, headwise, "matrix_lr", factor_decay)]] if headwise else [])


def _build_optimizers(model: GPT, config: TrainConfig) -> list[torch.optim.Optimizer]:
    parameters = dict(model.named_parameters())
    optimizers = []
    for groups in optimizer_plan(list(parameters.items()), config):
        torch_groups = [{"params": [parameters[n] for n in g.names], "lr": g.lr, "weight_decay": g.weight_decay}
                        for g in groups]
        kind = groups[0].optimizer if groups else MUON  # Muon's groups may all be empty (no block matrices)
        if kind == ADAMW:
            optimizers.append(torch.optim.AdamW(torch_groups, lr=config.lr, betas=ADAM_BETAS, fused=True))
        elif kind == MUON:
            optimizers.append(Muon(torch_groups, lr=config.matrix_lr, weight_decay=config.weight_decay))
        else:
            optimizers.append(HeadwiseMuon(torch_groups, lr=config.matrix_lr))
    return optimizers


def optimizer_table(model_config, config: TrainConfig) -> list[dict]:
    """`optimizer_plan` of a model of `model_config`, one row per parameter: parameter, optimizer,
    lr_setting, lr, decay_setting, weight_decay. What trains each tensor, as the optimizers are
    made from it."""
    return [{"parameter": name, "optimizer": g.optimizer, "lr_setting": g.lr_setting, "lr": g.lr,
             "decay_setting": g.decay_setting, "weight_decay": g.weight_decay}
            for groups in optimizer_plan(meta_parameters(model_config), config) for g in groups for name in g.names]


def meta_parameters(model_config) -> list[tuple[str, torch.Tensor]]:
    """The named parameters of a GPT of `model_config` on the meta device (`meta_model`): names, shapes."""
    return list(meta_model(model_config).named_parameters())
