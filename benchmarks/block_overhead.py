"""Overhead of headlab's transformer Block over a plain PyTorch block doing the same maths.

The plain block below is the ~40-line pre-norm block one would write by hand: RMSNorm, q/k/v/o
Linears without bias, half-split RoPE, parameter-free QK RMSNorm (when the config has qk_norm),
causal SDPA, relu² MLP with mlp_ratio x hidden. Weights are copied from the headlab block and
the script asserts that outputs (and input gradients) agree before timing anything.

Timed: forward + backward of one block on x (batch x seq_len x d_model), with x requiring grad
and a fixed upstream gradient, interleaved round-robin between the two blocks.

Target: time(headlab Block) / time(plain block) <= 1.05.

    python benchmarks/block_overhead.py [--quick] [--batch 16] [--seq-len 128]
"""

from __future__ import annotations

import time

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch
import torch.nn.functional as F
from torch import nn

from headlab.model.attention import rope_tables
from headlab.model.config import ModelConfig, preset
from headlab.model.gpt import Block

TARGET = 1.05
EPS = 1e-6


class PlainBlock(nn.Module):
    """Pre-norm MHA block written directly against torch."""

    def __init__(self, d: int, n_head: int, head_dim: int, qk_norm: bool, hidden: int):
        super().__init__()
        self.n_head, self.head_dim, self.qk_norm = n_head, head_dim, qk_norm
        self.norm1 = nn.RMSNorm(d, eps=EPS)
        self.wq = nn.Linear(d, n_head * head_dim, bias=False)
        self.wk = nn.Linear(d, n_head * head_dim, bias=False)
        self.wv = nn.Linear(d, n_head * head_dim, bias=False)
        self.wo = nn.Linear(n_head * head_dim, d, bias=False)
        self.norm2 = nn.RMSNorm(d, eps=EPS)
        self.fc = nn.Linear(d, hidden, bias=False)
        self.proj = nn.Linear(hidden, d, bias=False)

    @staticmethod
    def rope(x, cos, sin):  # x (B, H, T, D); cos/sin (T, D/2); pairs (i, i + D/2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        cos, sin = cos[:t], sin[:t]
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.proj(F.relu(self.fc(self.norm2(x))).square())


def plain_from(cfg: ModelConfig, block: Block) -> PlainBlock:
    """A PlainBlock with the headlab block's weights."""
    assert cfg.attention == "mha" and cfg.mlp == "relu2", "the plain block mirrors MHA + relu² only"
    plain = PlainBlock(cfg.d_model, cfg.n_head, cfg.head_dim, cfg.qk_norm, cfg.mlp_ratio * cfg.d_model)
    pairs = {
        "norm1.weight": "norm_attn.weight", "wq.weight": "attn.c_q.weight", "wk.weight": "attn.c_k.weight",
        "wv.weight": "attn.c_v.weight", "wo.weight": "attn.c_proj.weight", "norm2.weight": "norm_mlp.weight",
        "fc.weight": "mlp.c_fc.weight", "proj.weight": "mlp.c_proj.weight",
    }
    src = dict(block.named_parameters())
    assert set(src) == set(pairs.values()), f"headlab Block parameters changed: {sorted(src)}"
    plain.load_state_dict({mine: src[theirs].detach().clone() for mine, theirs in pairs.items()})
    return plain


def run(quick: bool = False, batch: int = 16, seq_len: int = 128, rounds: int | None = None,
        seed: int = 0, budget_s: float | None = None) -> common.Report:
    rounds = rounds or (5 if quick else 40)
    budget_s = budget_s if budget_s is not None else (10.0 if quick else 25.0)
    t_start = time.perf_counter()
    monitor = common.CpuMonitor()
    cfg = preset("cpu-small", "mha")
    seq_len = min(seq_len, cfg.seq_len)
    torch.manual_seed(seed)
    block = Block(cfg)
    with torch.no_grad():  # nn.RMSNorm starts at 1; perturb so the copy is really checked
        for p in block.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    plain = plain_from(cfg, block)
    cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_base)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, cfg.d_model, generator=gen)
    grad_out = torch.randn(batch, seq_len, cfg.d_model, generator=gen)

    # ---- same function? ----------------------------------------------------------------
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = block(xa, cos, sin), plain(xb, cos, sin)
    ya.backward(grad_out)
    yb.backward(grad_out)
    out_diff = (ya - yb).abs().max().item()
    grad_diff = (xa.grad - xb.grad).abs().max().item()
    wgrad_diff = max((block.get_parameter(n).grad - plain.get_parameter(m).grad).abs().max().item()
                     for m, n in (("wq.weight", "attn.c_q.weight"), ("fc.weight", "mlp.c_fc.weight")))
    assert out_diff < 1e-4 and grad_diff < 1e-4 and wgrad_diff < 1e-4, \
        f"blocks differ: output {out_diff:.2e}, input grad {grad_diff:.2e}, weight grad {wgrad_diff:.2e}"

    # ---- timing --------------------------------------------------------------------------
    def fwd_bwd(module):
        xin = x.clone().requires_grad_()

        def step():
            module.zero_grad(set_to_none=True)
            xin.grad = None
            module(xin, cos, sin).backward(grad_out)
        return step

    fns = {"headlab Block": fwd_bwd(block), "plain block": fwd_bwd(plain)}
    times = common.interleaved(fns, rounds=rounds, warmup=2 if quick else 5, budget_s=budget_s)
    done = len(times["plain block"])
    ratio = common.paired_ratio(times, "headlab Block", "plain block")
    ok = ratio <= TARGET
    rows = [
        ["plain block", common.median(times["plain block"]) * 1e3, common.spread(times["plain block"]),
         1.0, "", "(reference)"],
        ["headlab Block", common.median(times["headlab Block"]) * 1e3, common.spread(times["headlab Block"]),
         ratio, f"<= {TARGET:.2f}", common.verdict(ok)],
    ]
    header = common.machine_header(
        "Block overhead: headlab MHA Block vs a plain PyTorch block",
        {
            "config": f"preset('cpu-small', 'mha'): d_model {cfg.d_model}, {cfg.n_head} heads x {cfg.head_dim}, "
                      f"qk_norm {cfg.qk_norm}, mlp {cfg.mlp} x{cfg.mlp_ratio}",
            "timed": f"forward + backward of one block, x {batch} x {seq_len} x {cfg.d_model} with requires_grad",
            "same function": f"weights copied; max |out diff| = {out_diff:.2e}, max |dx diff| = {grad_diff:.2e}, "
                             f"max |dW diff| (wq, fc) = {wgrad_diff:.2e} (asserted < 1e-4)",
            "method": f"{done} interleaved rounds (max {rounds}, time budget {budget_s:.0f} s); ms = median; "
                      "ratio = median of same-round ratios",
            "target": f"headlab / plain <= {TARGET:.2f}",
        },
        monitor=monitor, quick=quick,
    )
    table = common.format_table(["block", "ms fwd+bwd", "IQR/med", "ratio vs plain", "target", "result"], rows)
    misses = [] if ok else [f"block_overhead: headlab/plain ratio {ratio:.3f} > {TARGET}"]
    text = f"{header}\n\n{table}\n\n({time.perf_counter() - t_start:.1f} s)"
    return common.Report("block_overhead", text, ok, misses)


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args(argv)
    common.setup(args)
    report = run(quick=args.quick, batch=args.batch, seq_len=args.seq_len, rounds=args.rounds, seed=args.seed,
                 budget_s=args.budget)
    print(report)
    return report


if __name__ == "__main__":
    main()
