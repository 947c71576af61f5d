"""A GPT-style decoder: pre-norm RMSNorm blocks, RoPE, an untied output head, and any of the
five attention families behind one interface (`forward(x, cos, sin, cache)`). `ModelConfig.arch`
picks headlab's or nanochat's norms and initialisation."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from headlab.model.attention import KVCache, LowRankKVAttention, build_attention, rope_tables
from headlab.model.config import DTYPE_BYTES, ModelConfig
from headlab.model.ops import RMSNorm, relu_squared

NORM_EPS = 1e-6
INIT_STD = 0.02
# the matrices that write into the residual stream: attention out, MLP down
OUTPUT_PROJECTIONS = ("attn.c_proj.weight", "attn.wo.weight", "mlp.c_proj.weight")


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """`model` in eval mode for the block, then back in the mode it was in (also on an error)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class MLP(nn.Module):
    """relu2: W2·relu(W1 x)² (nanochat); gelu: W2·gelu(W1 x); swiglu: W2·(silu(W1 x) ⊙ W3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.kind = config.mlp
        self.c_fc = nn.Linear(config.d_model, hidden, bias=False)
        if self.kind == "swiglu":
            self.c_gate = nn.Linear(config.d_model, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "relu2":
            h = relu_squared(h)
        elif self.kind == "gelu":
            h = F.gelu(h)
        else:
            h = F.silu(self.c_gate(x)) * h
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm_attn = RMSNorm(config.d_model, eps=NORM_EPS, gain=config.norm_gains)
        self.attn = build_attention(config)
        self.norm_mlp = RMSNorm(config.d_model, eps=NORM_EPS, gain=config.norm_gains)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.attn(self.norm_attn(x), cos, sin, cache)
        return x + self.mlp(self.norm_mlp(x))


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        # nanochat normalises the embedding before the first block; headlab passes it on as it is
        nanochat = config.arch == "nanochat"
        self.norm_wte = RMSNorm(config.d_model, eps=NORM_EPS, gain=False) if nanochat else nn.Identity()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = RMSNorm(config.d_model, eps=NORM_EPS, gain=config.norm_gains)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.seq_len, self.blocks[0].attn.rope_dim(), config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The initialisation of `ModelConfig.arch`:
          headlab   N(0, 0.02²) everywhere; the output projections scaled by 1/√(2·n_layer)
                    (GPT-2); norm gains at 1
          nanochat  the embedding N(0, 1); each other matrix N(0, `nanochat_std`²); the output
                    projections and the output head zero
        then LRKV residuals at `kv_residual_init`·‖W_shared‖_F (0.1 by default, paper §3).
        A model on the meta device (counted, or about to receive loaded weights) has no values to
        set, so it is left as it is (`build_on_meta`)."""
        if self.lm_head.weight.is_meta:
            return
        residual_std = INIT_STD / (2 * self.config.n_layer) ** 0.5
        nanochat = self.config.arch == "nanochat"
        for name, p in self.named_parameters():
            is_output = name.endswith(OUTPUT_PROJECTIONS)
            if p.dim() < 2:
                nn.init.ones_(p)
            elif not nanochat:
                nn.init.normal_(p, std=residual_std if is_output else INIT_STD)
            elif is_output or name == "lm_head.weight":
                nn.init.zeros_(p)
            else:  # LRKV's 3-D B tensors too, drawn again by init_residuals below
                nn.init.normal_(p, std=1.0 if name == "wte.weight" else nanochat_std(p))
        for block in self.blocks:
            if isinstance(block.attn, LowRankKVAttention):
                std = nanochat_std(block.attn.k_shared.weight) if nanochat else INIT_STD
                block.attn.init_residuals(std=std, ratio=block.attn.residual_init)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                loss_only: bool = False):
        """Logits (B, T, vocab) for tokens idx (B, T), and the mean cross-entropy if `targets`
        are given (-1 = ignored). With a cache, idx continues the cached sequence. `loss_only`
        (with targets): the loss alone, as the training step asks: logits returned from a compiled
        step are a graph output, for which AOT autograd materialises a zero gradient (a
        logits-sized tensor, 6.6 GB at paper-128m's micro-batch 32) in every backward.
        idx and targets may be on any device: they are moved to the model's (a study's run is read
        back onto the GPU it trained on, while prompts and token windows are built on the CPU)."""
        idx = idx.to(self.wte.weight.device)
        targets = None if targets is None else targets.to(idx.device)
        start = cache.pos if cache is not None else 0
        if start + idx.size(1) > self.config.seq_len:
            raise ValueError(
                f"sequence of {start + idx.size(1)} tokens exceeds ModelConfig.seq_len = {self.config.seq_len}")
        x = self.norm_wte(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = block(x, self.rope_cos, self.rope_sin, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.advance(idx.size(1))
        logits = self.lm_head(self.norm_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1)
        if loss_only:
            if loss is None:
                raise ValueError("loss_only needs targets")
            return loss
        return logits, loss

    def new_cache(self, batch_size: int, max_len: int | None = None, mla_absorb: bool = True,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty decode cache for up to `max_len` tokens (default: seq_len). For MLA,
        `mla_absorb` picks the latent cache (True) or the decompressed one (False)."""
        max_len = self.config.seq_len if max_len is None else min(max_len, self.config.seq_len)
        specs = [block.attn.cache_spec(mla_absorb) for block in self.blocks]
        param = self.lm_head.weight
        return KVCache(specs, batch_size, max_len, device=param.device, dtype=dtype or param.dtype)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, use_cache: bool = True, mla_absorb: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T). temperature 0 is greedy.

        With the cache, a prompt longer than seq_len is cropped to its last seq_len tokens;
        when the cache fills up it is rebuilt from the last seq_len/2 tokens.
        idx may be on any device; the result is on the model's.
        """
        idx = idx.to(self.lm_head.weight.device)
        seq_len = self.config.seq_len
        cache = None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(idx[:, -seq_len:])
            elif cache is None or cache.pos == cache.max_len:
                window = seq_len if cache is None else seq_len // 2
                context = idx[:, -window:]
                cache = self.new_cache(idx.size(0), context.size(1) + max_new_tokens, mla_absorb)
                logits, _ = self(context, cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            idx = torch.cat((idx, self._sample(logits[:, -1], temperature, top_k, generator)), dim=1)
        return idx

    @staticmethod
    def _sample(logits, temperature, top_k, generator) -> torch.Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -float("inf"))
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)

    def param_counts(self) -> dict[str, int]:
        """Parameters by part: embedding, attention, mlp, norms, head; their total; and
        non_embedding, the total without embedding and output head (the blocks' weights)."""
        counts = {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0, "head": 0}
        for name, p in self.named_parameters():
            part = ("embedding" if name.startswith("wte") else "head" if name.startswith("lm_head")
                    else "attention" if ".attn." in name
                    else "mlp" if ".mlp." in name else "norms")
            counts[part] += p.numel()
        counts["total"] = sum(counts.values())
        counts["non_embedding"] = counts["total"] - counts["embedding"] - counts["head"]
        return counts


def nanochat_std(weight: torch.Tensor) -> float:
    """nanochat's σ for a fan_out × fan_in weight (its last two dimensions):
    σ = min(1, √(fan_out/fan_in)) / √fan_in, which gives an N(0, σ²) matrix a spectral norm of
    order √(fan_out/fan_in), the spectral condition for feature learning of arXiv 2310.17813."""
    fan_out, fan_in = weight.shape[-2:]
    return min(1.0, (fan_out / fan_in) ** 0.5) / fan_in ** 0.5


def initial_model(config: ModelConfig, seed: int) -> GPT:
    """The step-0 weights of a run of `config` with `seed`, drawn on the CPU as training draws them
    (the global torch generator seeded with `seed`), so the random-initialisation baseline of a run
    is its own first draw, whether or not its folder kept a step-0 snapshot."""
    torch.manual_seed(seed)
    return GPT(config)


class _SkippingInitialisation(TorchFunctionMode):
    """Calls of torch.nn.init's functions return their tensor untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def build_on_meta(config: ModelConfig) -> GPT:
    """GPT(config) on the meta device: its parameters' names and shapes, no weights. Nothing is
    initialised (torch.nn.init is skipped: there are no values to set), so no op needs torch's
    Python meta kernels, whose first use in a process imports ~800 modules (1 CPU-s: a command
    line's or a notebook kernel's start)."""
    with torch.device("meta"), _SkippingInitialisation():
        return GPT(config)


def build_for_loading(config: ModelConfig) -> GPT:
    """GPT(config) with its parameters allocated but not drawn (torch.nn.init is skipped), for
    weights about to be loaded over every one of them: drawing paper-128m's weights costs a
    second that the load throws away, and leaves the global torch generator where it was. Its
    buffers (the RoPE tables) are computed as in GPT(config)."""
    with _SkippingInitialisation():
        return GPT(config)


@functools.lru_cache(maxsize=64)
def meta_model(config: ModelConfig) -> GPT:
    """`build_on_meta(config)`, built once per config and shared, so callers only read it:
    a study's tables read the heads of hundreds of snapshots of a few configs, plans ask often."""
    return build_on_meta(config)


def state_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of `GPT(config).state_dict()`."""
    return {name: tuple(t.shape) for name, t in meta_model(config).state_dict().items()}


def count_parameters(config: ModelConfig) -> dict[str, int]:
    """`GPT(config).param_counts()` with the model on the meta device: no weights are allocated,
    so even the 6.3B preset costs no memory."""
    return meta_model(config).param_counts()


def describe(config: ModelConfig, context: int, dtype: str = "bfloat16", batch_size: int = 1) -> dict:
    """Parameter counts (no weights allocated) and KV-cache sizes of `config`."""
    counts = count_parameters(config)
    per_token = config.kv_cache_values_per_token()
    return {
        "label": config.label,
        "attention": config.attention,
        "params": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "attention_params_per_layer": counts["attention"] // config.n_layer,
        "kv_values_per_token_per_layer": per_token,
        "kv_fraction_of_mha": config.kv_cache_fraction_of_mha(),
        "context": context,
        "batch_size": batch_size,
        "dtype": dtype,
        "kv_cache_bytes": config.kv_cache_bytes(context, DTYPE_BYTES[dtype], batch_size),
    }
