"""Model configuration: a validated dataclass, JSON round-trip, and named presets.

Every attention knob lives in the config at all times (a preset is valid for every family),
and `attention` picks which knobs are used:

    mha   n_head K/V heads                      cache 2·H·d_h          values / token / layer
    gqa   n_kv_head K/V heads, shared by groups  cache 2·g·d_h
    mqa   one K/V head                           cache 2·d_h
    lrkv  shared K/V + per-head rank-r residual  cache 2·(d_h + H·r)    (paper Eq. 8)
    mla   d_c latent + d_R shared RoPE key       cache d_c + d_R        (absorbed decode)
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, fields

from headlab.schema import FAMILIES

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per value: `kv_cache_bytes`'s unit

MLP_TYPES = ("relu2", "gelu", "swiglu")
# ModelConfig's fields in headlab's previous release (91a3e0b): a run's config.json names any field
# added since only away from its default (`ModelConfig.recorded`), so that release reads today's runs
RELEASED_FIELDS = ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "head_dim", "attention", "n_kv_head",
                   "kv_rank", "kv_latent_dim", "rope_head_dim", "q_latent_dim", "qk_norm", "rope_base",
                   "kv_residual_init", "mlp", "mlp_ratio")
ARCHS = ("headlab", "nanochat")  # `ModelConfig.arch`: whose norms and initialisation the model takes


def invalid_field(name: str, value, allowed: str, owner: str = "ModelConfig") -> ValueError:
    return ValueError(f"{owner}.{name} = {value!r} is invalid: {allowed}")


MAX_NUMBER = 2 ** 62  # larger sizes are mistakes, and overflow torch's int64 shapes


def check_field_types(config) -> None:
    """Every field holds its annotated type (an int is a float; a bool is not a number), and
    every float is finite: NaN or inf would only surface later as a NaN loss."""
    owner = type(config).__name__
    for f in fields(config):
        value = getattr(config, f.name)
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[f.type]
        if isinstance(value, bool) and f.type != "bool" or not isinstance(value, expected):
            raise invalid_field(f.name, value, f"expected a value of type {f.type}", owner)
        if f.type == "float" and not math.isfinite(value):
            raise invalid_field(f.name, value, "must be a finite number", owner)
        if isinstance(value, (int, float)) and abs(value) > MAX_NUMBER:
            raise invalid_field(f.name, value, f"too large (at most {MAX_NUMBER:.0e})", owner)


def recorded_fields(values: dict, config_class, always: tuple[str, ...]) -> dict:
    """`values` (a config's fields as a dict) without the fields outside `always` that hold their
    default: how a config is written where an older headlab must still read it (a field added
    since is named only where a run uses it), and how a settings key names one."""
    defaults = {f.name: f.default for f in fields(config_class)}
    return {name: value for name, value in values.items()
            if name in always or name not in defaults or value != defaults[name]}


def config_from_dict(cls, data):
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} must be given as a JSON object of fields, not a {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; allowed fields are {sorted(known)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-style decoder and its attention family.

    `head_dim` is independent of `d_model` (attention width is n_head·head_dim). For MLA,
    `head_dim` is the per-head no-RoPE query/key width and the value width, `rope_head_dim`
    (d_R) the decoupled RoPE width, `kv_latent_dim` (d_c) the shared latent and
    `q_latent_dim` (d_c') the optional query latent (0 = queries not compressed).

    `qk_norm` is a parameter-free RMSNorm of each head's query and key after RoPE. MLA cannot
    normalise its per-head key c·W^UK_h (absorbed decode never forms it), so there it
    normalises what absorption allows: each head's no-RoPE query, its RoPE query and the shared
    RoPE key (the latent has its own RMSNorm either way). DeepSeek's layout is qk_norm=False,
    and `preset()` keeps it for MLA: on cpu-small the partial norm trains worse (see
    science/mla_ablation.md).

    `arch` picks the norms and the initialisation around the attention (`headlab.model.gpt`):

      headlab   RMSNorms with a learnable gain (pre-norm, final norm, MLA's latent norms); the token
                embedding goes straight into the first block; every matrix N(0, 0.02²), the
                output projections (attention out, MLP down) N(0, 0.02²/(2·n_layer)) (GPT-2)
      nanochat  karpathy/nanochat's GPT, of which the paper's code is likely a fork: every RMSNorm
                parameter-free, one more right after the token embedding; the embedding N(0, 1),
                each other matrix N(0, σ²) with σ = min(1, √(fan_out/fan_in))/√fan_in
                (arXiv 2310.17813); the output projections and the output head exactly zero, so
                every block starts as the identity and the first step trains the head alone

    Both keep the embedding and the output head untied, as nanochat does. Not part of `arch`:
    nanochat's logit softcap 15·tanh(z/15), which shapes the loss rather than the heads' forms,
    and its float32-epsilon norms (headlab's ε = 1e-6 stays: both are far below mean(x²) ≈ 1).
    """

    vocab_size: int = 256
    seq_len: int = 128
    n_layer: int = 4
    n_head: int = 6
    d_model: int = 128
    head_dim: int = 32
    attention: str = "mha"
    n_kv_head: int = 3
    kv_rank: int = 8
    kv_latent_dim: int = 32
    rope_head_dim: int = 16
    q_latent_dim: int = 0
    qk_norm: bool = True
    rope_base: float = 10000.0
    kv_residual_init: float = 0.1  # LRKV: ‖U_h B_hᵀ‖_F / ‖W_shared‖_F at initialisation (0: B_h starts at 0)
    mlp: str = "relu2"
    mlp_ratio: int = 4
    arch: str = "headlab"

    def __post_init__(self):
        check_field_types(self)
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise invalid_field(name, getattr(self, name), "must be a positive integer")
        if self.attention not in FAMILIES:
            raise invalid_field("attention", self.attention, f"allowed values are {', '.join(FAMILIES)}")
        if self.arch not in ARCHS:
            raise invalid_field("arch", self.arch, f"allowed values are {', '.join(ARCHS)}")
        if self.mlp not in MLP_TYPES:
            raise invalid_field("mlp", self.mlp, f"allowed values are {', '.join(MLP_TYPES)}")
        if self.head_dim < 2 or self.head_dim % 2:
            raise invalid_field("head_dim", self.head_dim, "must be a positive even integer (RoPE rotates pairs)")
        if not (1 <= self.n_kv_head <= self.n_head) or self.n_head % self.n_kv_head:
            raise invalid_field(
                "n_kv_head", self.n_kv_head,
                f"must divide n_head = {self.n_head} (allowed: {_divisors(self.n_head)})",
            )
        if not 1 <= self.kv_rank <= self.head_dim:
            raise invalid_field("kv_rank", self.kv_rank, f"LRKV rank r must be in 1..head_dim = 1..{self.head_dim}")
        if self.kv_latent_dim < 1:
            raise invalid_field("kv_latent_dim", self.kv_latent_dim, "MLA latent d_c must be a positive integer")
        if self.rope_head_dim < 2 or self.rope_head_dim % 2:
            raise invalid_field("rope_head_dim", self.rope_head_dim,
                                "MLA RoPE width d_R must be a positive even integer")
        if self.q_latent_dim < 0:
            raise invalid_field("q_latent_dim", self.q_latent_dim, "must be 0 (no query compression) or positive")
        if self.kv_residual_init < 0:
            raise invalid_field("kv_residual_init", self.kv_residual_init,
                                "must be >= 0 (0: residuals start at zero; 1: as large as W_shared)")
        if self.rope_base <= 0:
            raise invalid_field("rope_base", self.rope_base, "must be positive")

    # ---- derived quantities -------------------------------------------------------------
    @property
    def norm_gains(self) -> bool:
        """Whether the model's RMSNorms have a learnable gain (`arch` headlab) or none (nanochat)."""
        return self.arch == "headlab"

    @property
    def kv_heads(self) -> int:
        """Number of distinct K/V heads for the MHA/GQA/MQA module."""
        return self.n_head if self.attention == "mha" else 1 if self.attention == "mqa" else self.n_kv_head

    @property
    def label(self) -> str:
        """Display name of this variant, e.g. 'LRKV (r=16)'."""
        return {
            "mha": "Standard MHA",
            "mqa": "MQA",
            "gqa": f"GQA ({self.n_kv_head} KV heads)",
            "mla": f"MLA (d_c={self.kv_latent_dim})",
            "lrkv": f"LRKV (r={self.kv_rank}"
                    f"{'' if self.kv_residual_init == 0.1 else f', init {self.kv_residual_init:g}'})",
        }[self.attention]

    @property
    def run_name(self) -> str:
        """This variant's name in paths (a study's run folders): 'standard-mha', 'lrkv-r16',
        'lrkv-r4-init-0-5', 'mqa', 'mla-d-c32', 'gqa-3-kv-heads'. Made from the fields that tell
        variants apart, never from `label`, so a renamed label keeps finished runs reused."""
        init = re.sub(r"[^a-z0-9]+", "-", f"-init-{self.kv_residual_init:g}") if self.kv_residual_init != 0.1 else ""
        return {
            "mha": "standard-mha",
            "mqa": "mqa",
            "gqa": f"gqa-{self.n_kv_head}-kv-heads",
            "mla": f"mla-d-c{self.kv_latent_dim}",
            "lrkv": f"lrkv-r{self.kv_rank}{init}",
        }[self.attention]

    @property
    def figure_order(self) -> tuple[int, int]:
        """Where this variant is drawn among others: its family's place in FAMILIES (the paper's
        figure order), then its family's knob ascending (LRKV's rank, MLA's d_c, GQA's KV heads)."""
        knob = {"lrkv": self.kv_rank, "mla": self.kv_latent_dim, "gqa": self.n_kv_head}.get(self.attention, 0)
        return FAMILIES.index(self.attention), knob

    def kv_cache_values_per_token(self, mla_absorb: bool = True) -> int:
        """Values cached per token per layer at decode time (the paper's Eq. 8 for LRKV).

        MLA's figure includes the decoupled RoPE key (d_c + d_R); the paper's tables count
        d_c alone. `mla_absorb=False` gives the naive MLA cache of decompressed keys/values.
        """
        h, dh = self.n_head, self.head_dim
        if self.attention in ("mha", "mqa", "gqa"):
            return 2 * self.kv_heads * dh
        if self.attention == "lrkv":
            return 2 * (dh + h * self.kv_rank)
        if mla_absorb:
            return self.kv_latent_dim + self.rope_head_dim
        return h * (dh + self.rope_head_dim) + h * dh

    def kv_cache_bytes(self, tokens: int, bytes_per_value: int, batch_size: int = 1, mla_absorb: bool = True) -> int:
        """Decode cache size: values/token/layer · n_layer · tokens · batch · bytes per value."""
        return self.kv_cache_values_per_token(mla_absorb) * self.n_layer * tokens * batch_size * bytes_per_value

    def kv_cache_fraction_of_mha(self) -> float:
        """Decode cache relative to MHA with the same heads: 2·H·d_h values per token per layer."""
        return self.kv_cache_values_per_token() / (2 * self.n_head * self.head_dim)

    def replace(self, **changes) -> "ModelConfig":
        return config_from_dict(ModelConfig, {**self.to_dict(), **changes})

    # ---- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def recorded(self) -> dict:
        """The fields as a run's config.json records them: `RELEASED_FIELDS`, and any other field
        that differs from its default (`recorded_fields`)."""
        return recorded_fields(self.to_dict(), ModelConfig, RELEASED_FIELDS)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        return config_from_dict(cls, data)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"a ModelConfig must be JSON: {error}") from error
        return cls.from_dict(data)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# Each preset is a base config holding every family's knobs; `preset()` picks the family.
# Paper presets follow Tables 5 and 7 of arXiv 2601.11471 (d_h = 128, context 2048, vocab
# 50304, FFN 4x). MLA's decoupled RoPE width is not given by the paper; d_R = d_h/2 follows
# DeepSeek-V2. The 2.5B model has 36 layers: Table 5 says 18, but the paper's own figures
# (layers 0..35), its 648 MB cache figure and the "2.5B" parameter count all need 36.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=256, seq_len=32, n_layer=2, n_head=4, d_model=32, head_dim=8,
        n_kv_head=2, kv_rank=3, kv_latent_dim=12, rope_head_dim=4,
    ),
    # 64-byte context: half the tokens of 128 and under half the step time, so `make demo`
    # trains three seeds of the six variants in its budget; losses stay under 2.0 nats/byte.
    "cpu-small": ModelConfig(seq_len=64),
    # cpu-small trained with AdamW on W_Q, W_K (TrainConfig.muon_qk False): the regime in which the weights view
    # has a dominant first eigenvalue, as the paper's Fig. 11 does (science/regime_study.md)
    "cpu-small-adamw-qk": ModelConfig(seq_len=64),
    # The paper's depth and head count on a CPU: 12 layers of 6 heads (d_h = 16, d_model 96), so the
    # flagship figure has the paper's panels L = 0, 6, 11; 3 seeds x 6 variants in about 30 minutes.
    "cpu-deep": ModelConfig(seq_len=64, n_layer=12, n_head=6, d_model=96, head_dim=16, rope_head_dim=8),
    "paper-128m": ModelConfig(
        vocab_size=50304, seq_len=2048, n_layer=12, n_head=6, d_model=768, head_dim=128,
        n_kv_head=3, kv_rank=46, kv_latent_dim=128, rope_head_dim=64,
    ),
    "paper-1.2b": ModelConfig(
        vocab_size=50304, seq_len=2048, n_layer=24, n_head=12, d_model=1536, head_dim=128,
        n_kv_head=4, kv_rank=51, kv_latent_dim=256, rope_head_dim=64,
    ),
    "paper-2.5b": ModelConfig(
        vocab_size=50304, seq_len=2048, n_layer=36, n_head=18, d_model=2304, head_dim=128,
        n_kv_head=6, kv_rank=55, kv_latent_dim=384, rope_head_dim=64,
    ),
    "paper-6.3b": ModelConfig(
        vocab_size=50304, seq_len=2048, n_layer=32, n_head=32, d_model=4096, head_dim=128,
        n_kv_head=2, kv_rank=54, kv_latent_dim=1024, rope_head_dim=64,
    ),
}


def preset(name: str, attention: str = "mha", **overrides) -> ModelConfig:
    """The named preset with `attention` as its family; MLA keeps DeepSeek's layout, QK-norm
    off (see qk_norm)."""
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is unknown: allowed presets are {', '.join(PRESETS)}")
    if attention == "mla":
        overrides.setdefault("qk_norm", False)
    return PRESETS[name].replace(attention=attention, **overrides)
