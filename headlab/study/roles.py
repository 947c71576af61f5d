"""The six comparison variants of the flagship figure, keyed by role."""

from __future__ import annotations

from headlab.model.config import PRESETS, ModelConfig, preset


def comparison_roles(name: str = "cpu-small") -> dict[str, ModelConfig]:
    """Role -> config of the six variants of the flagship figure, in its order. A role names what a
    variant stands for in the paper's tables, so a paper number is looked up by role, never by
    position: mha, lrkv-small, lrkv-large, mqa, mla, gqa. LRKV's two ranks are d_h/8 and d_h/2 (the
    paper's r=16 and r=64 at d_h=128)."""
    head_dim = preset(name).head_dim  # preset() refuses an unknown name, listing the allowed ones
    return {
        "mha": preset(name, "mha"),
        "lrkv-small": preset(name, "lrkv", kv_rank=max(1, head_dim // 8)),
        "lrkv-large": preset(name, "lrkv", kv_rank=head_dim // 2),
        "mqa": preset(name, "mqa"),
        "mla": preset(name, "mla"),
        "gqa": preset(name, "gqa"),
    }


def role_of(config: ModelConfig) -> str | None:
    """The role of `config` if it is one of a preset's comparison variants (any vocabulary: a study
    sets it by its tokenizer), else None: a model whose settings differ from every preset's variant
    stands for none of the paper's numbers."""
    for name in PRESETS:
        for role, variant in comparison_roles(name).items():
            if variant.replace(vocab_size=config.vocab_size) == config:
                return role
    return None


def comparison_variants(name: str = "cpu-small") -> list[ModelConfig]:
    """The configs of `comparison_roles`, in the flagship figure's order."""
    return list(comparison_roles(name).values())


def compared_roles(only: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """`only`, the roles a study or sweep that is compared trains (None: all six), refused unless
    it holds Standard MHA and at least one variant: every comparison is with MHA."""
    if only is not None and ("mha" not in only or len(set(only)) < 2):
        raise ValueError(f"only = {tuple(only)!r} is invalid: every comparison is with Standard MHA, so include 'mha' "
                         "and at least one variant to compare with it")
    return only
