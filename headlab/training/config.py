"""Training configuration: a validated dataclass and the training settings of each model preset."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from headlab.model.config import check_field_types, config_from_dict, invalid_field, recorded_fields

OPTIMIZERS = ("adamw", "muon")
LRKV_B_OPTIMIZERS = ("adamw", "muon")
DTYPES = ("float32", "bfloat16")
PARALLEL = ("ddp", "fsdp")
# The TrainConfig fields that take one of a few names, and those names
CHOICES = {"optimizer": OPTIMIZERS, "lrkv_b_optimizer": LRKV_B_OPTIMIZERS, "dtype": DTYPES, "parallel": PARALLEL}
# TrainConfig.compile besides a torch.compile backend, and what "auto" compiles with on a GPU
# (headlab.training.compiling)
AUTO_COMPILE, NO_COMPILE, GPU_BACKEND = "auto", "off", "inductor"
# TrainConfig fields a sweep's grid cannot set: its lengths axis sets the steps, its seeds axis the seed.
UNSWEPT_TRAIN_FIELDS = ("steps", "seed")


# TrainConfig.compile as runs saved it when it was a switch: True compiled on a GPU only, as "auto" does
LEGACY_COMPILE = {False: "off", True: "auto"}
# TrainConfig's fields in headlab's previous release (91a3e0b), which `TrainConfig.recorded` always
# names; compile was a switch there
RELEASED_TRAIN_FIELDS = ("steps", "batch_size", "optimizer", "lr", "matrix_lr", "embedding_lr", "unembedding_lr",
                         "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip", "eval_every", "eval_batches",
                         "checkpoint_every", "log_every", "dtype", "compile", "device", "seed", "parallel",
                         "grad_accum", "lrkv_factor_decay", "lrkv_b_optimizer", "snapshot_every")
MAX_STEPS = 10 ** 8  # optimizer steps: more is a mistake (the paper's runs take 50,000)


@dataclass(frozen=True)
class TrainConfig:
    """How to train. `batch_size` is the global batch in sequences: split across torchrun ranks,
    then into `grad_accum` micro-batches per rank, so every setting takes the same optimizer step.
    `parallel` is how several ranks hold the model: "ddp" a full replica each, "fsdp" parameters,
    gradients and optimizer state sharded per block (FSDP2). Neither changes what is trained, so a
    run may be resumed under another `parallel`, `grad_accum`, `compile`, `device` or number of
    processes (the run folder's starts.jsonl records what changed)."""

    steps: int = 350
    batch_size: int = 16
    optimizer: str = "adamw"
    lr: float = 3e-3  # AdamW: every parameter
    matrix_lr: float = 0.02  # Muon: 2-D weights inside the blocks
    embedding_lr: float = 0.2  # Muon split: AdamW on the embedding
    unembedding_lr: float = 0.004  # Muon split: AdamW on the output head
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 16
    checkpoint_every: int = 100  # steps (0: none by step count, only on time and at the end)
    # also a checkpoint once this many minutes of training have passed since the last one (0: off), so
    # the share of time spent checkpointing stays bounded whatever a step costs; looked at on the
    # logging steps (log_every), where rank 0's clock decides for every rank (headlab.runs.folder).
    # Neither cadence changes what is trained: a run may resume under another.
    checkpoint_minutes: float = 0.0
    log_every: int = 10
    dtype: str = "float32"
    # "auto": inductor on a GPU that can run it, else eager; "off"; or a torch.compile backend
    # (headlab.training.compiling)
    compile: str = "auto"
    device: str = "auto"
    seed: int = 0
    parallel: str = "ddp"
    grad_accum: int = 1
    # weight decay on LRKV's U_h, B_h where the recipe decays (headlab.training.optimizers)
    lrkv_factor_decay: bool = True
    lrkv_b_optimizer: str = "adamw"  # with optimizer "muon": "muon" orthogonalises each head's B_h too
    # with optimizer "muon": False leaves the query and key projections to AdamW (lr, weight decay),
    # Muon keeping the rest of the blocks' matrices (headlab.training.optimizers)
    muon_qk: bool = True
    # analysis snapshots every K steps and at 0, 1, 2, 4, … < K (headlab.runs.snapshots); 0: off
    snapshot_every: int = 0

    def __post_init__(self):
        check_field_types(self)
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "log_every", "grad_accum"):
            if getattr(self, name) < 1:
                raise invalid_field(name, getattr(self, name), "must be a positive integer", "TrainConfig")
        if self.steps > MAX_STEPS:
            raise invalid_field("steps", self.steps, f"must be at most {MAX_STEPS:,} (years of training at any size; "
                                "the schedule and the plan enumerate the steps)", "TrainConfig")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise invalid_field(name, getattr(self, name), f"allowed values are {', '.join(allowed)}",
                                    "TrainConfig")
        if self.lrkv_b_optimizer == "muon" and self.optimizer != "muon":
            raise invalid_field("lrkv_b_optimizer", self.lrkv_b_optimizer, "per-head Muon on B_h needs optimizer = "
                                "'muon' (under 'adamw' every parameter is AdamW's)", "TrainConfig")
        if not self.muon_qk and self.optimizer != "muon":
            raise invalid_field("muon_qk", self.muon_qk, "taking the query and key projections from Muon needs "
                                "optimizer = 'muon' (under 'adamw' every parameter is AdamW's)", "TrainConfig")
        if self.parallel == "fsdp" and self.optimizer == "muon":
            raise invalid_field("parallel", self.parallel, "Muon orthogonalizes whole matrices and FSDP hands it row "
                           "shards; use optimizer = 'adamw' with fsdp, or parallel = 'ddp' with muon", "TrainConfig")
        if self.batch_size % self.grad_accum:
            raise invalid_field("grad_accum", self.grad_accum, f"must divide batch_size = {self.batch_size}",
                                "TrainConfig")
        for name in ("lr", "matrix_lr", "embedding_lr", "unembedding_lr", "grad_clip"):
            if not getattr(self, name) > 0:
                raise invalid_field(name, getattr(self, name), "must be positive", "TrainConfig")
        if not 0 <= self.min_lr_ratio <= 1:
            raise invalid_field("min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]", "TrainConfig")
        for name in ("warmup_steps", "weight_decay", "snapshot_every", "checkpoint_every", "checkpoint_minutes"):
            if getattr(self, name) < 0:
                raise invalid_field(name, getattr(self, name), "must be >= 0", "TrainConfig")
        if not self.checkpoint_every and not self.checkpoint_minutes:
            raise invalid_field("checkpoint_every", 0, "with checkpoint_minutes = 0 too, the run would checkpoint "
                                "only at its end and a kill would lose all of it: set either", "TrainConfig")
        if not 0 <= self.seed < 2 ** 63:
            raise invalid_field("seed", self.seed, "must be in 0 .. 2**63 - 1", "TrainConfig")
        if self.compile not in (AUTO_COMPILE, NO_COMPILE):
            import torch  # only here: the command line builds its parser from these presets without torch

            backends = torch.compiler.list_backends(exclude_tags=())
            if self.compile not in backends:
                raise invalid_field("compile", self.compile, f"allowed values are auto, off or a torch.compile "
                                    f"backend ({', '.join(backends)})", "TrainConfig")
        if self.device != "auto":
            import torch  # only here: the command line builds its parser from these presets without torch

            try:
                device = torch.device(self.device)
            except RuntimeError:
                raise invalid_field("device", self.device, "allowed values are auto, cpu, cuda, cuda:<index> "
                               "or another torch device name", "TrainConfig") from None
            if device.type == "meta":
                raise invalid_field("device", self.device, "a meta tensor holds no data, so nothing trains on it; "
                                    "use auto, cpu, cuda or cuda:<index>", "TrainConfig")

    def replace(self, **changes) -> "TrainConfig":
        return config_from_dict(TrainConfig, {**asdict(self), **changes})

    def recorded(self) -> dict:
        """The fields as a run's config.json records them, so that headlab's previous release reads
        them: `RELEASED_TRAIN_FIELDS` (compile as that release's switch where it says the same:
        `LEGACY_COMPILE`), and any field added since only where it differs from its default."""
        values = recorded_fields(asdict(self), TrainConfig, RELEASED_TRAIN_FIELDS)
        legacy = {mode: switch for switch, mode in LEGACY_COMPILE.items()}
        return {**values, "compile": legacy.get(self.compile, self.compile)}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        if isinstance(data, dict) and isinstance(data.get("compile"), bool):  # saved when compile was a switch
            data = {**data, "compile": LEGACY_COMPILE[data["compile"]]}
        return config_from_dict(cls, data)


# Training settings that go with the model presets. The paper's (§3.2-3.3): context 2048,
# 32 sequences per step, warmup 2000, Muon for matrices (lr 0.02) + AdamW for the embedding
# (0.2) and head (0.004), wd 0.1, clip 1.0, bf16. The paper presets checkpoint by the clock only
# (PAPER_CHECKPOINT_MINUTES): a step count fits no GPU, since 1,000 steps of paper-128m take ~20 s
# on 8 x H200 (a checkpoint every 20 s: 8-15 % of the run) and hours on one small GPU.
PAPER_CHECKPOINT_MINUTES = 30.0
TRAIN_PRESETS: dict[str, TrainConfig] = {
    # tiny (the tests' and the notebooks' small mode) trains smoke tests, not results. It keeps AdamW,
    # the one optimizer FSDP takes, so the tests' FSDP runs train it with its own settings. It never
    # compiles: on a GPU (Colab's small mode) compiling a 40-step model costs more than its whole run.
    "tiny": TrainConfig(steps=40, batch_size=8, warmup_steps=5, eval_every=20, eval_batches=2,
                        checkpoint_every=20, log_every=5, compile="off"),
    # The CPU presets train the paper's way (Muon + AdamW split): under AdamW on everything the
    # validation loss is ~0.13 nats/byte worse and head diversity moves more with the optimizer than
    # with the architecture (science/scale_study.md, the recipe study). AdamW stays one
    # `optimizer="adamw"` away. The demo's 900 steps are long enough for its orderings to settle.
    "cpu-small": TrainConfig(steps=900, optimizer="muon"),
    # Muon everywhere but W_Q, W_K (AdamW there): the same loss, and QK forms that Muon has not flattened
    # (Standard MHA's first eigenvalue at L = 0: 2.6 against 1.2; science/regime_study.md)
    "cpu-small-adamw-qk": TrainConfig(steps=900, optimizer="muon", muon_qk=False),
    "cpu-deep": TrainConfig(steps=1000, optimizer="muon"),
    **{name: TrainConfig(steps=50_000, batch_size=32, optimizer="muon", warmup_steps=2000, weight_decay=0.1,
                         grad_clip=1.0, dtype="bfloat16", eval_every=1000, eval_batches=50, checkpoint_every=0,
                         checkpoint_minutes=PAPER_CHECKPOINT_MINUTES, log_every=50)
       for name in ("paper-128m", "paper-1.2b", "paper-2.5b", "paper-6.3b")},
}


def train_preset(name: str, **overrides) -> TrainConfig:
    if name not in TRAIN_PRESETS:
        raise ValueError(f"preset {name!r} is unknown: allowed presets are {', '.join(TRAIN_PRESETS)}")
    return TRAIN_PRESETS[name].replace(**overrides)
