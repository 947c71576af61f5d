"""The regime study's grid (issue 36): the default point, every axis's points and the commands that
trained them, and the paper's setting on each numeric axis (`science/regime_study.py` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

PRESET = "cpu-small"
THROUGH_TRAINING = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)  # fractions of a run shown in the through-training table
DEFAULT_POINT = "optimizer/x1-optimizermuon"
# The seed figure (the paper's Fig. 11, 128M, uncentred), λ₁ at L = 0 / 6 / 11, read off the plot
SEED_FIGURE = {"MHA": (5.0, 2.5, 3.0), "MQA": (4.0, 2.0, 3.5)}
SEED_MHA_EARLY = SEED_FIGURE["MHA"][0]
ROLES = {"standard-mha": "MHA", "mqa": "MQA"}
# The paper's 128M setting on each numeric axis (research/paper.md §3): nanochat's 524,288 tokens a
# step, 100B tokens over ~128M parameters, d_h 128, d_model 768, context 2048.
# Tokens the paper's final W_Q, W_K average (`averaged_updates`): decay 0.1 at lr 0.02 keeps ≈ 2/(lr·wd) = 1,000
# equally weighted updates of 524,288 tokens (if nanochat's Muon decays; without decay, ~190k steps: more)
PAPER_AVERAGED_UPDATES = 2 / (0.02 * 0.1)
PAPER_TOKENS_AVERAGED = PAPER_AVERAGED_UPDATES * 524_288
# The paper's depth and panels (cpu-deep: 12 layers of 6 heads, d_h 16) with AdamW on W_Q, W_K
DEEP_POINT = "deep_muon_qk/x1-muon_qkFalse"
# {seeds}: the seeds that finished (a rerun with them reuses every run the table shows)
DEEP_COMMAND = ("nice -n 19 python -m headlab sweep --preset cpu-deep --only mha mqa --jobs 2 --seeds {seeds} "
                "--out ROOT/deep_muon_qk --set muon_qk=false")
ADAMW_POINT, ADAMW_QK_POINT = "optimizer/x1-optimizeradamw", "muon_qk/x1-muon_qkFalse-snapshot_every100"
PAPER = {"tokens_per_step": 524_288, "tokens_per_parameter": 100e9 / 128e6, "head_dim": 128, "d_model": 768,
         "seq_len": 2048}


@dataclass(frozen=True)
class Axis:
    """One difference from the paper: its points (folder under ROOT -> shown value; None: the
    default point), the quantity it is plotted against and the command that trains each point."""

    name: str
    x: str | None  # a column of the run table; None: categorical
    points: dict[str, str]
    commands: dict[str, str]  # the point (folder) a command trains -> the command
    note: str = ""
    default_value: str = field(default="")


SWEEP = "nice -n 19 python -m headlab sweep --preset cpu-small --only mha mqa --jobs 2 --seeds 3"
TRAIN = "nice -n 19 python science/regime_study.py train --only mha --jobs 2"
AXES = [
    Axis("optimizer", None, {"optimizer/x1-optimizeradamw": "AdamW everywhere", DEFAULT_POINT: "Muon split"},
         {"optimizer/x1-optimizeradamw": f"{SWEEP} --out ROOT/optimizer --set optimizer=adamw,muon"}),
    Axis("W_Q, W_K trained by", None, {DEFAULT_POINT: "Muon (default)",
                                       "muon_qk/x1-muon_qkFalse-snapshot_every100": "AdamW (Muon elsewhere)"},
         {"muon_qk/x1-muon_qkFalse-snapshot_every100":
          f"{SWEEP} --out ROOT/muon_qk --set muon_qk=false --set snapshot_every=100"},
         "Muon everywhere else (V, O, MLP); W_Q and W_K by AdamW at lr 3e-3 with weight decay 0.1"),
    Axis("batch at equal steps", "tokens_per_step", {"batch_equal_steps/x1-batch_size4": "4 x 64",
                                                     DEFAULT_POINT: "16 x 64",
                                                     "batch_equal_steps/x1-batch_size64": "64 x 64"},
         {"batch_equal_steps/x1-batch_size4": f"{TRAIN} --seeds 3 --out ROOT/batch_equal_steps --set batch_size=4",
          "batch_equal_steps/x1-batch_size64": f"{TRAIN} --seeds 2 --out ROOT/batch_equal_steps --set batch_size=64"}),
    Axis("batch at equal tokens", "tokens_per_step", {"batch_equal_tokens/x4-batch_size4": "4 x 64, 3600 steps",
                                                      DEFAULT_POINT: "16 x 64, 900 steps",
                                                      "batch_equal_tokens/x0.25-batch_size64": "64 x 64, 225 steps"},
         {"batch_equal_tokens/x0.25-batch_size64":
          f"{TRAIN} --seeds 3 --out ROOT/batch_equal_tokens --lengths 0.25 --set batch_size=64",
          "batch_equal_tokens/x4-batch_size4":
          f"{TRAIN} --seeds 2 --out ROOT/batch_equal_tokens --lengths 4 --set batch_size=4"}),
    Axis("training length", "tokens_per_parameter", {"length/x0.25": "225 steps", DEFAULT_POINT: "900 steps",
                                                     "length/x4": "3600 steps"},
         {"length/x0.25": f"{TRAIN} --seeds 3 --out ROOT/length --lengths 0.25",
          "length/x4": f"{TRAIN} --seeds 2 --out ROOT/length --lengths 4"},
         "Sized down: the 3,600-step point (x4) has 2 seeds, trained last once the machine was quiet"),
    Axis("weight decay", "decay_timescale", {"weight_decay/x1-weight_decay0": "0", DEFAULT_POINT: "0.1",
                                             "weight_decay/x1-weight_decay1": "1"},
         {"weight_decay/x1-weight_decay0": f"{TRAIN} --seeds 3 --out ROOT/weight_decay --set weight_decay=0",
          "weight_decay/x1-weight_decay1": f"{TRAIN} --seeds 3 --out ROOT/weight_decay --set weight_decay=1"},
         "decay timescale = weight decay x the sum over steps of Muon's lr: the e-folds by which decay alone "
         "would shrink a matrix over the run"),
    Axis("head width d_h", "head_dim", {"head_dim/x1-head_dim16": "16", DEFAULT_POINT: "32",
                                        "head_dim/x1-head_dim64": "64"},
         {"head_dim/x1-head_dim16": f"{TRAIN} --seeds 3 --out ROOT/head_dim --set head_dim=16",
          "head_dim/x1-head_dim64": f"{TRAIN} --seeds 3 --out ROOT/head_dim --set head_dim=64"}),
    Axis("width d_model", "d_model", {DEFAULT_POINT: "128", "d_model/x1-d_model192": "192 = H x d_h"},
         {"d_model/x1-d_model192": f"{TRAIN} --seeds 3 --out ROOT/d_model --set d_model=192"}),
    Axis("context", "seq_len", {"seq_len/x1-seq_len32": "32", DEFAULT_POINT: "64", "seq_len/x1-seq_len128": "128"},
         {"seq_len/x1-seq_len32": f"{TRAIN} --seeds 3 --out ROOT/seq_len --set seq_len=32",
          "seq_len/x1-seq_len128": f"{TRAIN} --seeds 3 --out ROOT/seq_len --set seq_len=128"}),
    Axis("vocabulary", None, {DEFAULT_POINT: "bytes (256)", "vocab/x1-bpe512": "BPE 512 (headlab's trainer)"},
         {"vocab/x1-bpe512": f"{TRAIN} --seeds 3 --out ROOT/vocab --tokenizer bpe:512"}),
    Axis("architecture", None, {DEFAULT_POINT: "headlab", "arch/x1-archnanochat": "nanochat"},
         {"arch/x1-archnanochat": f"{TRAIN} --seeds 3 --out ROOT/arch --set arch=nanochat"},
         "ModelConfig.arch: nanochat's parameter-free RMSNorms (one after the embedding too), its initialisation, "
         "output projections and head starting at zero"),
]


PROBED = {"through_default/x1-optimizermuon": "Muon (default)", "through_muon_qk/x1-muon_qkFalse": "AdamW on W_Q, W_K"}
PROBE = "nice -n 19 python science/regime_study.py through --only mha --seeds 3"
PROBE_COMMANDS = (f"{PROBE} --out ROOT/through_default --set optimizer=muon",
                  f"{PROBE} --out ROOT/through_muon_qk --set muon_qk=false")


def panels(n_layer: int) -> dict[str, int]:
    """The figure's early / middle / late layers (the paper's 0, 6, 11 of 12)."""
    return {"early": 0, "middle": n_layer // 2, "late": n_layer - 1}
