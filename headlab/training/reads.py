"""Which settings reach a run: a ModelConfig field its model reads as it is built
(`headlab.model.reads.fields_read`), and a TrainConfig field that changes what trains its tensors
(`headlab.training.optimizers.optimizer_plan`, the plan the optimizers are made from) or that
the training loop reads for every model. Derived from the code that trains, never from a list
kept beside it, so a setting's effect cannot drift from what a study says of it.

    train_setting_reaches("matrix_lr", preset("tiny", "mha"), train_preset("tiny"))   # False: under
                                                   # AdamW no tensor is Muon's
    model_setting_reaches("n_kv_head", preset("tiny", "mha"))                        # False
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import fields

from headlab.model.config import ModelConfig, preset
from headlab.model.reads import fields_read, recording
from headlab.training.config import CHOICES, LRKV_B_OPTIMIZERS, OPTIMIZERS, TrainConfig
from headlab.training.optimizers import meta_parameters, optimizer_plan, optimizer_table

TRAIN_FIELDS = frozenset(f.name for f in fields(TrainConfig))


@functools.cache
def optimizer_fields() -> frozenset[str]:
    """Every TrainConfig field `optimizer_plan` reads under some recipe: recorded while it plans a
    model that every branch of the plan routes parameters of (LRKV: factors, B tensors, query and
    key matrices), under every optimizer, lrkv_b_optimizer and both values of the plan's switches.
    The training loop reads every other field, for every model."""
    read: set[str] = set()
    named = meta_parameters(preset("tiny", "lrkv"))
    switches = [name for name in TRAIN_FIELDS if isinstance(getattr(TrainConfig(), name), bool)]
    for optimizer, b_optimizer, *values in itertools.product(OPTIMIZERS, LRKV_B_OPTIMIZERS,
                                                             *([True, False] for _ in switches)):
        try:
            config = TrainConfig(optimizer=optimizer, lrkv_b_optimizer=b_optimizer, **dict(zip(switches, values)))
        except ValueError:
            continue  # a recipe TrainConfig refuses (per-head Muon under AdamW)
        optimizer_plan(named, recording(config, read))
    return frozenset(read)


def other_values(name: str, value) -> list:
    """Values of TrainConfig field `name` other than `value` that show whether the field bears on a
    plan: the other switch, the other names (`CHOICES`), a number of another size."""
    if isinstance(value, bool):
        return [not value]
    if name in CHOICES:
        return [choice for choice in CHOICES[name] if choice != value]
    return [value * 2 + 1]


def train_setting_reaches(name: str, model_config: ModelConfig, config: TrainConfig) -> bool:
    """Whether TrainConfig field `name` bears on a run of `model_config` trained with `config`,
    whatever value it holds: the training loop reads every field but the optimizer plan's
    (`optimizer_fields`) for every model; a field of the plan reaches the run where another value
    of it would train its tensors otherwise (another optimizer, rate or decay:
    `optimizer_table`). One that no other valid value could change (muon_qk under AdamW) does not."""
    if name not in optimizer_fields():
        return True
    table = optimizer_table(model_config, config)
    for value in other_values(name, getattr(config, name)):
        try:
            other = config.replace(**{name: value})
        except ValueError:
            continue  # not a recipe beside the rest of `config`
        if optimizer_table(model_config, other) != table:
            return True
    return False


def train_change_reaches(name: str, model_config: ModelConfig, config: TrainConfig, before) -> bool:
    """Whether TrainConfig field `name`, changed from `before` to what `config` holds, changes a run
    of `model_config`: the loop reads it, or the optimizer plan differs with `before` in its place.
    A change the rest of `config` cannot do without (`before` is not valid beside it) counts."""
    if name not in optimizer_fields():
        return True
    try:
        earlier = config.replace(**{name: before})
    except ValueError:
        return True
    return optimizer_table(model_config, earlier) != optimizer_table(model_config, config)


def model_setting_reaches(name: str, model_config: ModelConfig) -> bool:
    """Whether ModelConfig field `name` bears on a model of `model_config`: its model reads it as
    it is built (`headlab.model.reads.fields_read`)."""
    return name in fields_read(model_config)
