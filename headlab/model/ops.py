"""The elementwise glue of a block (RMSNorm, RoPE, relu²) with hand-written backward passes.

Autograd differentiates these formulas op by op, which costs a dozen memory-bound passes over
the activations per call; at `cpu-small` widths those passes take as long as the block's
matmuls. Each function here saves only what its gradient needs and computes it in two to four
passes:

    rms_norm        y = γ ⊙ x / rms(x),  rms(x) = √(mean(x²) + ε)
                    ∂x = (ĝ − x̂ · mean(ĝ ⊙ x̂)) / rms(x)   with x̂ = x / rms(x), ĝ = γ ⊙ g
                    ∂γ = Σ_rows g ⊙ x̂
    rotate_pairs    y = R(θ) x, the half-split RoPE rotation of pairs (x_i, x_{i+D/2})
                    ∂x = R(−θ) g                            a rotation's transpose is its inverse
    rotate_and_normalize
                    y = R(θ) x / rms(x)  (RoPE then QK-norm; rms(R x) = rms(x))
                    ∂x = R(−θ) (g − y · mean(g ⊙ y)) / rms(x)
    relu_squared    y = relu(x)²
                    ∂x = 2 · relu(x) ⊙ g

Statistics are taken in at least float32 (bf16 autocast); outputs keep the input dtype. The
backward passes are not themselves differentiable (no double backward). Where no gradient is
needed (decoding, evaluation) each function calls torch's fused kernels instead: same values,
fewer ops. `tests/model/test_ops.py` holds every value and gradient equal to autograd of the plain
formula, and both paths equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

# QK-norm's ε, float32's machine epsilon in every dtype: under bf16 autocast, bf16's own epsilon
# (2⁻⁷) would be a different normalisation from the one analysis assumes.
QK_NORM_EPS = torch.finfo(torch.float32).eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """γ ⊙ x / √(mean(x²) + ε) over the last dimension; `weight` None means γ = 1."""
    if _needs_grad(x, weight):
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, (x.size(-1),), None if weight is None else weight.to(x.dtype), eps)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(x₁ cos − x₂ sin, x₁ sin + x₂ cos) for the halves x₁, x₂ of x's last dimension; cos and
    sin broadcast against a half."""
    return _RotatePairs.apply(x, cos, sin) if _needs_grad(x) else _rotate(x, cos, sin)


def rotate_and_normalize(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(rotate_pairs(x, cos, sin), None, eps) in one pass forward and one backward."""
    if _needs_grad(x):
        return _RotateAndNormalize.apply(x, cos, sin, eps)
    return F.rms_norm(_rotate(x, cos, sin), (x.size(-1),), None, eps)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)² (the nanochat MLP activation)."""
    return _ReluSquared.apply(x) if _needs_grad(x) else torch.relu(x).square_()


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    # Without autograd (decoding, evaluation, analysis) torch's own kernels win: a custom
    # Function's bookkeeping costs more than it saves on one-token tensors.
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class RMSNorm(torch.nn.RMSNorm):
    """`torch.nn.RMSNorm(dim)` (same parameter, state-dict key and eps default) on `rms_norm`;
    it normalises the last dimension only. `gain` False: no parameter (γ = 1), as nanochat's norms."""

    def __init__(self, dim: int, eps: float | None = None, gain: bool = True):
        super().__init__(dim, eps=eps, elementwise_affine=gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, eps)


class _RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        wide = _as(x, _statistics_dtype(x))
        inv_rms = _inverse_rms(wide, eps)
        x_hat = _as(wide * inv_rms, x.dtype)
        ctx.save_for_backward(x_hat, weight, inv_rms)
        return x_hat if weight is None else x_hat * weight.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        saved_x_hat, weight, inv_rms = ctx.saved_tensors
        x_hat, grad = saved_x_hat.to(inv_rms.dtype), grad.to(inv_rms.dtype)
        grad_weight = None
        if weight is not None:
            if ctx.needs_input_grad[1]:
                grad_weight = (grad * x_hat).reshape(-1, x_hat.size(-1)).sum(0).to(weight.dtype)
            grad = grad * weight
        return _without_component_along(grad, x_hat).mul_(inv_rms).to(saved_x_hat.dtype), grad_weight, None


def _inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))


def _without_component_along(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """g − y · mean(g ⊙ y): times 1/rms, the gradient through y = u / rms(u) with respect to u."""
    return torch.addcmul(grad, y, (grad * y).mean(-1, keepdim=True), value=-1)


def _statistics_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)` without the op when x has that dtype already (the same tensor either way).
    torch 2.11's AOT autograd (torch.compile, aot_eager as inductor) gets a Function's gradient
    wrong when the tensor it saves and returns is an alias of an intermediate, as a no-op `.to` or
    an in-place op's result are: float32 training, or the fp32 residual stream under bf16 autocast
    (tests/model/test_ops.py; torch 2.13 is right)."""
    return x if x.dtype == dtype else x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((torch.addcmul(x1 * cos, x2, sin, value=-1), torch.addcmul(x2 * cos, x1, sin)), dim=-1)


class _RotatePairs(Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


class _RotateAndNormalize(Function):
    @staticmethod
    def forward(ctx, x, cos, sin, eps):
        wide = _as(x, _statistics_dtype(x))
        inv_rms = _inverse_rms(wide, eps)
        y = _as(_rotate(wide, cos, sin) * inv_rms, x.dtype)
        ctx.save_for_backward(y, inv_rms, cos, sin)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, inv_rms, cos, sin = ctx.saved_tensors
        grad_rotated = _without_component_along(grad.to(inv_rms.dtype), y.to(inv_rms.dtype))
        return _rotate(grad_rotated, cos, -sin).mul_(inv_rms).to(y.dtype), None, None, None


class _ReluSquared(Function):
    @staticmethod
    def forward(ctx, x):
        r = torch.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return torch.mul(grad, r).mul_(2)
